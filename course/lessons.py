"""The course's notebooks in order, their titles, and the time each may take: its budget and the cell timeout.

A budget is what the run report compares a notebook's wall time against; the cell timeout is where the runner
stops a cell. tests/test_lessons.py holds both to the notebooks: every notebook has a budget, and the cell
timeout of each profile is longer than every launch timeout a cell asks for on it.
"""

from __future__ import annotations

from pathlib import Path

from helpers import paths

# Seconds one cell may run, by profile: longer than the longest launch timeout a cell gives on that profile
# (notebook 09: 600 s on cpu, 240 s on smoke, 3600 s on gpu), so that a launch's own timeout, which names the
# job and prints its last lines, always fires first.
CELL_TIMEOUT = {"cpu": 1200, "smoke": 600, "gpu": 7200}
# Wall-time budgets in seconds per notebook number and profile; the report compares against them.
BUDGETS = {
    "00": {"cpu": 30, "smoke": 30},
    "01": {"cpu": 120, "smoke": 30},
    "02": {"cpu": 120, "smoke": 30},
    "03": {"cpu": 60, "smoke": 30},
    "04": {"cpu": 120, "smoke": 45},
    "05": {"cpu": 90, "smoke": 45},
    "06": {"cpu": 180, "smoke": 45},
    "07": {"cpu": 150, "smoke": 45},  # the network lab: one launch per link rate
    "08": {"cpu": 60, "smoke": 60},
    "09": {"cpu": 300, "smoke": 60},  # the fine-tune: 5 minutes; 10-12 2 minutes each
    "10": {"cpu": 120, "smoke": 60},
    "11": {"cpu": 120, "smoke": 60},
    "12": {"cpu": 120, "smoke": 60},
}
COURSE_BUDGET = {"cpu": 15 * 60}  # every notebook in `make run`, set-up excluded


def course_notebooks(only=None) -> list[Path]:
    """notebooks/NN_*.ipynb in course order, optionally only those whose number is in ``only``."""
    found = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [nb for nb in found if nb.name[:2] in {o.zfill(2) for o in only}]
    return found


def title_of(notebook: dict) -> str:
    """The notebook's title: its first markdown heading of level 1 (``# NN · Title``), without the ``#``."""
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""

