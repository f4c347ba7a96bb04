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
