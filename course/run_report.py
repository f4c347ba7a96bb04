"""The run report: each notebook's status, wall time against its budget, peak memory and the facts it recorded.

``make run`` (and ``make gpu-check``) write it as build/report.md and build/report.json; ``make book`` writes
the Markdown one from what the committed notebooks recorded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course.lessons import COURSE_BUDGET, course_notebooks


@dataclass
class NotebookRun:
    """One notebook's run: how it ended, how long it took, what it held and recorded."""

    name: str
    title: str
    status: str = "not run"
    seconds: float = 0.0
    peak_memory_mb: float = 0.0
    metrics: list = field(default_factory=list)
    error: dict | None = None
    budget_seconds: float | None = None
    executed: str = ""


def _value(metric: dict) -> str:
    value = metric["value"]
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} {metric['unit']}".strip()


def _cell(text) -> str:
    """Text safe inside a Markdown table cell: a ``|`` would start a new column, a newline a new row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def whole_course(runs: list[NotebookRun]) -> bool:
    """Whether ``runs`` hold every notebook of the course (then the report compares their sum with the
    course's budget)."""
    return {nb.stem for nb in course_notebooks()} <= {r.name for r in runs}


def write_report(build: Path, runs: list[NotebookRun], context: dict) -> tuple[Path, Path]:
    """build/report.json (``context`` and every run) and build/report.md (a table of the runs, the whole
    course against its budget where every notebook ran, then each notebook's failure and metrics)."""
    data = {**context, "notebooks": [asdict(r) for r in runs]}
    (build / "report.json").write_text(json.dumps(data, indent=2, ensure_ascii=False))
    lines = [
        "# Run report",
        "",
        f"Profile: **{context['profile']}** · started {context['started']} · "
        f"total {context['total_seconds']:.0f} s · {sum(r.status == 'passed' for r in runs)}/{len(runs)} passed",
        "",
    ]
    for key, label in (("setup", "Set-up"), ("model", "Model")):
        if context.get(key):
            lines += [f"{label}: {context[key]}", ""]
    lines += ["| notebook | status | wall time | budget | peak memory |", "|---|---|---|---|---|"]
    for r in runs:
        budget = "-"
        if r.budget_seconds:
            budget = f"{r.budget_seconds:.0f} s {'✅' if r.seconds <= r.budget_seconds else '⚠️ over'}"
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.1f} s | {budget} | {r.peak_memory_mb:.0f} MB |")
    course_budget = COURSE_BUDGET.get(context["profile"])
    if course_budget and whole_course(runs):
        within = "within" if context["total_seconds"] <= course_budget else "OVER"
        lines += [
            "",
            f"Whole course: {context['total_seconds']:.0f} s, {within} the {course_budget} s budget.",
        ]
    for r in runs:
        lines += ["", f"## {r.name}: {r.title}", ""]
        if r.error:
            e = r.error
            what = "Interrupted" if r.status == "interrupted" else "Failed"
            lines.append(f"**{what}** in cell {e['cell']} (`{e['line']}`): {e['error']}: {e['message']}")
            lines.append("")
        if r.metrics:
            lines += ["| metric | value | note |", "|---|---|---|"]
            lines += [
                f"| {_cell(m['name'])} | {_cell(_value(m))} | {_cell(m.get('note', ''))} |" for m in r.metrics
            ]
        elif not r.error:
            lines.append("(no metrics recorded)")
    (build / "report.md").write_text("\n".join(lines) + "\n")
    return build / "report.md", build / "report.json"
