"""Where things live: the repository, its notebooks, and build/ for everything a run produces."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def build_dir() -> Path:
    """The folder a run writes to: ``$COURSE_BUILD_DIR`` or ``build/`` in the repository."""
    return Path(os.environ.get("COURSE_BUILD_DIR", ROOT / "build")).resolve()


def models_dir() -> Path:
    """Converted and generated models are kept here and reused across runs."""
    return Path(os.environ.get("COURSE_MODELS_DIR", ROOT / "build" / "models")).resolve()


def run_dir(*parts: str) -> Path:
    """A folder under build/ for one kind of output, created on first use."""
    path = build_dir().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def outputs_dir() -> Path:
    """Where what a learner trains lives (adapters, checkpoints, merged models); `make clean` keeps it."""
    return Path(os.environ.get("COURSE_OUTPUTS_DIR", ROOT / "build" / "outputs")).resolve()


def new_output_dir(name: str) -> Path:
    """A fresh, numbered folder ``build/outputs/<name>/vN``: an earlier run is never overwritten."""
    parent = outputs_dir() / name
    parent.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[1:]) for p in parent.glob("v*") if p.name[1:].isdigit()]
    number = max(taken, default=0) + 1
    while True:
        folder = parent / f"v{number}"
        try:
            folder.mkdir()  # fails if another run took this number first
            return folder
        except FileExistsError:
            number += 1
