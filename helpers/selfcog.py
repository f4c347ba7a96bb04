"""The self-cognition data (自我认知): identity rows, general and held-out questions, SWIFT's placeholders.

The self-cognition data (自我认知): the course's identity rows, general questions and held-out questions,
the placeholders SWIFT fills, and which held-out questions a run would train on.

Data (all written by this project, under ``data/``):

- ``data/self-cognition/self_cognition.jsonl``: identity questions and answers in Chinese and English
  (columns ``query``, ``response``, ``tag`` zh|en) with ``{{NAME}}`` / ``{{AUTHOR}}`` placeholders. The
  folder is called exactly ``self-cognition``: SWIFT matches a local dataset folder to its registered
  dataset of the same name, so ``--model_name`` / ``--model_author`` fill the placeholders (the zh value
  for rows tagged zh, the en value for the others), as for the hub's ``swift/self-cognition``.
- ``data/general_questions.jsonl``: everyday questions. The base model answers them itself
  (:func:`general_answers`, cached under ``build/models/general-answers/``, keyed by model); mixing
  those answers into training keeps the model's general behaviour (against forgetting, 灾难性遗忘).
- ``data/heldout.jsonl``: questions that appear in no training data, for evaluation here and in
  notebook 10: identity paraphrases (``kind`` identity, ``tag`` zh|en) and general questions with the
  words a right answer contains (``kind`` general, ``expect``).
"""

from __future__ import annotations

from pathlib import Path

from helpers import paths
from helpers.errors import CourseError
from helpers.paths import read_jsonl

DATA_DIR = paths.ROOT / "data"


SELF_COGNITION = DATA_DIR / "self-cognition"


GENERAL_QUESTIONS = DATA_DIR / "general_questions.jsonl"


HELDOUT = DATA_DIR / "heldout.jsonl"


def self_cognition_rows(folder=SELF_COGNITION) -> list[dict]:
    """Every row of the self-cognition folder (all its .jsonl files, in name order)."""
    files = sorted(Path(folder).glob("*.jsonl"))
    if not files:
        raise CourseError(f"{folder} holds no .jsonl file; the self-cognition data is missing.")
    return [row for path in files for row in read_jsonl(path)]


def general_questions(path=GENERAL_QUESTIONS) -> list[str]:
    return [row["query"] for row in read_jsonl(path)]


def heldout(path=HELDOUT, kind: str | None = None) -> list[dict]:
    """The held-out rows, optionally only those of one ``kind`` (identity or general)."""
    rows = read_jsonl(path)
    return [r for r in rows if kind is None or r["kind"] == kind]


def zh_en(value, what: str = "value") -> tuple[str, str]:
    """A (zh, en) pair from a string or a list of one or two strings, as SWIFT reads --model_name."""
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, (list, tuple))
        or not 1 <= len(value) <= 2
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise CourseError(
            f"{what} = {value!r} must be a name or a [中文, English] list of two non-empty names."
        )
    return (value[0], value[-1])


def fill_placeholders(row: dict, name, author) -> dict:
    """A row with {{NAME}} / {{AUTHOR}} replaced as SWIFT does: the zh value for tag zh, else the en value."""
    name, author = zh_en(name, "MODEL_NAME"), zh_en(author, "MODEL_AUTHOR")
    index = 0 if row.get("tag") == "zh" else 1
    out = dict(row)
    for key in ("query", "response"):
        out[key] = row[key].replace("{{NAME}}", name[index]).replace("{{AUTHOR}}", author[index])
    return out


def training_questions() -> set[str]:
    """Every question that appears in the project's training data."""
    return {row["query"] for row in self_cognition_rows()} | set(general_questions())


def _questions_of(rows) -> set[str]:
    """The user turns of dataset rows, in either layout SWIFT reads (``query`` or ``messages``)."""
    found = set()
    for row in rows:
        if row.get("query"):
            found.add(row["query"])
        for message in row.get("messages") or []:
            if message.get("role") == "user":
                found.add(message["content"])
    return found


def hub_questions(dataset: str, name, author) -> set[str]:
    """Every user question of a hub dataset (all its rows, whatever ``#N`` a command samples), loaded the way
    ``swift sft`` loads it (swift/dataset/loader.py, load_dataset), placeholders filled: from the hub, or
    from its cache."""
    from swift.dataset import load_dataset

    train, _ = load_dataset([dataset.split("#")[0]], model_name=list(name), model_author=list(author))
    return _questions_of(train)


def leaked_heldout(
    sources=None, name=("小课", "XiaoKe"), author=("并行训练营", "Parallel Training Camp")
) -> list[str]:
    """Held-out questions that also appear in the data a run trains on (should be none). ``sources``: the
    ``--dataset`` values of that run (local folders or files of this project, hub ids); None: the course's
    own training data (self-cognition rows and the general questions)."""
    if sources is None:
        seen = training_questions()
    else:
        seen = set()
        for source in sources:
            path = Path(str(source).split("#")[0])
            if path.is_dir():
                seen |= {fill_placeholders(row, name, author)["query"] for row in self_cognition_rows(path)}
            elif path.is_file():
                seen |= _questions_of(read_jsonl(path))
            else:
                seen |= hub_questions(str(source), name, author)
    return [row["query"] for row in heldout() if row["query"] in seen]


def identity_part(sources) -> tuple:
    """The self-cognition sources of a ``--dataset`` mix (the course's folder, or the hub's
    ``swift/self-cognition``): the same identity data, without the general data beside it."""
    part = tuple(s for s in sources if Path(str(s).split("#")[0]).name == "self-cognition")
    if not part:
        raise CourseError(f"no self-cognition data among {list(map(str, sources))}.")
    return part


SYSTEM = "You are a helpful assistant."  # used in training and in every question asked afterwards
