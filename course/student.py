"""Student notebooks (`make student`): the course without its solutions, ready to hand out.

Each notebook of both editions is copied into build/student/ (English) and build/student/zh/ (Chinese) with
every cell tagged ``solution`` removed and every code cell's outputs cleared, as nbgrader's
``generate_assignment`` does: a learner runs the copy and sees their own results, and no exercise shows
its reference answer. The exercise cells stay as they are (a placeholder and the checker's call).

A copy someone has edited since it was written is never replaced: the run stops and names it.
"""

import hashlib
import json
import sys
from pathlib import Path

import nbformat

from course.runner import course_notebooks
from helpers import paths
from helpers.errors import CourseError

SOLUTION_TAG = "solution"
MANIFEST = ".written.json"  # sha256 of each notebook this module wrote, to tell an edited copy from its own


def is_solution(cell) -> bool:
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def student_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` without its solution cells, every output cleared and the recorded run's metadata left out."""
    copy = nbformat.from_dict(json.loads(json.dumps(nb)))
    copy.cells = [cell for cell in copy.cells if not is_solution(cell)]
    for cell in copy.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for key in ("course_run", "widgets", "papermill"):
        copy.metadata.pop(key, None)
    return copy


def editions() -> list[tuple[Path, str]]:
    """(source notebook, folder under build/student/) for each notebook of each edition, in course order."""
    english = course_notebooks()
    chinese = [paths.NOTEBOOKS / "zh" / nb.name for nb in english]
    missing = [paths.relative(nb) for nb in chinese if not nb.exists()]
    if missing:
        raise CourseError(f"{', '.join(missing)} missing: run `make zh` first to build the Chinese edition.")
    return [(nb, "") for nb in english] + [(nb, "zh") for nb in chinese]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(out: Path | None = None) -> list[Path]:
    """Write every student notebook under ``out`` (build/student/ by default); returns their paths."""
    out = Path(out) if out else paths.build_dir() / "student"
    manifest_path = out / MANIFEST
    written = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    jobs = [(source, out / folder / source.name) for source, folder in editions()]
    for _, target in jobs:  # check every copy before writing any
        key = str(target.relative_to(out))
        if target.exists() and written.get(key) != _digest(target):
            raise CourseError(
                f"{paths.relative(target)} was changed after `make student` wrote it: move it elsewhere "
                f"(it may hold someone's work), then run `make student` again."
            )
    for source, target in jobs:
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(student_copy(nbformat.read(source, as_version=4)), target)
        written[str(target.relative_to(out))] = _digest(target)
    manifest_path.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return [target for _, target in jobs]


def main() -> int:
    try:
        written = write()
    except CourseError as exc:
        print(f"make student: {exc}", file=sys.stderr)
        return 1
    folders = sorted({paths.relative(p.parent) for p in written})
    print(f"{len(written)} student notebooks, without solutions or outputs, in {' and '.join(folders)}.")
    print("Hand these out; the exercise checkers run in them as in the course's own notebooks.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
