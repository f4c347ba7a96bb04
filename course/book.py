"""The course as a site (`make book`): the executed notebooks, English and Chinese, built with Sphinx and myst-nb.

Each language is staged into build/book/src/<language>/ (the syllabus, the notebooks as committed,
with their outputs, the run report they recorded, and the cheat sheet with the glossary) and built with book/conf.py into
build/book/html/<language>/; build/book/html/index.html sends a reader to one of the two.
"""

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from course import metrics, printable, translation
from course.runner import BUDGETS, NotebookRun, course_notebooks, title_of, write_report
from helpers import paths

CONF = paths.ROOT / "book"
# folder name of each edition, and the words its syllabus uses
LANGUAGES = {
    "en": {"folder": "en", "lesson": "lesson", "time": "measured", "budget": "budget", "report": "run report",
           "none": "not recorded"},
    "zh_CN": {"folder": "zh-CN", "lesson": "课程", "time": "实测时间", "budget": "预算", "report": "运行报告",
              "none": "未记录"},
}


def book_dir() -> Path:
    return paths.build_dir() / "book"


def source_of(notebook: Path, language: str) -> Path:
    """The committed notebook a page of ``language`` shows: the English one, or its Chinese edition."""
    return notebook if language == "en" else translation.edition_path(notebook)


def recorded_run(notebook: Path) -> NotebookRun:
    """What the committed notebook says about its last execution (``make refresh`` stores it)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    run_info = nb.get("metadata", {}).get("course_run", {})
    profile = run_info.get("profile", "cpu")
    return NotebookRun(
        name=notebook.stem,
        title=title_of(nb),
        status="passed" if run_info else "not recorded",
        seconds=float(run_info.get("seconds", 0.0)),
        peak_memory_mb=float(run_info.get("peak_memory_mb", 0.0)),
        metrics=metrics.collect(nb),
        budget_seconds=BUDGETS.get(notebook.name[:2], {}).get(profile),
    )


def syllabus(language: str) -> str:
    words = LANGUAGES[language]
    lines = [f"| # | {words['lesson']} | {words['time']} | {words['budget']} |", "|---|---|---|---|"]
    for notebook in course_notebooks():
        page = source_of(notebook, language)
        run = recorded_run(notebook)
        title = title_of(json.loads(page.read_text(encoding="utf-8"))).split("·", 1)[-1].strip()
        profile = json.loads(notebook.read_text(encoding="utf-8"))["metadata"].get("course_run", {}).get("profile")
        measured = f"{run.seconds:.0f} s ({profile})" if profile else words["none"]
        budget = f"{run.budget_seconds:.0f} s" if run.budget_seconds else "-"
        lines.append(f"| {notebook.name[:2]} | [{title}]({notebook.name}) | {measured} | {budget} |")
    return "\n".join(lines)


def stage(language: str) -> Path:
    """build/book/src/<language>/: the pages Sphinx builds for one edition."""
    source = book_dir() / "src" / language
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    notebooks = course_notebooks()
    for notebook in notebooks:
        page = source_of(notebook, language)
        if not page.exists():
            raise FileNotFoundError(f"{paths.relative(page)} is missing: run `make zh` first to build the Chinese edition.")
        nb = nbformat.read(page, as_version=4)
        nb.metadata.pop("language_edition", None)
        nb.metadata.pop("widgets", None)  # progress-bar state: the site would load a widget manager from a CDN
        for cell in nb.cells:
            if "solution" in cell.metadata.get("tags", []):  # shown collapsed, a click away, never open
                cell.metadata.tags = [*cell.metadata.tags, "hide-input"]
            # myst-nb does not show a markdown cell's attachments: each becomes a file beside it
            for name, data in cell.pop("attachments", {}).items():
                [(_, encoded)] = data.items()
                (source / f"{notebook.stem}-{name}").write_bytes(base64.b64decode(encoded))
                cell.source = cell.source.replace(f"(attachment:{name})", f"({notebook.stem}-{name})")
        nbformat.write(nb, source / notebook.name)
    runs = [recorded_run(notebook) for notebook in notebooks]
    context = {"profile": "cpu", "started": "as recorded with the notebooks (make refresh)",
               "total_seconds": sum(r.seconds for r in runs)}
    write_report(source, runs, context)
    (source / "report.json").unlink()
    if language != "en":
        text = (source / "report.md").read_text(encoding="utf-8")
        (source / "report.md").write_text(
            text.replace("# Run report", "# 运行报告（Run report）\n\n各 notebook 最近一次执行时记录的状态、时间与事实。", 1),
            encoding="utf-8")
    # the cheat sheet (make print's), with the glossary after it; in English in both editions, its glossary 中英
    sheet = printable.CHEATSHEET.read_text(encoding="utf-8") + "\n" + printable.glossary_markdown()
    if language != "en":
        sheet = sheet.replace("# Data-parallel training: the cheat sheet", "# 速查表（Cheat sheet，英文）", 1)
    (source / "cheatsheet.md").write_text(sheet, encoding="utf-8")
    toctree = "\n".join(["```{toctree}", ":hidden:", ":maxdepth: 1", ""]
                        + [nb.stem for nb in notebooks] + ["report", "cheatsheet", "```"])
    index = (CONF / f"index.{language}.md").read_text(encoding="utf-8")
    index = index.replace("{syllabus}", syllabus(language)).replace("{toctree}", toctree)
    index = index.replace("{report}", f"[{LANGUAGES[language]['report']}](report.md)")
    (source / "index.md").write_text(index, encoding="utf-8")
    return source


def build(languages=tuple(LANGUAGES)) -> Path:
    """Stage and build each edition; returns build/book/html/index.html."""
    html = book_dir() / "html"
    shutil.rmtree(html, ignore_errors=True)
    for language in languages:
        source = stage(language)
        folder = LANGUAGES[language]["folder"]
        # myst-nb writes beside Sphinx's output folder (jupyter_execute/), so build one level down, then copy
        built = book_dir() / "sphinx" / folder / "html"
        shutil.rmtree(built, ignore_errors=True)
        command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(CONF), "-D", f"language={language}",
                   "-d", str(book_dir() / "sphinx" / folder / "doctrees"), str(source), str(built)]  # fmt: skip
        print(f"book: building the {language} edition ...", flush=True)
        subprocess.run(command, check=True)
        shutil.rmtree(html / folder, ignore_errors=True)
        shutil.copytree(built, html / folder)
    (html / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>Data-parallel training · 数据并行训练</title>"
        "<script>location.replace((navigator.language || '').toLowerCase().startsWith('zh')"
        " ? 'zh-CN/index.html' : 'en/index.html')</script>"
        "<p><a href='en/index.html'>English</a> · <a href='zh-CN/index.html'>中文</a></p>",
        encoding="utf-8",
    )
    return html / "index.html"


if __name__ == "__main__":
    print(f"book: open {paths.relative(build())}")
