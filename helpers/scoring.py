"""Scoring whole answers on the held-out questions, per language.

Scoring answers on the held-out questions: whole answers that name the new identity, general answers
kept, per language, against the course's goals."""

from __future__ import annotations

import re

from helpers import report
from helpers.answering import answer_text
from helpers.selfcog import zh_en


def names_in(text: str, names) -> bool:
    """True when ``text`` contains any of ``names`` (case-insensitive)."""
    folded = text.casefold()
    return any(n.casefold() in folded for n in names)


def contains_expected(text: str, expected) -> bool:
    """True when ``text`` holds one of the expected words (whole words for Latin letters and digits)."""
    for word in expected:
        if re.fullmatch(r"[\w ]+", word, re.ASCII):
            if re.search(rf"(?<![\w]){re.escape(word)}(?![\w])", text, re.IGNORECASE | re.ASCII):
                return True
        elif word in text:
            return True
    return False


# Identities a self-cognition answer must not claim: the base models' own and other assistants'.
OTHER_IDENTITIES = (
    "SmolLM", "Hugging Face", "HuggingFace", "Qwen", "通义", "千问", "阿里", "Alibaba",
    "ChatGPT", "OpenAI", "GPT-4", "Llama", "Meta AI", "Claude", "Anthropic",
)  # fmt: skip


def right_answer(text: str, row: dict) -> bool:
    """A general answer is right when it holds an expected word and none of the row's wrong words."""
    return contains_expected(text, row["expect"]) and not contains_expected(text, row.get("wrong", ()))


def score(identity_rows, identity_answers, general_rows, general_answers, base_general, name, author) -> dict:
    """Held-out scores of one model, per language (zh, en), as fractions:

    - ``name_zh`` / ``name_en``: identity answers holding the name in the question's language;
    - ``author_zh`` / ``author_en``: answers to "who made/trained you" questions holding the author in
      the question's language ("XiaoKe Training Camp" is not "Parallel Training Camp");
    - ``no_false_claim_zh`` / ``_en``: identity answers claiming none of :data:`OTHER_IDENTITIES`;
    - ``general_kept``: of the general questions the base model answered right (expected word, no
      wrong word), the share the model still answers right without naming itself; per language too
      (``general_kept_zh`` / ``_en``, NaN where the base model got none right).
    """
    names, authors = zh_en(name, "MODEL_NAME"), zh_en(author, "MODEL_AUTHOR")
    out: dict = {}
    for k, tag in enumerate(("zh", "en")):
        mine = [
            (r, answer_text(a)) for r, a in zip(identity_rows, identity_answers, strict=True) if r["tag"] == tag
        ]
        about_author = [a for r, a in mine if r.get("asks") == "author"]
        out[f"name_{tag}"] = _share(names_in(a, [names[k]]) for _, a in mine)
        # the author as written: "a parallel training camp" is no author
        out[f"author_{tag}"] = _share(authors[k] in a for a in about_author)
        out[f"no_false_claim_{tag}"] = _share(not names_in(a, OTHER_IDENTITIES) for _, a in mine)
    right = [
        i
        for i, (r, base) in enumerate(zip(general_rows, base_general, strict=True))
        if right_answer(answer_text(base), r)
    ]
    kept = {i for i in right if right_answer(answer_text(general_answers[i]), general_rows[i])
            and not names_in(answer_text(general_answers[i]), names)}  # fmt: skip
    for tag in ("zh", "en", None):
        mine = [i for i in right if tag is None or general_rows[i].get("tag", "en") == tag]
        key = "general" if tag is None else f"general_{tag}"
        out[f"{key}_base_right"], out[f"{key}_kept_count"] = len(mine), sum(i in kept for i in mine)
        out[f"{key}_kept"] = _share(i in kept for i in mine)
    out["general_naming_itself"] = sum(names_in(answer_text(a), names) for a in general_answers)
    return out


def _share(hits) -> float:
    hits = list(hits)
    return sum(hits) / len(hits) if hits else float("nan")


SCORE_COLUMNS = {  # table heading: key in score()
    "name (zh)": "name_zh", "name (en)": "name_en", "author (zh)": "author_zh", "author (en)": "author_en",
    "no false claim (zh)": "no_false_claim_zh", "no false claim (en)": "no_false_claim_en",
}  # fmt: skip


def score_rows(by_model: dict) -> list[dict]:
    """One table row per model (``{label: score(...)}``): fractions as percentages, kept as counts."""
    rows = []
    for label, s in by_model.items():
        row = {"model": label, **{h: _percent(s[k]) for h, k in SCORE_COLUMNS.items()}}
        for key, heading in (("general", "general kept"), ("general_zh", "(zh)"), ("general_en", "(en)")):
            row[heading] = f"{s[key + '_kept_count']}/{s[key + '_base_right']}"
        row["general answers naming itself"] = s["general_naming_itself"]
        rows.append(row)
    return rows


def forgetting_summary(runs, key: str = "extra loss (nats/token)") -> dict:
    """``{data: {"each": [value per seed], "mean": ..., "spread": max - min}}`` from one row per run."""
    out: dict = {}
    for row in runs:
        out.setdefault(row["data"], {"each": []})["each"].append(row[key])
    for s in out.values():
        s["mean"] = sum(s["each"]) / len(s["each"])
        s["spread"] = max(s["each"]) - min(s["each"])
    return out


# What the cpu profile's fine-tune must reach on the held-out questions (notebooks 06 and 07 assert it).
GOALS = {"name_zh": 0.95, "name_en": 0.95, "author_zh": 0.9, "author_en": 0.9, "general_kept": 0.85}


def missed_goals(scores: dict, goals=None) -> list[str]:
    """The goals a model's :func:`score` misses, one readable line each (a NaN score misses its goal)."""
    return [
        f"{key} = {scores[key]:.2f}, below the goal {goal}"
        for key, goal in (goals or GOALS).items()
        if not scores[key] >= goal
    ]


def record_scores(scores: dict, prefix: str = "", note: str = "") -> None:
    """Put a model's per-language scores into the run report (fractions; general kept with its counts)."""
    for key in (*SCORE_COLUMNS.values(), "general_kept"):
        extra = (
            f"{scores['general_kept_count']}/{scores['general_base_right']} the base model got right"
            if key == "general_kept"
            else note
        )
        report.record(prefix + key, scores[key], note=extra)


def _percent(x: float) -> str:
    return "n/a" if x != x else f"{x:.0%}"
