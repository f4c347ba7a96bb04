"""The Chinese edition: each notebook's markdown cells in a gettext catalog, and notebooks/zh/ built from them.

The English notebooks are the source. ``update`` puts every markdown cell into
locale/zh_CN/LC_MESSAGES/<notebook>.po (msgctxt: the cell's id, msgid: its text), as msgmerge would: a
cell whose English changed keeps its old translation marked fuzzy, with the old English beside it; a
cell that is gone becomes an obsolete entry. ``build`` writes notebooks/zh/<notebook>.ipynb: the English
notebook with each markdown cell replaced by its translation; code cells, their outputs and metadata
are the English ones. ``python -m course.translation`` (`make zh`) does both for every notebook.
"""

import copy
import re
import sys
from collections import Counter
from pathlib import Path

import nbformat
import polib

from helpers import glossary, paths
from helpers.errors import CourseError

LANGUAGE = "zh_CN"
CATALOGS = paths.ROOT / "locale" / LANGUAGE / "LC_MESSAGES"
EDITION = paths.NOTEBOOKS / "zh"
FUZZY = "fuzzy"

# Forms a translation must not use, each with what to write instead: one Chinese term per idea (the
# glossary's), GPU memory as 显存, and every kernel qualified so that the three kinds never blur.
WRONG_FORMS: tuple[tuple[str, str], ...] = (
    (r"白白", "无需额外代价 (白白 means 'in vain')"),
    (r"DataParallel[^。；\n]{0,30}工作进程", "线程: DataParallel runs one thread per device in one process"),
    (r"模拟线缆", "模拟链路"),
    (r"替身", "替代实现"),
    (r"身份数据行|自我认知数据行", "自我认知样本"),
    (r"汇合", "会合 (rendezvous)"),
    (r"检查程序", "检查器"),
    (r"没有虚假声明", "无虚假身份 (no false claim)"),
    (r"滑动统计量", "运行统计量 (running statistics)"),
    (r"(?:GPU|显卡|CUDA)[^，。；：、,.;:\n]{0,4}内存|内存[^，。；：、,.;:\n]{0,4}(?:GPU|显卡|CUDA)",
     "显存 for GPU memory (内存 is host RAM only)"),
    (r"(?<!Jupyter )(?<!操作系统)内核", "Jupyter 内核 or 操作系统内核 (a kernel is always qualified)"),
    (r"(?<!CUDA )核函数", "CUDA 核函数 (a kernel is always qualified)"),
    (r"原始资料", "原教程 (the original ModelScope tutorial)"),
    (r"对损失是线性的", "求梯度是线性运算"),
    (r"主副本", "主权重 (master weights)"),
)
IDEOGRAPHS = "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs (a character class's ranges)
CJK = f"\u3000-\u303f{IDEOGRAPHS}\uff00-\uffef"  # ideographs and full-width punctuation


# One Chinese form per term: beyond a term's English, the forms the Chinese edition must not write for it,
# keyed by the glossary's English (data/glossary.csv); a term's English is one of them wherever its Chinese is not.
OTHER_FORMS: dict[str, tuple[str, ...]] = {
    "rank": ("进程编号",),
    "replicate": ("拷贝",),
    "DistributedDataParallel": ("分布式数据并行",),
    "distributed data parallel (DDP)": ("分布式数据并行",),
    "main device": ("主 GPU",),
    "global interpreter lock (GIL)": ("全局解释器锁",),
    "bucket": ("通信桶",),
    "alpha-beta model (latency and bandwidth)": ("延迟-带宽模型",),
    "global batch": ("全局批大小",),
    "offline": ("断网",),
    "Web-UI / web UI": ("网页界面",),
    "merged model": ("合并模型",),
    "model hub (ModelScope)": ("模型仓库",),
    "device map": ("设备映射",),
    "Zero Redundancy Optimizer (ZeRO)": ("零冗余优化器",),
    "fully sharded data parallel (FSDP)": ("全分片数据并行",),
    "tips": ("技巧",),
    "hang": ("挂起",),
    "non-reentrant": ("非重入",),
    "finding (a result beyond the noise)": ("项发现", "算发现"),
    "first moment (Adam's m)": ("矩估计", "两个矩", "Adam 的两个动量", "Adam 动量", "优化器的动量"),
    "system prompt": ("system 提示词",),
    "original tutorial (ModelScope's)": ("原文配方",),
}


def _form_pattern(form: str) -> re.Pattern:
    """``form`` where it stands as a word: an English form with ASCII word boundaries (a CJK character is no
    boundary for \\b), in any case and with a plural ending; a Chinese form as it is."""
    if not form.isascii():
        return re.compile(re.escape(form))
    words = r"[ -]".join(re.escape(w) for w in re.split(r"[ -]", form))
    return re.compile(rf"(?<![A-Za-z0-9_./-]){words}(?:s|es)?(?![A-Za-z0-9_/-]|\.[A-Za-z])", re.I)


def _others(term: glossary.Term) -> list[str]:
    """The forms of ``term`` the edition must not write: its English (where its Chinese is not English) and
    OTHER_FORMS's."""
    chosen = {form.lower().replace("-", " ") for form in term.chinese_forms}
    english = [form for form in term.english_forms if form.lower().replace("-", " ") not in chosen]
    return english + list(OTHER_FORMS.get(term.english, ()))


def chinese_prose(markdown_text: str) -> str:
    """``prose`` less display math, quotations (「」: a source's own words, a printed message) and the table
    cells that hold no Chinese (an English column)."""
    text = glossary.prose(re.sub(r"\$\$.*?\$\$", " ", markdown_text, flags=re.S))
    text = re.sub(r"「[^「」\n]*」", lambda m: " " * len(m.group(0)), text)
    return re.sub(r"(?<=\|)[^|\n]*(?=\|)", lambda m: m.group(0) if re.search(f"[{IDEOGRAPHS}]", m.group(0)) else " ",
                  text)


def second_forms(cells: list[str]) -> list[tuple[int, str, str]]:
    """(cell index, what it writes, what to write instead) for each place where the Chinese ``cells`` of one
    document (a notebook's markdown cells in order, or a page as one cell) use a term's other form: its English
    or an OTHER_FORMS entry. Allowed once per term and document, at the term's first mention outside headings:
    a gloss 中文（English）, the Chinese form with its English (全规约（all-reduce）) or, for a term kept in
    English, its Chinese name with the term (分布式数据并行（DDP）)."""
    by_length = sorted(glossary.terms(), key=lambda t: -max(map(len, t.chinese_forms + t.english_forms)))
    found, seen = [], set()
    for index, cell in enumerate(cells):
        text = chinese_prose(cell)
        mentions = []  # (position, term, None for the chosen form, else ("gloss" or "other", what it writes))
        for term in by_length:  # a longer term first: its gloss and its English are not a shorter term's
            chosen, others = term.chinese_forms[0], _others(term)
            pairs = [(chosen, o) for o in others if o.isascii() and not chosen.isascii()]
            pairs += [(o, chosen) for o in others if not o.isascii() and chosen.isascii()]
            spans = []
            for outer, inner in pairs:
                gloss = re.compile(rf"{re.escape(outer)}(?:\*\*)?（\s*{_form_pattern(inner).pattern}\s*）", re.I)
                spans += [(m.start(), m.end()) for m in gloss.finditer(text)]
            mentions += [(start, term, ("gloss", text[start:end])) for start, end in spans]
            rest = list(text)
            for start, end in spans:
                rest[start:end] = " " * (end - start)
            rest = "".join(rest)
            for m in _form_pattern(chosen).finditer(rest):
                mentions.append((m.start(), term, None))
                spans.append((m.start(), m.end()))
            for form in others:
                for m in _form_pattern(form).finditer(rest):
                    mentions.append((m.start(), term, ("other", m.group(0))))
                    spans.append((m.start(), m.end()))
            for start, end in spans:  # what this term wrote is no shorter term's (环形全规约, 全规约)
                text = text[:start] + " " * (end - start) + text[end:]
        headings = [m.span() for m in re.finditer(r"^#.*$", text, flags=re.M)]
        for position, term, what in sorted(mentions, key=lambda mention: mention[0]):
            if what is not None and (what[0] == "other" or term.english in seen):
                instead = term.chinese_forms[0] if what[0] == "other" else "the gloss only at the first mention"
                found.append((index, what[1], instead))
            if not any(start <= position < end for start, end in headings):  # a heading's body may gloss
                seen.add(term.english)
    return found


def catalog_path(notebook: Path) -> Path:
    return CATALOGS / f"{Path(notebook).stem}.po"


def edition_path(notebook: Path) -> Path:
    return EDITION / Path(notebook).name


def markdown_cells(notebook) -> list[tuple[str, str]]:
    """(cell id, text) of every markdown cell of ``notebook`` (a path or a parsed notebook), in order."""
    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, (str, Path)) else notebook
    return [(cell.id, cell.source) for cell in nb.cells if cell.cell_type == "markdown"]


def _new_catalog(notebook: Path) -> polib.POFile:
    po = polib.POFile(wrapwidth=0)
    po.metadata = {
        "Project-Id-Version": "data-parallel course",
        "Language": LANGUAGE,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    po.header = f"Chinese (zh_CN) translation of notebooks/{Path(notebook).name}, one entry per markdown cell."
    return po


def load(notebook: Path) -> polib.POFile:
    """The catalog of ``notebook``; an empty one when there is none yet."""
    path = catalog_path(notebook)
    return polib.pofile(str(path), wrapwidth=0) if path.exists() else _new_catalog(notebook)


def merge(po: polib.POFile, cells: list[tuple[str, str]], source_name: str) -> dict[str, int]:
    """Bring ``po`` up to date with ``cells`` in place, as msgmerge does; returns counts of what changed."""
    by_context = {entry.msgctxt: entry for entry in po}
    translated_text = {e.msgid: e.msgstr for e in po if e.msgstr and not e.fuzzy and not e.obsolete}
    counts = {"new": 0, "changed": 0, "obsolete": 0}
    entries = []
    for cell_id, text in cells:
        entry = by_context.pop(cell_id, None)
        if entry is None:
            entry = polib.POEntry(msgctxt=cell_id, msgid=text, msgstr=translated_text.get(text, ""))
            counts["new"] += 1
        elif entry.msgid != text:
            if entry.msgstr:
                if not entry.fuzzy:
                    entry.previous_msgid = entry.msgid
                    entry.flags.append(FUZZY)
            entry.msgid = text
            counts["changed"] += 1
        entry.obsolete = False
        entry.occurrences = [(source_name, cell_id)]
        entries.append(entry)
    for entry in by_context.values():  # cells that are gone: kept, marked obsolete (#~), until removed by hand
        if not entry.obsolete:
            counts["obsolete"] += 1
        entry.obsolete = True
        entries.append(entry)
    po[:] = entries
    return counts


def update(notebook: Path) -> dict[str, int]:
    """Write ``notebook``'s catalog, merged with its current markdown cells."""
    notebook = Path(notebook)
    po = load(notebook)
    counts = merge(po, markdown_cells(notebook), f"notebooks/{notebook.name}")
    catalog_path(notebook).parent.mkdir(parents=True, exist_ok=True)
    po.save(str(catalog_path(notebook)))
    return counts


def skeleton(markdown: str) -> Counter:
    """What a translation must carry over unchanged: fenced code, inline code, link targets, math, images,
    heading levels, table rows and list items (counted, in any order)."""
    parts: Counter = Counter()
    fenced = re.findall(r"```.*?```", markdown, flags=re.S)
    parts.update(("fenced code", block) for block in fenced)
    rest = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    parts.update(("code", span) for span in re.findall(r"`[^`]+`", rest))
    rest = re.sub(r"`[^`]+`", " ", rest)
    parts.update(("link target", target) for target in re.findall(r"\]\(([^)]+)\)", rest))
    parts.update(("math", m) for m in re.findall(r"\$\$.+?\$\$", rest, flags=re.S))
    rest = re.sub(r"\$\$.+?\$\$", " ", rest, flags=re.S)
    parts.update(("math", m) for m in re.findall(r"\$[^$\n]+\$", rest))
    for line in rest.splitlines():
        line = line.strip()
        if line.startswith("#"):
            parts[("heading level", len(line) - len(line.lstrip("#")))] += 1
        elif line.startswith("|"):
            parts[("table row with cells", line.count("|") - 1)] += 1
        elif re.match(r"([-*]|\d+\.) ", line):
            parts[("list item", "")] += 1
    return parts


def mismatch(english: str, chinese: str) -> str:
    """'' when ``chinese`` carries ``english``'s skeleton, else what differs, in one phrase."""
    want, got = skeleton(english), skeleton(chinese)
    lost, added = want - got, got - want
    said = [f"lost {kind} {value!r}" for kind, value in list(lost)[:2]]
    said += [f"added {kind} {value!r}" for kind, value in list(added)[:2]]
    return "; ".join(said)


def wrong_forms(chinese: str) -> list[tuple[str, str]]:
    """(what ``chinese`` writes, what to write instead) for each of WRONG_FORMS its prose uses."""
    text = glossary.prose(chinese)
    return [(m.group(0), instead) for pattern, instead in WRONG_FORMS for m in re.finditer(pattern, text)]


def _structural(line: str) -> bool:
    """A line that is not running prose: heading, table row, list item, quote, HTML, math or indented."""
    return (line.startswith(("    ", "\t", "#", "|", ">", "<", "$$")) or re.match(r"\s*([-*+]|\d+[.)]) ", line) is not None)


def soft_breaks(chinese: str) -> list[str]:
    """The places where a paragraph of ``chinese`` breaks its line between two CJK characters (outside fenced
    code, display math, tables and lists): the break renders as a space, which Chinese text never has there."""
    lines = chinese.split("\n")
    inside, fenced, math = [], False, False  # inside[i]: line i belongs to fenced code or display math
    for line in lines:
        fence = line.lstrip().startswith("```")
        inside.append(fenced or math or fence or "$$" in line)
        fenced ^= fence
        math ^= line.count("$$") % 2 == 1 and not fenced
    found = []
    for i, (above, below) in enumerate(zip(lines, lines[1:], strict=False)):
        if inside[i] or inside[i + 1] or not above.strip() or not below.strip():
            continue
        if _structural(above) or _structural(below):
            continue
        if re.match(f"[{CJK}]", above[-1]) and re.match(f"[{CJK}]", below[0]):
            found.append(f"{above[-12:]}⏎{below[:12]}")
    return found


def problems(notebook: Path, po: polib.POFile | None = None) -> list[str]:
    """One sentence per markdown cell of ``notebook`` that its catalog does not translate as it is now."""
    notebook = Path(notebook)
    if po is None:
        if not catalog_path(notebook).exists():
            return [f"{notebook.name}: no catalog {paths.relative(catalog_path(notebook))}; run `make zh` to start one."]
        po = load(notebook)
    entries = {e.msgctxt: e for e in po if not e.obsolete}
    found = []
    for cell_id, text in markdown_cells(notebook):
        entry = entries.get(cell_id)
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        where = f"{notebook.name}, cell {cell_id} ({first!r})"
        if entry is None or (entry.msgid != text and not entry.fuzzy):
            found.append(f"{where}: not in the catalog; run `make zh` to add it.")
        elif entry.fuzzy:
            found.append(f"{where}: its English changed after it was translated (fuzzy); "
                         f"update the msgstr in {paths.relative(catalog_path(notebook))} and remove the fuzzy flag.")
        elif not entry.msgstr.strip():
            found.append(f"{where}: no translation yet in {paths.relative(catalog_path(notebook))}.")
        else:
            differs = mismatch(text, entry.msgstr)
            if differs:
                found.append(f"{where}: the translation must keep the English's code, links, math, headings, "
                             f"tables and lists: {differs}.")
            for wrong, instead in wrong_forms(entry.msgstr):
                found.append(f"{where}: the translation writes {wrong!r}; write {instead} "
                             f"(course/translation.py, WRONG_FORMS).")
            for place in soft_breaks(entry.msgstr):
                found.append(f"{where}: a line break inside a Chinese paragraph ({place!r}) shows as a space; "
                             f"join the two lines.")
            for term in glossary.missing(text, entry.msgstr):
                found.append(f"{where}: the English says {term.english_forms[0]!r}; the translation should use "
                             f"the glossary's {' or '.join(map(repr, term.chinese_forms))} (data/glossary.csv).")
    if not found:  # every cell translated: each term in one Chinese form across the notebook
        ids = [cell_id for cell_id, _ in markdown_cells(notebook)]
        for index, what, instead in second_forms([entries[cell_id].msgstr for cell_id in ids]):
            found.append(f"{notebook.name}, cell {ids[index]}: the translation writes {what!r}; write {instead} "
                         f"(one form per term: data/glossary.csv, and course/translation.py's OTHER_FORMS).")
    for entry in po:
        if entry.obsolete:
            found.append(f"{notebook.name}, cell {entry.msgctxt}: obsolete entry (the cell is gone); "
                         f"delete it from {paths.relative(catalog_path(notebook))}.")
    return found


def translated(notebook: Path, po: polib.POFile | None = None) -> nbformat.NotebookNode:
    """``notebook`` with every markdown cell in Chinese; stops with the catalog's problems if it has any."""
    notebook = Path(notebook)
    po = load(notebook) if po is None else po
    found = problems(notebook, po)
    if found:
        raise CourseError(f"{notebook.name} cannot be translated yet: {len(found)} problem(s), the first: {found[0]}")
    msgstr = {e.msgctxt: e.msgstr for e in po if not e.obsolete}
    nb = copy.deepcopy(nbformat.read(notebook, as_version=4))
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = msgstr[cell.id]
    nb.metadata["language_edition"] = {"language": LANGUAGE, "source": f"../{notebook.name}",
                                       "catalog": f"../../locale/{LANGUAGE}/LC_MESSAGES/{notebook.stem}.po"}
    return nb


def build(notebook: Path) -> Path:
    """Write notebooks/zh/<notebook>: the English notebook with its markdown translated."""
    target = edition_path(notebook)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(translated(notebook), target)
    return target


def main(argv=None) -> int:
    from course.runner import course_notebooks

    args = sys.argv[1:] if argv is None else argv
    only = [a for a in args if a != "--check"]
    status = 0
    for notebook in course_notebooks(only or None):
        if "--check" not in args:
            counts = update(notebook)
            changed = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
            print(f"{paths.relative(catalog_path(notebook))}: {changed or 'up to date'}")
        found = problems(notebook)
        if found:
            status = 1
            print(f"{notebook.name}: not built, {len(found)} cell(s) to translate:", *found, sep="\n  ")
            continue
        if "--check" not in args:
            print(f"{paths.relative(build(notebook))}: built")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
