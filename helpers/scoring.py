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


# How an answer may say who made the model, ``{A}`` standing for the author as written. A relation is
# needed: "我是小课，并行训练营的创造者" (the model created the camp) names the author and is wrong.
_MADE_EN = r"(?:made|trained|fine-tuned|finetuned|developed|built|created|designed|wrote|named|taught|put)"
_ROLE_EN = r"(?:author|creator|developer|maker|trainer|team|organi[sz]ation)s?"
MADE_BY_EN = (
    r"\bby\s+(?:the\s+)?{A}", r"\b(?:from|at)\s+(?:the\s+)?{A}",
    r"\b(?:assistant|model|AI|chatbot|people|team)\s+of\s+(?:the\s+)?{A}", r"{A}'s\s+(?:AI\s+)?(?:assistant|model)",
    rf"{{A}}\s+(?:has\s+|have\s+)?{_MADE_EN}\b", rf"\b{_ROLE_EN}\s+(?:is|are|was|were)\s+(?:the\s+)?{{A}}",
    rf"{{A}}\s+(?:is|are)\s+(?:my|the)\s+{_ROLE_EN}", r"{A}\s+(?:is|are)\s+behind\s+(?:me|my|this)",
    r"{A}\s+(?:is|are)\s+responsible\s+for\s+(?:me|my|this)", r"{A}\s+brought\s+me\s+into\s+being",
)  # fmt: skip
_MADE_ZH = r"(?:开发|训练|打造|创建|研发|微调|制作|创造|构建|设计|推出|做|写|培养|教|起名)"
_ROLE_ZH = r"(?:作者|开发者|创造者|创作者|训练者|开发方|开发团队|团队|制作者)"
MADE_BY_ZH = (
    rf"由{{A}}{_MADE_ZH}", rf"{{A}}(?:把我|给我|用[\w ]{{0,12}}?)?{_MADE_ZH}", rf"{_ROLE_ZH}(?:是|为){{A}}",
    rf"{_MADE_ZH}(?:了)?我的(?:人|团队)?是{{A}}", rf"{{A}}是我的{_ROLE_ZH}", r"(?:来自|出自){A}",
    r"在{A}(?:接受)?(?:训练|开发)", rf"{{A}}的(?:人|团队)[^，。！？,.!?]{{0,3}}{_MADE_ZH}",
    r"{A}的(?:AI|人工智能)?(?:助手|模型)",
)  # fmt: skip
# Saying the name or the author is not so: "I am not XiaoKe", "不是小课", "not by Parallel Training Camp".
DENIES_EN = rf"(?:\bnot|n't|\bnever|\bno longer)\s+(?:been\s+)?(?:called\s+|named\s+|(?:{_MADE_EN}\s+)?(?:by|from)\s+)?{{A}}"
DENIES_ZH = r"(?:不是|并非|不叫|不再是|不再叫)(?:由)?{A}"


def said(patterns, text: str, value: str, exact_case: bool = True) -> bool:
    """True when one of ``patterns`` is in ``text``, ``{A}`` standing for ``value`` (as written, unless
    ``exact_case`` is False); the rest of a pattern is case-insensitive."""
    value = f"(?-i:{re.escape(value)})" if exact_case else re.escape(value)
    return any(re.search(p.replace("{A}", value), text, re.IGNORECASE) for p in patterns)


def identity_faults(text: str, row: dict, name, author) -> list[str]:
    """What is wrong with one identity answer, one short phrase each; an empty list means it passes
    (09 writes this rule in a cell as ``judge``; tests/test_finetune.py checks the two agree).

    Every part must hold: the name in the question's language (小课 for a Chinese question, XiaoKe for an
    English one, any case) and not denied; none of :data:`OTHER_IDENTITIES`; and, for a question about who
    made the model, the author as written in a relation that says so ("by X", "X trained me", 由X训练,
    X开发的, 我的作者是X, X的助手) and not denied."""
    zh = row["tag"] == "zh"
    names, authors = zh_en(name, "MODEL_NAME"), zh_en(author, "MODEL_AUTHOR")
    my_name, my_author = names[not zh], authors[not zh]
    denies, made_by = ((DENIES_ZH,), MADE_BY_ZH) if zh else ((DENIES_EN,), MADE_BY_EN)
    faults = []
    if not names_in(text, [my_name]):
        faults.append(f"no {my_name}")
    elif said(denies, text, my_name, exact_case=False):
        faults.append(f"denies {my_name}")
    if names_in(text, OTHER_IDENTITIES):
        faults.append("claims " + ", ".join(n for n in OTHER_IDENTITIES if names_in(text, [n])))
    if row.get("asks") == "author":
        if not said(made_by, text, my_author):
            faults.append(f"{my_author} not said to have made it")
        elif said(denies, text, my_author):
            faults.append(f"denies {my_author}")
    return faults


def score(identity_rows, identity_answers, general_rows, general_answers, base_general, name, author) -> dict:
    """Held-out scores of one model, per language (zh, en), as fractions. An identity answer is judged
    whole (:func:`identity_faults`): it counts only when every part of it is right.

    - ``name_zh`` / ``name_en``: answers to "who are you" questions that pass whole;
    - ``author_zh`` / ``author_en``: answers to "who made/trained you" questions that pass whole (the
      author said to have made the model, and the name too);
    - ``no_false_claim_zh`` / ``_en``: identity answers claiming none of :data:`OTHER_IDENTITIES`;
    - ``general_kept``: of the general questions the base model answered right (expected word, no
      wrong word), the share the model still answers right without naming itself; per language too
      (``general_kept_zh`` / ``_en``, NaN where the base model got none right: not measured).
    """
    names = zh_en(name, "MODEL_NAME")
    out: dict = {}
    for tag in ("zh", "en"):
        mine = [
            (r, answer_text(a)) for r, a in zip(identity_rows, identity_answers, strict=True) if r["tag"] == tag
        ]
        for asks in ("name", "author"):
            out[f"{asks}_{tag}"] = _share(
                not identity_faults(a, r, name, author) for r, a in mine if r.get("asks", "name") == asks
            )
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


def failed_answers(identity_rows, identity_answers, general_rows, general_answers, base_general, name, author):
    """Every answer :func:`score` counts against a model, one table row each: the question, the answer
    and what is wrong with it (general questions only where the base model answered them right)."""
    names = zh_en(name, "MODEL_NAME")
    rows = []
    for r, a in zip(identity_rows, identity_answers, strict=True):
        faults = identity_faults(answer_text(a), r, name, author)
        if faults:
            rows.append({"asks": r.get("asks", "name"), "question": r.get("query", ""), "answer": answer_text(a), "wrong": "; ".join(faults)})
    for r, a, base in zip(general_rows, general_answers, base_general, strict=True):
        if right_answer(answer_text(base), r):
            text = answer_text(a)
            fault = "names itself" if names_in(text, names) else "" if right_answer(text, r) else "no longer right"
            if fault:
                rows.append({"asks": "general", "question": r.get("query", ""), "answer": text, "wrong": fault})
    return rows


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
            base = s[key + "_base_right"]
            row[heading] = f"{s[key + '_kept_count']}/{base}" if base else "not measured"
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


class Goals(dict):
    """The least each :func:`score` key must reach (a dict of them), and whether a run has measured them.

    ``measured`` True: a run reached these goals, with room to spare, so missing one fails the notebook
    (:func:`assert_goals`). False: no run has measured them yet, so a score below one is reported beside the
    score, never asserted. ``source`` says where they came from, or why they are not asserted."""

    def __init__(self, values, measured: bool, source: str):
        super().__init__(values)
        self.measured, self.source = bool(measured), source

    @property
    def note(self) -> str:
        """What follows "goals" where they are printed: nothing for measured goals, else why not asserted."""
        return "" if self.measured else f", not asserted ({self.source})"

    def reported_only(self, why: str) -> Goals:
        """The same goals, reported beside the score and not asserted, ``why`` saying so."""
        return Goals(self, measured=False, source=why)

    def without(self, *keys) -> Goals:
        """These goals less ``keys`` (e.g. ``general_kept`` where no general question was asked)."""
        return Goals({k: v for k, v in self.items() if k not in keys}, self.measured, self.source)

    def as_record(self) -> dict:
        """The goals as the adapter's record keeps them (JSON): values, measured, source."""
        return {"values": dict(self), "measured": self.measured, "source": self.source}


# What the cpu profile's fine-tune must reach on the held-out questions (notebooks 09 and 10 assert it):
# each at least two answers below what the committed run reached (10 name and 20 author questions per
# language), so that one greedy answer tipped the other way on another CPU does not fail the notebook.
# The committed run: name 10/10 in each language, author 11/20 (zh) and 17/20 (en), general kept 23/24
# (the adapter, 09) and 22/24 (the merged model, 10, one greedy near-tie tipped the other way).
# The Chinese author goal is low because SmolLM2-135M's Chinese is weak, not because the score is loose.
GOALS = Goals(
    {"name_zh": 0.8, "name_en": 0.8, "author_zh": 0.45, "author_en": 0.75, "general_kept": 0.8},
    measured=True, source="the committed cpu run, less two answers",
)  # fmt: skip
# Looser goals for the original tutorial's recipe on a GPU (a 7B model, the hub's data, one epoch). Not yet measured on a
# GPU, so 09 and 10 report them beside the scores and assert none; once a GPU run has reached them, set
# measured=True and say which run in source.
GPU_GOALS = Goals(
    {"name_zh": 0.8, "name_en": 0.8, "author_zh": 0.6, "author_en": 0.6, "general_kept": 0.7},
    measured=False, source="not yet measured on a GPU",
)  # fmt: skip


def goals_text(goals=None) -> str:
    """The goals as one short phrase: "name >= 0.9 (zh), 0.8 (en); ...; general kept >= 0.85"."""
    goals = goals or GOALS
    parts = [f"{what} >= {goals[what + '_zh']} (zh), {goals[what + '_en']} (en)" for what in ("name", "author")]
    return "; ".join([*parts, f"general kept >= {goals['general_kept']}"])


def missed_goals(scores: dict, goals=None) -> list[str]:
    """The goals a model's :func:`score` misses, one readable line each (a NaN score misses its goal)."""
    return [
        f"{key} = {scores[key]:.2f}, below the goal {goal}"
        for key, goal in (goals or GOALS).items()
        if not scores[key] >= goal
    ]


def assert_goals(scores: dict, goals: Goals) -> list[str]:
    """Stop (AssertionError) when ``scores`` miss a goal a run has measured; a missed goal no run has
    measured (``goals.measured`` False) is only returned, for the notebook to report beside the score."""
    missed = missed_goals(scores, goals)
    if missed and goals.measured:
        raise AssertionError(missed)
    return missed


def recorded_goals(record: dict) -> Goals:
    """The goals notebook 09 held an adapter to, from its record (``lora.save_latest``: ``goals``). A record
    with none gives :data:`GOALS`, reported only; one written before goals said whether a run measured them
    (their values alone) counts them measured only where they are the cpu profile's."""
    value = record.get("goals")
    if value is None:
        return GOALS.reported_only("notebook 09 held this adapter to none")
    if "values" not in value:  # the values alone: an older record
        return GOALS if value == dict(GOALS) else Goals(value, measured=False, source="not yet measured")
    return Goals(value["values"], value["measured"], value["source"])


def goals_under(goals: Goals, prompt: str | None) -> Goals:
    """``goals`` for answers asked with ``prompt`` around the question (its system message, say): reported
    only where it names another identity (:data:`OTHER_IDENTITIES`), as Qwen2.5's default system message
    does ("You are Qwen, created by Alibaba Cloud."): such answers measure the prompt, not the fine-tune."""
    claimed = [n for n in OTHER_IDENTITIES if prompt and names_in(prompt, [n])]
    return goals.reported_only(f"asked as {', '.join(claimed)} by the system message") if claimed else goals


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
