"""The scripts a lesson writes with ``%%writefile`` and launches with torchrun. Those on ``TAKE_AWAY`` are
meant to leave the course: each imports torch and the standard library only, runs under plain ``torchrun``
in an empty folder with nothing of the course around it, and writes its own ``results/rank<N>.json``."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import paths
from helpers.launching import free_port


def written_scripts() -> dict[str, str]:
    """Every ``%%writefile`` script of the English notebooks: file name -> its source."""
    found = {}
    for notebook in sorted((paths.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(notebook, as_version=4).cells:
            first, _, body = cell.source.partition("\n")
            if cell.cell_type == "code" and first.startswith("%%writefile"):
                found[first.split("/")[-1].strip()] = body
    return found


SCRIPTS = written_scripts()
# name -> (ranks, the arguments of a small run: seconds on a CPU)
TAKE_AWAY: dict[str, tuple[int, list[str]]] = {
    "ddp_train.py": (2, ["--batch", "8", "--steps", "2", "--out", "w.pt", "--inputs=8", "--width=16", "--depth=2",
                         "--classes=4"]),
    "tiny_ddp.py": (3, ["--parts", "check", "--backend", "gloo"]),
    "ddp_practice.py": (2, ["--samples", "64", "--hidden", "32", "--batch", "8", "--epochs", "2"]),
    "ddp_settings.py": (2, ["--steps", "4"]),
    "collectives_and_ring.py": (2, ["--largest-mib", "1", "--repeats", "2"]),
    "inside_construction.py": (2, []),
    "inside_buckets.py": (2, ["--caps", "0.1", "1"]),
    "inside_collectives.py": (2, []),
    "inside_optimizers.py": (2, ["--steps", "3"]),
}  # fmt: skip


def top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_take_away_list_names_real_scripts():
    assert set(TAKE_AWAY) <= set(SCRIPTS), sorted(set(TAKE_AWAY) - set(SCRIPTS))


@pytest.mark.parametrize("name", sorted(TAKE_AWAY))
def test_a_take_away_script_runs_under_plain_torchrun(name, tmp_path):
    outside = top_level_imports(SCRIPTS[name]) - set(sys.stdlib_module_names) - {"torch"}
    assert not outside, f"{name} imports {sorted(outside)}: a script to take away uses torch and the standard library"
    (tmp_path / name).write_text(SCRIPTS[name])
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_") and k != "PYTHONPATH"}
    torchrun = Path(sys.executable).parent / "torchrun"
    ranks, args = TAKE_AWAY[name]
    command = [str(torchrun), "--nproc-per-node", str(ranks), "--master-port", str(free_port()), name, *args]
    done = subprocess.run(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(ranks):
        json.loads((tmp_path / "results" / f"rank{rank}.json").read_text())
