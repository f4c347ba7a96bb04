"""The runner from a checkout at a long path: a Unix socket's path holds at most 107 bytes, and a fork on
GitHub's runner already sits at /home/runner/work/<repo>/<repo>.

The checkout is a copy of helpers/ and course/ (no symlink: ``paths.ROOT`` resolves to the long path) with
a .venv of its own made of links to this one's interpreter and packages, so that the runner, its kernel and
what the kernel starts all run as ``<long path>/.venv/bin/python``, as they would from a real clone there.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from conftest import processes_mentioning
from helpers import paths

LONG = 150  # characters of the checkout's path: past every socket path the runner might make under it


def long_checkout(tmp_path: Path) -> Path:
    """A checkout at a path of at least LONG characters, with its own .venv that reuses this one."""
    stem = tmp_path / "a-checkout-at-a-long-path"
    root = Path(f"{stem}-{'x' * max(1, LONG - len(str(stem)) - 1)}")
    assert len(str(root)) >= LONG
    for part in ("helpers", "course"):
        shutil.copytree(paths.ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))  # as `python -m venv` links it
    packages = Path(sysconfig.get_paths()["purelib"])
    target = venv / packages.relative_to(sys.prefix)
    target.parent.mkdir(parents=True)
    target.symlink_to(packages)
    (venv / "share").symlink_to(Path(sys.prefix) / "share")  # nbconvert's templates, the kernel's spec
    return root


def lesson(path: Path, marker: str) -> None:
    """A tiny lesson that records a metric and leaves a process running, ``marker`` on its command line."""
    params = new_code_cell('PROFILE = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[
        new_markdown_cell("# A lesson from a long path"),
        params,
        new_code_cell("from helpers import profiles, report\nprofile = profiles.resolve(PROFILE)"),
        new_code_cell('report.record("answer", 42)'),
        new_code_cell(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}], start_new_session=True)"
        ),
    ])  # fmt: skip
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def test_the_runner_passes_a_notebook_from_a_checkout_at_a_long_path(tmp_path):
    root = long_checkout(tmp_path)
    python = root / ".venv" / "bin" / "python"
    marker = f"left-at-a-long-path-{os.getpid()}-{time.monotonic_ns()}"
    lesson(root / "notebooks" / "01_long.ipynb", marker)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)  # this checkout's helpers and course, not the editable install's
    command = [str(python), "-m", "course.runner", "run", "--profile", "smoke", "--no-progress"]
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=180)
    finally:
        for proc in processes_mentioning(marker):
            proc.kill()
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert (root / "build" / "report.json").is_file(), said
    report = json.loads((root / "build" / "report.json").read_text())
    [run] = report["notebooks"]
    assert run["status"] == "passed", (run["error"], said)
    assert [m["name"] for m in run["metrics"]] == ["answer"]
    assert done.returncode == 0, said
    assert (root / "build" / "executed" / "01_long.ipynb").is_file()
    # what the lesson left running is named, though the interpreter's path alone fills 150 characters
    assert "01_long.ipynb: 1 process(es) it left running were stopped: " in done.stdout, said
    assert marker in done.stdout, said
    assert processes_mentioning(marker) == []
