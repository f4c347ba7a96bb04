"""Dead code in the course's Python: vulture over helpers/ and course/, the notebooks' code counted as a user.

Usage: python scripts/deadcode.py [PATH ...]   (default: helpers course)

vulture reads helpers/, course/, scripts/ (make's own scripts use helpers too), conftest.py (a test session's
guard, course/snapshots.py, is course tooling), the code cells of the English
notebooks (written to a temporary folder: one file per notebook, one per ``%%writefile`` script, since the
notebooks use helpers by name) and tests/deadcode_allowlist.py, the names vulture cannot see used, each with
why. Tests do not count as a user: code that only a test uses belongs in the tests. What is unused in the
given paths is printed, one line each, and the exit status is then 1.
"""

import json
import re
import sys
import tempfile
from pathlib import Path

import vulture

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / "tests" / "deadcode_allowlist.py"
DEFAULT_PATHS = ("helpers", "course")
READ = ("helpers", "course", "scripts", "conftest.py")  # always read, whichever paths are checked
MIN_CONFIDENCE = 60
IGNORE_DECORATORS = ["@checker"]  # an exercise's checker is found through its registration, never by name
MAGIC = re.compile(r"^(\s*)[%!]")  # an IPython line magic or shell escape: not Python
MAGIC_EXPRESSION = re.compile(r"\{([^{}]+)\}")  # %%writefile {paths.from_here(SCRIPTS)}/x.py: Python inside


def notebook_code(folder: Path) -> None:
    """Write the code cells of notebooks/[0-9]*.ipynb into ``folder``: the Python files vulture reads."""
    for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        cells, scripts = [], {}
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            first, _, body = source.partition("\n")
            if first.startswith("%%writefile"):
                scripts[first.split("/")[-1].strip()] = body
                cells += MAGIC_EXPRESSION.findall(first)
            else:
                cells.append("\n".join(MAGIC.sub(r"\1pass  # ", line) for line in source.splitlines()))
        files = {f"{notebook.stem}.py": "\n\n".join(cells)}
        files.update({f"{notebook.stem}__{name}": text for name, text in scripts.items()})
        for name, text in files.items():
            (folder / name).write_text(text + "\n", encoding="utf-8")


def findings(paths: list[str]) -> list[str]:
    """vulture's lines for what is unused in ``paths`` (relative to the repository)."""
    checked = [(ROOT / p).resolve() for p in paths]
    read = sorted({str(p) for p in checked} | {str(ROOT / p) for p in READ})
    with tempfile.TemporaryDirectory(prefix="deadcode-") as tmp:
        notebook_code(Path(tmp))
        dead = vulture.Vulture(ignore_decorators=IGNORE_DECORATORS)
        dead.scavenge([*read, tmp, str(ALLOWLIST)])
        if dead.exit_code == vulture.core.ExitCode.InvalidInput:  # vulture has printed which file and why
            sys.exit("deadcode: vulture could not read a file (above), so it may have missed a use; fix it first.")
        lines = []
        for item in dead.get_unused_code(min_confidence=MIN_CONFIDENCE, sort_by_size=False):
            path = Path(item.filename).resolve()
            if any(path == p or p in path.parents for p in checked):
                lines.append(item.get_report(add_size=False).replace(f"{ROOT}/", ""))
        return lines


def main(argv: list[str]) -> int:
    paths = argv or list(DEFAULT_PATHS)
    found = findings(paths)
    for line in found:
        print(line)
    where = " ".join(paths)
    if found:
        print(f"deadcode: {len(found)} unused in {where}: remove it, move what only a test uses into tests/, or "
              f"name a false positive in {ALLOWLIST.relative_to(ROOT)} with why.")
        return 1
    print(f"deadcode: nothing unused in {where}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
