"""The Chinese edition: catalogs that cannot go stale silently, and notebooks/zh/ that equal their English source."""

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import nbformat
import polib
import pytest

from course import runner, translation
from helpers import glossary
from helpers.errors import CourseError

NOTEBOOKS = runner.course_notebooks()


def small_notebook(path, texts):
    nb = nbformat.v4.new_notebook()
    for i, text in enumerate(texts):
        cell = nbformat.v4.new_markdown_cell(text)
        cell.id = f"m{i}"
        nb.cells.append(cell)
        code = nbformat.v4.new_code_cell(f"x = {i}  # stays English")
        code.id = f"c{i}"
        code.metadata["tags"] = ["parameters"] if i == 0 else []
        code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{i}\n")]
        code.execution_count = i + 1
        nb.cells.append(code)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """translation's folders moved under tmp_path, so nothing committed is touched."""
    monkeypatch.setattr(translation, "CATALOGS", tmp_path / "locale")
    monkeypatch.setattr(translation, "EDITION", tmp_path / "zh")
    return tmp_path


def translate_all(notebook, texts):
    po = translation.load(notebook)
    for entry in po:
        entry.msgstr = texts[entry.msgctxt]
    po.save(str(translation.catalog_path(notebook)))


def test_a_new_catalog_lists_every_markdown_cell_untranslated(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title", "The gradient is averaged."])
    assert translation.update(nb) == {"new": 2, "changed": 0, "obsolete": 0}
    po = polib.pofile(str(translation.catalog_path(nb)))
    assert [(e.msgctxt, e.msgid, e.msgstr) for e in po] == [("m0", "# Title", ""), ("m1", "The gradient is averaged.", "")]
    found = translation.problems(nb)
    assert len(found) == 2 and all("no translation yet" in p and "01_x.ipynb, cell m" in p for p in found)
    with pytest.raises(CourseError, match="cannot be translated yet"):
        translation.build(nb)


def test_changed_english_makes_the_translation_fuzzy_and_names_the_cell(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title", "The gradient is averaged."])
    translation.update(nb)
    translate_all(nb, {"m0": "# 标题", "m1": "梯度被平均。"})
    assert translation.problems(nb) == []
    small_notebook(nb, ["# Title", "The gradient is summed."])
    (problem,) = translation.problems(nb)  # before `make zh` merges: the catalog is stale
    assert "cell m1" in problem and "not in the catalog" in problem
    assert translation.update(nb)["changed"] == 1
    entry = translation.load(nb).find("The gradient is summed.", msgctxt="m1")
    assert entry.fuzzy and entry.previous_msgid == "The gradient is averaged." and entry.msgstr == "梯度被平均。"
    (problem,) = translation.problems(nb)
    assert "cell m1" in problem and "fuzzy" in problem and "'The gradient is summed.'" in problem


def test_a_removed_cell_becomes_obsolete_and_is_reported(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title", "Two."])
    translation.update(nb)
    translate_all(nb, {"m0": "# 标题", "m1": "二。"})
    small_notebook(nb, ["# Title"])
    assert translation.update(nb)["obsolete"] == 1
    (problem,) = translation.problems(nb)
    assert "cell m1" in problem and "obsolete" in problem


def test_a_moved_cell_keeps_its_translation(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title", "Two."])
    translation.update(nb)
    translate_all(nb, {"m0": "# 标题", "m1": "二。"})
    small_notebook(nb, ["# Title", "One.", "Two."])  # "Two." is now cell m2
    translation.update(nb)
    po = translation.load(nb)
    assert po.find("Two.", msgctxt="m2").msgstr == "二。"
    assert [p for p in translation.problems(nb) if "m1" in p]  # the new "One." needs a translation


def test_build_replaces_markdown_only(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title `x`", "Text."])
    translation.update(nb)
    translate_all(nb, {"m0": "# 标题 `x`", "m1": "文字。"})
    built = nbformat.read(translation.build(nb), as_version=4)
    source = nbformat.read(nb, as_version=4)
    assert [c.source for c in built.cells if c.cell_type == "markdown"] == ["# 标题 `x`", "文字。"]
    assert [c for c in built.cells if c.cell_type == "code"] == [c for c in source.cells if c.cell_type == "code"]


@pytest.mark.parametrize(
    "english, chinese, said",
    [
        ("Run `torchrun` now.", "现在运行 torchrun。", "lost code '`torchrun`'"),
        ("See [the docs](https://x.org/a).", "见[文档](https://x.org/b)。", "lost link target"),
        ("## 1. Title\n\nText.", "1. 标题\n\n文字。", "lost heading level 2"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "| a | b |\n|---|---|", "lost table row"),
        ("- one\n- two", "- 一、二", "lost list item"),
        ("A $x^2$ term.", "一个 $x^3$ 项。", "lost math"),
    ],
)
def test_a_translation_must_keep_the_markdown_skeleton(english, chinese, said):
    assert said in translation.mismatch(english, chinese)


def test_the_skeleton_allows_reordering_and_translated_link_text():
    english = "Use `a` then `b`; see [the guide](x.md)."
    assert translation.mismatch(english, "先看[指南](x.md)，再用 `b` 之前的 `a`。") == ""


@pytest.mark.parametrize(
    "chinese, instead",
    [
        ("无需额外代价就省下，而不是白白省下", "无需额外代价"),
        ("DataParallel 为每块 GPU 开一个工作进程", "线程"),
        ("第 04 课的模拟线缆", "模拟链路"),
        ("写入一个替身", "替代实现"),
        ("十六条身份数据行", "自我认知样本"),
        ("各进程在这里汇合", "会合"),
        ("检查程序会尝试 k = 1 … 8", "检查器"),
        ("**没有虚假声明**", "无虚假身份"),
        ("BatchNorm 的滑动统计量", "运行统计量"),
        ("每块 GPU 的内存", "显存"),
        ("显卡内存不足", "显存"),
        ("停掉其他内核", "Jupyter 内核"),
        ("NCCL 的核函数", "CUDA 核函数"),
        ("原始资料这样说", "原教程"),
    ],
)
def test_a_known_wrong_form_is_named_with_what_to_write_instead(chinese, instead):
    (found,) = translation.wrong_forms(chinese)
    assert instead in found[1]


def test_right_forms_and_code_are_not_wrong_forms():
    right = ("检查器在本 Jupyter 内核中运行；操作系统内核的调度器；NCCL 的 CUDA 核函数；主机的内存，GPU 的显存；"
             "DataParallel 为每个设备开一个线程；各进程在 `MASTER_ADDR` 会合；`汇合` 在代码里不算。")  # fmt: skip
    assert translation.wrong_forms(right) == []


def test_a_wrong_form_stops_the_build_and_names_the_cell(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["# Title", "The checker tries n = 1 … 8."])
    translation.update(nb)
    translate_all(nb, {"m0": "# 标题", "m1": "检查程序会尝试 n = 1 … 8，也就是检查器。"})
    (problem,) = translation.problems(nb)
    assert "cell m1" in problem and "'检查程序'" in problem and "write 检查器" in problem
    with pytest.raises(CourseError, match="检查程序"):
        translation.build(nb)


@pytest.mark.parametrize(
    "chinese, breaks",
    [
        ("第一句话写到这里，\n第二句接着写。", 1),
        ("一段话。\n\n另一段话。", 0),  # a blank line: two paragraphs
        ("## 标题\n正文。", 0),
        ("- 列表项\n- 第二项", 0),
        ("| 列 | 列 |\n|---|---|\n| 中 | 文 |", 0),
        ("```\n# 注释\n中文\n```", 0),
        ("$$\n中\n文\n$$", 0),
        ("Run `x`\nthen `y`.", 0),  # English prose may wrap
        ("用 `torchrun`\n启动。", 0),  # a break after code is not between two CJK characters
    ],
)
def test_a_soft_line_break_inside_a_chinese_paragraph_is_found(chinese, breaks):
    assert len(translation.soft_breaks(chinese)) == breaks


def test_a_soft_line_break_stops_the_build(sandbox):
    nb = small_notebook(sandbox / "01_x.ipynb", ["The gradient is averaged over\nthe workers."])
    translation.update(nb)
    translate_all(nb, {"m0": "梯度在各工作进程\n之间取平均。"})
    (problem,) = translation.problems(nb)
    assert "cell m0" in problem and "line break inside a Chinese paragraph" in problem


def test_glossary_terms_are_checked_outside_code():
    (term,) = [t for t in glossary.terms() if t.english == "all-reduce"]
    assert term in glossary.missing("The all-reduces overlap.", "它们在重叠。")
    assert term not in glossary.missing("The all-reduce overlaps.", "全规约与计算重叠。")
    assert term in glossary.missing("The All-Reduce overlaps.", "All-Reduce 与计算重叠。")  # one form: 全规约
    assert term not in glossary.missing("Call `all-reduce` here.", "在这里调用 `all-reduce`。")
    assert term not in glossary.missing("A reduce-scatter.", "规约散射。")  # a longer term is not this one
    rank = [t for t in glossary.terms() if t.english == "rank"]
    assert rank[0] in glossary.missing("Each rank prints.", "每个进程都打印。")


ROOT = translation.paths.ROOT
CHINESE_PAGES = [ROOT / "README.zh-CN.md", *sorted((ROOT / "docs").glob("*.zh-CN.md"))]


def chinese_documents() -> list[tuple[str, dict[str, str]]]:
    """(name, its Chinese markdown by cell id, in order) of every zh notebook (from its catalog), README.zh-CN.md
    and each docs/*.zh-CN.md page (one cell, the page)."""
    documents = []
    for notebook in NOTEBOOKS:
        translations = {e.msgctxt: e.msgstr for e in translation.load(notebook) if not e.obsolete}
        cells = {cell_id: translations.get(cell_id, "") for cell_id, _ in translation.markdown_cells(notebook)}
        documents.append((f"notebooks/zh/{notebook.name}", cells))
    documents += [(str(page.relative_to(ROOT)), {"page": page.read_text(encoding="utf-8")}) for page in CHINESE_PAGES]
    return documents


def test_each_term_has_one_chinese_form():
    """data/glossary.csv names one Chinese form per term; a part in parentheses only explains it."""
    for term in glossary.terms():
        assert len(term.chinese_forms) == 1, f"{term.english}: {term.chinese!r} gives {term.chinese_forms}; choose one"


@pytest.mark.parametrize(
    "cells, found",
    [
        (["All-Reduce 与计算重叠。"], [(0, "All-Reduce", "全规约")]),  # the planted second form
        (["全规约（all-reduce）与计算重叠；之后只写全规约。"], []),  # the gloss at the first mention
        (["全规约与计算重叠。", "再做一次全规约（all-reduce）。"], [(1, "全规约（all-reduce）", "the gloss only at the first mention")]),
        (["all-reduce（全规约）与计算重叠。"], [(0, "all-reduce", "全规约")]),  # the gloss is 中文（English）
        (["每个进程编号都打印。"], [(0, "进程编号", "rank")]),  # a listed other form
        (["通信桶与全局批大小。"], [(0, "通信桶", "桶"), (0, "全局批大小", "全局批次")]),
        (["分布式数据并行（DDP）；之后只写 DDP。"], []),  # a term kept in English, glossed with its Chinese name
        (["DDP（分布式数据并行）"], [(0, "分布式数据并行", "DDP")]),
        (["环形全规约（ring all-reduce）由规约散射（reduce-scatter）和全收集组成。"], []),  # a longer term is its own
        (["在代码里 `All-Reduce` 不算，「not a finding」是打印出的原话。"], []),  # code and quotations
        (["| all-reduce | 全规约 |\n|---|---|"], []),  # a table's English column
        (["## 5. 全规约\n\n全规约（all-reduce）与反向传播重叠。"], []),  # a heading is no first mention
    ],
)
def test_a_second_form_of_a_term_is_found_outside_its_first_mention_gloss(cells, found):
    assert translation.second_forms(cells) == found


@pytest.mark.parametrize("name, cells", chinese_documents(), ids=[name for name, _ in chinese_documents()])
def test_the_chinese_edition_writes_one_form_per_term(name, cells):
    """Each zh notebook, README.zh-CN.md and docs/*.zh-CN.md use each term's one Chinese form (data/glossary.csv); its
    English or another form (translation.OTHER_FORMS) only in one gloss 中文（English） at the term's first mention."""
    ids = list(cells)
    found = [f"{ids[i]}: writes {what!r}; write {instead}" for i, what, instead in translation.second_forms(list(cells.values()))]
    assert not found, f"{name}: " + "\n".join(found)


CJK_CHARACTER = f"[{translation.IDEOGRAPHS}]"


def typography_problems(markdown: str) -> list[str]:
    """What Chinese ``markdown``'s prose writes against the edition's typography: a half-width quote pair around
    Chinese or a curly quote (the edition quotes with 「」), a space before % (100%, as 5%), and seconds as " s"
    (秒 in Chinese prose); code, link targets and math are left alone."""
    text = glossary.prose(markdown)
    found = [f"quote {m.group(0)!r}: write 「」" for m in re.finditer(r'"[^"\n]*"', text) if re.search(CJK_CHARACTER, m.group(0))]
    found += [f"curly quote in {text[max(m.start() - 10, 0):m.end() + 10]!r}: write 「」" for m in re.finditer("[“”‘’]", text)]
    found += [f"{m.group(0)!r}: no space before %" for m in re.finditer(r"\d+(?:\.\d+)? %", text)]
    found += [f"{m.group(0)!r}: write 秒" for m in re.finditer(r"\d+(?:\.\d+)? s(?![A-Za-z])", text)]
    return found


@pytest.mark.parametrize(
    "chinese, problems",
    [
        ('他说"把这个张量加起来"。', 1),  # a half-width quote pair around Chinese
        ("他说“把这个张量加起来”。", 2),  # curly quotes
        ("他说「把这个张量加起来」，运行 `print(\"你好\")`。", 0),
        ("理想值是 100 %，预热占 5%。", 1),  # mixed percent spacing
        ("理想值是 100%，预热占 5%；`x = 5 %`。", 0),
        ("每个请求上限 5 s。", 1),
        ("每个请求上限 5 秒；`sleep 5 s`，5 steps。", 0),
    ],
)
def test_the_typography_check_sees_a_planted_mistake(chinese, problems):
    assert len(typography_problems(chinese)) == problems


@pytest.mark.parametrize("name, cells", chinese_documents(), ids=[name for name, _ in chinese_documents()])
def test_the_chinese_edition_quotes_with_corner_brackets_and_writes_percent_and_seconds_one_way(name, cells):
    found = [f"{cell_id}: {problem}" for cell_id, cell in cells.items() for problem in typography_problems(cell)]
    assert not found, f"{name}: " + "\n".join(found)


def test_the_glossary_is_well_formed_and_each_notebook_shows_its_terms():
    terms = glossary.terms()
    assert len({t.english for t in terms}) == len(terms), "one row per English term"
    numbers = {nb.name[:2] for nb in NOTEBOOKS}
    for term in terms:
        assert term.english_forms and term.chinese_forms, term
        assert set(term.notebooks) <= numbers, term
    for notebook in NOTEBOOKS:
        nb = json.loads(notebook.read_text(encoding="utf-8"))
        cells = [c for c in nb["cells"] if c["cell_type"] == "code" and f'glossary.show("{notebook.name[:2]}")'
                 in "".join(c["source"])]  # fmt: skip
        assert len(cells) == 1, f"{notebook.name} shows its glossary with glossary.show"
        shown = "".join(cells[0]["outputs"][0]["data"]["text/markdown"])
        assert shown == glossary.table(notebook.name[:2]), f"{notebook.name}: its glossary output is stale"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem[:2] for nb in NOTEBOOKS])
def test_every_markdown_cell_is_translated_and_current(notebook):
    """Fails on a missing, fuzzy or obsolete translation, on lost code or links, and on a glossary term
    translated some other way; each problem names the notebook and the cell."""
    found = translation.problems(notebook)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem[:2] for nb in NOTEBOOKS])
def test_the_chinese_notebook_is_built_from_the_current_english_one(notebook):
    """Same code cells, tags, parameters and outputs as the English notebook, so it needs no second
    execution; its markdown is exactly the catalog's (`make zh` was run after the last change)."""
    edition = translation.edition_path(notebook)
    assert edition.exists(), f"{edition.name}: run `make zh`"
    zh, en = nbformat.read(edition, as_version=4), nbformat.read(notebook, as_version=4)
    assert [c.cell_type for c in zh.cells] == [c.cell_type for c in en.cells]
    for z, e in zip(zh.cells, en.cells, strict=True):
        assert z.id == e.id
        assert z.metadata == e.metadata, f"{edition.name}, cell {z.id}: tags or metadata differ"
        if e.cell_type == "code":
            assert z.source == e.source and z.outputs == e.outputs, f"{edition.name}, cell {z.id} differs; run `make zh`"
    assert zh == translation.translated(notebook), f"{edition.name} is older than its catalog; run `make zh`"


def test_make_zh_leaves_a_translated_tree_unchanged(tmp_path, monkeypatch):
    """`make zh` on a clean checkout rewrites nothing: the catalogs and notebooks/zh/ are its fixed point."""
    for name in ("locale", "zh"):
        src = translation.CATALOGS if name == "locale" else translation.EDITION
        shutil.copytree(src, tmp_path / name)
    monkeypatch.setattr(translation, "CATALOGS", tmp_path / "locale")
    monkeypatch.setattr(translation, "EDITION", tmp_path / "zh")
    assert translation.main([]) == 0
    for notebook in NOTEBOOKS:
        assert translation.catalog_path(notebook).read_bytes() == (
            translation.paths.ROOT / "locale" / "zh_CN" / "LC_MESSAGES" / f"{notebook.stem}.po").read_bytes()
        assert translation.edition_path(notebook).read_bytes() == (
            translation.paths.NOTEBOOKS / "zh" / notebook.name).read_bytes()


def test_a_chinese_label_without_a_cjk_font_fails_the_notebook_run():
    """Plot text stays English: the notebooks stage runs with PYTHONWARNINGS=error:Glyph:UserWarning
    (Makefile), so a figure labelled in Chinese on a machine without a CJK font fails its cell."""
    import os
    import subprocess
    import sys

    draw = ("import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; import io\n"
            "fig, ax = plt.subplots(); ax.set_title('数据并行'); fig.savefig(io.BytesIO())")  # fmt: skip
    makefile = (translation.paths.ROOT / "Makefile").read_text()
    setting = next(w.split("=", 1)[1] for w in makefile.split() if w.startswith("PYTHONWARNINGS="))
    plain = subprocess.run([sys.executable, "-c", draw], capture_output=True, text=True)
    guarded = subprocess.run([sys.executable, "-c", draw], capture_output=True, text=True,
                             env={**os.environ, "PYTHONWARNINGS": setting})  # fmt: skip
    assert plain.returncode == 0
    if "missing from font" in plain.stderr:  # no CJK font here: the guard must turn the warning into a failure
        assert guarded.returncode != 0 and "Glyph" in guarded.stderr
    else:  # a CJK font is installed: Chinese labels would render, and the guard lets them
        assert guarded.returncode == 0


def test_both_readmes_link_to_files_that_exist_and_the_chinese_one_to_every_chinese_notebook():
    import re

    root = translation.paths.ROOT
    docs = [f"docs/{page.name}" for page in sorted((root / "docs").glob("*.md"))]
    for name in ["README.md", "README.zh-CN.md", "WORKSHOP.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "data/README.md", *docs]:  # the docs pages too, each link relative to its page
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (root / name).read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")):
                where = (root / name).parent / target
                assert where.exists(), f"{name} links to {target}, which does not exist"
    chinese = (root / "README.zh-CN.md").read_text(encoding="utf-8")
    for notebook in NOTEBOOKS:
        assert f"](notebooks/zh/{notebook.name})" in chinese, notebook.name


def _punctuation(ch: str) -> bool:
    import unicodedata

    return unicodedata.category(ch)[0] in "PS"


def test_every_bold_phrase_renders_in_both_editions():
    """CommonMark opens ** only before a non-space that is not punctuation, or after space or punctuation,
    and closes it likewise: 「**全收集（all-gather）**均值」 stays literal asterisks, since the closing ** follows
    a full-width bracket and precedes a letter."""
    import re

    for notebook in NOTEBOOKS:
        for path in (notebook, translation.edition_path(notebook)):
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                text = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
                for m in re.finditer(r"\*\*(.+?)\*\*", text):
                    inner, before = m.group(1), text[m.start() - 1] if m.start() else " "
                    after = text[m.end()] if m.end() < len(text) else " "
                    opens = not inner[0].isspace() and (not _punctuation(inner[0]) or before.isspace() or _punctuation(before))
                    closes = not inner[-1].isspace() and (not _punctuation(inner[-1]) or after.isspace() or _punctuation(after))
                    assert opens and closes, f"{path.name} {cell.get('id')}: {m.group(0)!r} does not render bold"


def _fenced_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```.*?^```", markdown, flags=re.S | re.M)


def _heading_levels(markdown: str) -> Counter:
    outside = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return Counter(len(m.group(1)) for m in re.finditer(r"^(#+) ", outside, flags=re.M))


def _chinese_counterpart(target: str, page: Path) -> str:
    """The link target a Chinese page uses for ``target`` of the English ``page``: README.md -> README.zh-CN.md,
    x.md -> x.zh-CN.md and notebooks/NN.ipynb -> notebooks/zh/NN.ipynb, where that file exists; else ``target``."""
    path, anchor = (target.split("#", 1) + [""])[:2]
    if path.startswith(("http://", "https://")) or not path:
        return target
    where = Path(path)
    if where.suffix == ".md":
        other = where.with_name(f"{where.stem}.zh-CN.md")
    elif where.suffix == ".ipynb" and where.parent.name == "notebooks":
        other = where.parent / "zh" / where.name
    else:
        return target
    if not (page.parent / other).exists():
        return target
    return str(other) + (f"#{anchor}" if anchor else "")


GPU_PAGE = translation.paths.ROOT / "docs" / "gpu.md"
GPU_PAGE_ZH = translation.paths.ROOT / "docs" / "gpu.zh-CN.md"
SWITCH_EN, SWITCH_ZH = "English · [中文](gpu.zh-CN.md)\n\n", "[English](gpu.md) · 中文\n\n"


def gpu_page_problems(english: str, chinese: str) -> list[str]:
    """What docs/gpu.zh-CN.md (``chinese``) fails to keep of docs/gpu.md (``english``), one sentence each."""
    found = []
    if SWITCH_EN not in english or SWITCH_ZH not in chinese:
        found.append("each page links the other near its top: 'English · [中文](gpu.zh-CN.md)' and '[English](gpu.md) · 中文'")
    english, chinese = english.replace(SWITCH_EN, "", 1), chinese.replace(SWITCH_ZH, "", 1)
    en_blocks, zh_blocks = _fenced_blocks(english), _fenced_blocks(chinese)
    if en_blocks != zh_blocks:
        found.append(f"fenced code differs: {len(en_blocks)} block(s) in English, {len(zh_blocks)} in Chinese, "
                     f"first differing: {next((e for e, z in zip(en_blocks, zh_blocks, strict=False) if e != z), None)!r}")
    if _heading_levels(english) != _heading_levels(chinese):
        found.append(f"headings per level: English {dict(_heading_levels(english))}, Chinese {dict(_heading_levels(chinese))}")
    en_prose, zh_prose = (re.sub(r"```.*?```", " ", text, flags=re.S) for text in (english, chinese))
    targets = re.findall(r"\]\(([^)]+)\)", en_prose)
    expected = [_chinese_counterpart(target, GPU_PAGE) for target in targets]
    zh_targets = re.findall(r"\]\(([^)]+)\)", zh_prose)
    if expected != zh_targets:
        found.append(f"link targets: {zh_targets}, where the English's with their Chinese counterparts are {expected}")
    mapped = en_prose
    for target in set(targets):
        mapped = mapped.replace(f"]({target})", f"]({_chinese_counterpart(target, GPU_PAGE)})")
    differs = translation.mismatch(mapped, zh_prose)
    if differs:
        found.append(f"code spans, links, tables or lists differ: {differs}")
    found += [f"writes {wrong!r}; write {instead}" for wrong, instead in translation.wrong_forms(chinese)]
    found += [f"a line break inside a Chinese paragraph: {place!r}" for place in translation.soft_breaks(chinese)]
    found += [f"the glossary's {' or '.join(t.chinese_forms)} for {t.english_forms[0]!r}" for t in glossary.missing(english, chinese)]
    return found


def test_the_chinese_gpu_page_keeps_the_english_pages_code_headings_and_links():
    """docs/gpu.zh-CN.md: docs/gpu.md's fenced code (same blocks, same order), headings, code spans, tables, lists
    and link targets (a page with a Chinese counterpart linked as that), in the course's Chinese terms."""
    english, chinese = GPU_PAGE.read_text(encoding="utf-8"), GPU_PAGE_ZH.read_text(encoding="utf-8")
    assert gpu_page_problems(english, chinese) == []
    assert "](docs/gpu.zh-CN.md)" in (translation.paths.ROOT / "README.zh-CN.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "change",
    [
        lambda zh: zh.replace("make gpu-check NPROC=1    #", "make gpu-check NPROC=2    #"),  # a code block differs
        lambda zh: zh.replace("## 安装", "### 安装"),  # a heading changes level
        lambda zh: zh.replace("](install.md)", "](running.md)"),  # a link points elsewhere
        lambda zh: zh.replace("显存峰值", "GPU 内存峰值"),  # a known-wrong form
    ],
)
def test_the_gpu_page_check_sees_a_change(change):
    english, chinese = GPU_PAGE.read_text(encoding="utf-8"), GPU_PAGE_ZH.read_text(encoding="utf-8")
    changed = change(chinese)
    assert changed != chinese and gpu_page_problems(english, changed)


@pytest.mark.parametrize("page", CHINESE_PAGES, ids=[page.name for page in CHINESE_PAGES])
def test_the_chinese_pages_have_no_line_break_inside_a_paragraph(page):
    """README.zh-CN.md and docs/*.zh-CN.md: a newline between two Chinese characters shows as a stray space in a
    rendered paragraph, so each paragraph is one line."""
    text = page.read_text(encoding="utf-8")
    assert not translation.soft_breaks(text), translation.soft_breaks(text)


def test_the_page_check_sees_a_planted_line_break():
    text = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    paragraph = next(line for line in text.splitlines() if re.search(f"{CJK_CHARACTER}{{2}}。", line) and not line.startswith(("#", "|", "-")))
    cut = re.search(f"{CJK_CHARACTER}{{2}}。", paragraph).start() + 1
    planted = text.replace(paragraph, paragraph[:cut] + "\n" + paragraph[cut:], 1)
    assert not translation.soft_breaks(text) and len(translation.soft_breaks(planted)) == 1


def test_make_zh_refuses_a_translation_that_writes_a_second_form():
    """`make zh` (translation.problems) stops at a term's other form, naming the cell and the one form to write."""
    [notebook] = runner.course_notebooks(["03"])
    po = translation.load(notebook)
    assert translation.problems(notebook, po) == []
    alone = r"(?<!环形)全规约(?!（)"  # all-reduce, not ring all-reduce, nor its gloss
    entry = [e for e in po if not e.obsolete and re.search(alone, e.msgstr) and e.msgstr.count("全规约") >= 2][-1]
    entry.msgstr = re.sub(alone, "All-Reduce", entry.msgstr, count=1)
    found = translation.problems(notebook, po)
    assert found == [f"03_first_collectives.ipynb, cell {entry.msgctxt}: the translation writes 'All-Reduce'; write 全规约 "
                     "(one form per term: data/glossary.csv, and course/translation.py's OTHER_FORMS)."], found
