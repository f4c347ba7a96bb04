"""`make print`: what an instructor prints the night before, each as a PDF of landscape A4 pages made by the
headless Chromium of course/browser.py from Markdown rendered with markdown-it (both in the learner's lock): the
run sheet (WORKSHOP.md) and the cheat sheet (docs/cheatsheet.md, with the course's 中英 glossary after it)."""

import re
import sys
import tempfile
from pathlib import Path

from course.browser import Browser, chromium
from helpers import glossary, paths

RUNSHEET = paths.ROOT / "WORKSHOP.md"
CHEATSHEET = paths.ROOT / "docs" / "cheatsheet.md"
PAGES = 2  # each sheet's most pages: what an instructor carries, and a learner keeps
# small print, as a printed timetable is: 8.5 pt text, tables across the page's width
CSS = """
@page { size: A4 landscape; margin: 9mm 10mm; }
body { font: 8.5pt/1.25 "DejaVu Sans", "WenQuanYi Micro Hei", Arial, sans-serif; margin: 0; }
h1 { font-size: 13pt; margin: 0 0 3px; } h2 { font-size: 10.5pt; margin: 6px 0 3px; }
p, ol, ul { margin: 3px 0; } ol { padding-left: 14px; } code, pre { font-size: 7.2pt; }
pre { margin: 3px 0; background: #f3f3f3; white-space: pre-wrap; }
div.columns { column-count: 2; column-gap: 6mm; } div.columns h1 { column-span: all; }
div.after { font-size: 7.5pt; } div.after h2 { margin-top: 4px; } div.after td:nth-child(even) { white-space: nowrap; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 0.5pt solid #888; padding: 1px 3px; vertical-align: top; text-align: left; }
tr, pre { break-inside: avoid; }
"""
GLOSSARY_COLUMNS = 5  # term pairs side by side, across the page after the cheat sheet's two columns


def glossary_markdown() -> str:
    """Every term of data/glossary.csv as one table, GLOSSARY_COLUMNS pairs of English and 中文 a row, each in
    English spelling and its accepted Chinese (the other spellings and the explanations in parentheses are left
    to the notebooks)."""
    terms = glossary.terms()
    rows = -(-len(terms) // GLOSSARY_COLUMNS)
    columns = [terms[i * rows : (i + 1) * rows] for i in range(GLOSSARY_COLUMNS)]
    lines = ["## 中英术语 Glossary", "", "| English | 中文 " * GLOSSARY_COLUMNS + "|", "|---|---" * GLOSSARY_COLUMNS + "|"]
    for i in range(rows):
        cells = [f"| {c[i].english_forms[0]} | {' / '.join(c[i].chinese_forms)} " if i < len(c) else "| | "
                 for c in columns]  # fmt: skip
        lines.append("".join(cells) + "|")
    return "\n".join(lines) + "\n"


# each sheet: its PDF's name, its Markdown, what is printed after it, and whether it runs in two columns
SHEETS = {"WORKSHOP.pdf": (RUNSHEET, lambda: "", False), "CHEATSHEET.pdf": (CHEATSHEET, glossary_markdown, True)}


def html(markdown: str, title: str, columns: bool = False, after: str = "") -> str:
    """The Markdown as one HTML page with the print style, in two columns if ``columns``; then ``after``
    (Markdown too) across the page."""
    from markdown_it import MarkdownIt

    render = MarkdownIt("commonmark").enable("table").render
    body = f'<div class="columns">{render(markdown)}</div>' if columns else render(markdown)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>{CSS}</style></head>'
            f'<body>{body}<div class="after">{render(after)}</div></body></html>')


def page_count(pdf: bytes) -> int:
    """The pages of a PDF Chromium wrote: its page objects (``/Type /Page``, not ``/Pages``)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))


def print_pdf(markdown: str, title: str, target: Path, columns: bool = False, after: str = "") -> int:
    """``markdown`` printed into ``target``; returns its number of pages."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="course-print-") as folder:
        page = Path(folder) / f"{title}.html"
        page.write_text(html(markdown, title, columns, after), encoding="utf-8")
        browser = Browser(local_only=True)
        try:
            browser.open(page.as_uri())
            target.write_bytes(browser.pdf())
        finally:
            browser.close()
    return page_count(target.read_bytes())


def print_sheet(name: str, folder: Path) -> int:
    """One of SHEETS printed into ``folder``; returns its number of pages."""
    source, after, columns = SHEETS[name]
    return print_pdf(source.read_text(encoding="utf-8"), source.stem, folder / name, columns, after())


def main() -> int:
    if chromium() is None:
        print("error: make print prints through a headless Chromium and none is installed; on Debian or Ubuntu: "
              "apt-get install -y chromium.", file=sys.stderr)  # fmt: skip
        return 2
    folder, status = paths.build_dir() / "print", 0
    for name in SHEETS:
        pages = print_sheet(name, folder)
        print(f"{paths.relative(folder / name)}: {pages} landscape A4 page(s)")
        if pages > PAGES:
            print(f"error: {name} takes {pages} pages; shorten {paths.relative(SHEETS[name][0])} to {PAGES}.",
                  file=sys.stderr)  # fmt: skip
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
