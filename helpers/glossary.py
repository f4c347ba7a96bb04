"""The course's one glossary (data/glossary.csv): each notebook shows its terms, and the Chinese edition must use them."""

import csv
import re
from dataclasses import dataclass

from . import paths

FILE = paths.ROOT / "data" / "glossary.csv"


@dataclass(frozen=True)
class Term:
    english: str  # as shown; a part in parentheses explains, " / " separates spellings
    chinese: str  # as shown; the parts outside parentheses, split on " / ", are the accepted translations
    notebooks: tuple[str, ...]  # the notebooks whose glossary lists it ("01", "02", ...)

    @property
    def english_forms(self) -> list[str]:
        return _forms(self.english)

    @property
    def chinese_forms(self) -> list[str]:
        return _forms(self.chinese)


def _forms(text: str) -> list[str]:
    return [part.strip() for part in re.sub(r"\([^)]*\)", "", text).split(" / ") if part.strip()]


def terms() -> list[Term]:
    """Every row of data/glossary.csv, in file order."""
    with open(FILE, encoding="utf-8", newline="") as f:
        return [Term(r["english"], r["chinese"], tuple(r["notebooks"].split())) for r in csv.DictReader(f)]


def table(notebook: str) -> str:
    """The Markdown table of the terms notebook ``notebook`` ("01".."12") lists."""
    rows = [t for t in terms() if notebook in t.notebooks]
    return "\n".join(["| English | 中文 |", "|---|---|"] + [f"| {t.english} | {t.chinese} |" for t in rows])


def show(notebook: str) -> None:
    """Display notebook ``notebook``'s glossary (Markdown in Jupyter, plain text elsewhere)."""
    from .report import markdown

    markdown(table(notebook))


def prose(markdown_text: str) -> str:
    """Markdown less what is not prose: fenced code, inline code, link targets, math and HTML tags."""
    text = re.sub(r"```.*?```", " ", markdown_text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\$[^$]*\$", " ", text)
    return re.sub(r"<[^>]+>", " ", text)


def _english_pattern(form: str) -> re.Pattern:
    words = r"[ -]".join(re.escape(w) for w in re.split(r"[ -]", form))
    return re.compile(rf"(?<![\w-]){words}(?:s|es)?(?![\w-])", re.I)


def missing(english: str, chinese: str) -> list[Term]:
    """The terms whose English appears in the prose of ``english`` while none of their accepted Chinese
    translations appears in ``chinese``."""
    source, target = prose(english), prose(chinese).lower()
    return [
        term
        for term in terms()
        if any(_english_pattern(form).search(source) for form in term.english_forms)
        and not any(form.lower() in target for form in term.chinese_forms)
    ]
