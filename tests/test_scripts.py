"""The scripts a lesson writes with ``%%writefile`` and launches with torchrun. Those on ``TAKE_AWAY`` are
meant to leave the course: each imports only torch, the standard library, other written scripts and, for
11's, the library its lesson teaches; each runs under plain ``torchrun`` in an empty folder holding nothing
but itself and the scripts it imports, and writes its own ``results/rank<N>.json``."""

import ast
import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
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
    "collectives.py": (2, []),
    "ring_by_hand.py": (2, ["--largest-mib", "1", "--repeats", "2"]),
    "inside_construction.py": (2, []),
    "inside_buckets.py": (2, ["--caps", "0.1", "1"]),
    "inside_collectives.py": (2, []),
    "inside_optimizers.py": (2, ["--steps", "3"]),
    "inside_precision.py": (2, []),
    "inside_overlap.py": (2, ["--width", "32", "--depth", "2", "--batch", "4", "--iters", "2", "--timeline-mb", "0.01",
                              "--sweep-caps", "0.01", "1"]),
    "lab_overlap.py": (2, ["--width", "32", "--depth", "2", "--batch", "4", "--iters", "2", "--timeline-mb", "0.01",
                           "--sizes", "4096", "65536", "--repeats", "2", "--sweep-caps", "0.01", "1"]),
    "hello_dist.py": (2, []),
    "ckpt_ddp.py": (2, ["--settings", "false:true,false:false", "--steps", "2"]),
    "sharded_train.py": (2, ["--steps", "2", "--hidden", "16", "--layers", "2", "--batch", "8"]),
}  # fmt: skip
TEACHES = {"sharded_train.py": {"deepspeed"}}  # the library a script's lesson is about, beside torch
LESSON_SCRIPTS = ("01", "02", "03", "04", "05", "06", "07")  # every script these notebooks write is one to take away...
SKELETONS = {"my_ddp_train.py"}  # ...but the start of exercise 06.3, which the learner finishes
MODULES = {"inside_common.py"}  # ...and what 04's scripts share, which runs inside each of them


def top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def siblings(name: str) -> set[str]:
    """The other written scripts ``name`` imports, and those they import in turn (file names)."""
    found, todo = set(), [name]
    while todo:
        for module in top_level_imports(SCRIPTS[todo.pop()]):
            if f"{module}.py" in SCRIPTS and f"{module}.py" not in found | {name}:
                found.add(f"{module}.py")
                todo.append(f"{module}.py")
    return found


@functools.cache
def scripts_folder() -> Path:
    """Every written script in one folder on ``sys.path``, so that a loaded script imports the ones beside it."""
    folder = Path(tempfile.mkdtemp(prefix="course-scripts-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for name, text in SCRIPTS.items():
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder))
    return folder


def load_script(name: str) -> types.ModuleType:
    """A written script as a module, its ``__main__`` block not run: for unit tests of its functions."""
    scripts_folder()
    module = types.ModuleType(name.removesuffix(".py"))
    module.__file__ = name
    exec(compile(SCRIPTS[name], name, "exec"), module.__dict__)
    return module


def test_the_take_away_list_names_real_scripts():
    assert set(TAKE_AWAY) <= set(SCRIPTS), sorted(set(TAKE_AWAY) - set(SCRIPTS))


def test_every_script_of_the_ddp_lessons_is_one_to_take_away():
    lessons = set()
    for notebook in sorted((paths.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if notebook.name[:2] in LESSON_SCRIPTS:
            for cell in nbformat.read(notebook, as_version=4).cells:
                if cell.cell_type == "code" and cell.source.startswith("%%writefile"):
                    lessons.add(cell.source.partition("\n")[0].split("/")[-1].strip())
    assert len(lessons) > 10
    assert lessons - SKELETONS - MODULES <= set(TAKE_AWAY), sorted(lessons - SKELETONS - MODULES - set(TAKE_AWAY))


@pytest.mark.parametrize("name", sorted(TAKE_AWAY))
def test_a_take_away_script_runs_under_plain_torchrun(name, tmp_path):
    """The script and the scripts it imports, alone in a folder; nothing of the course on the path."""
    for script in {name} | siblings(name):
        outside = top_level_imports(SCRIPTS[script]) - set(sys.stdlib_module_names) - {"torch"}
        outside -= {f.removesuffix(".py") for f in SCRIPTS} | TEACHES.get(script, set())
        assert not outside, (f"{script} imports {sorted(outside)}: a script to take away uses torch, the standard "
                             "library, other written scripts and the library its lesson teaches")  # fmt: skip
        (tmp_path / script).write_text(SCRIPTS[script])
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_") and k != "PYTHONPATH"}
    torchrun = Path(sys.executable).parent / "torchrun"
    ranks, args = TAKE_AWAY[name]
    command = [str(torchrun), "--nproc-per-node", str(ranks), "--master-port", str(free_port()), name, *args]
    done = subprocess.run(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(ranks):
        json.loads((tmp_path / "results" / f"rank{rank}.json").read_text())


def test_a_script_takes_along_the_scripts_it_imports_and_nothing_else():
    assert siblings("lab_overlap.py") == {"inside_overlap.py", "inside_common.py"}
    assert siblings("inside_overlap.py") == {"inside_common.py"}
    assert siblings("inside_common.py") == set()


def test_a_later_lesson_writes_a_script_from_the_lesson_that_teaches_it(tmp_path):
    """07's lab imports 04's timing model: it writes 04's script from 04's own cell, so 07 also runs alone."""
    written = paths.script_from_lesson(tmp_path, "inside_overlap.py", "04")
    assert written == tmp_path / "inside_overlap.py"
    assert written.read_text().rstrip("\n") == SCRIPTS["inside_overlap.py"].rstrip("\n")
    with pytest.raises(ValueError, match="writes no script named nothing.py"):
        paths.script_from_lesson(tmp_path, "nothing.py", "04")
    with pytest.raises(ValueError, match="there is no notebook 99"):
        paths.script_from_lesson(tmp_path, "inside_overlap.py", "99")


def test_tiny_ddps_own_bucket_rule_packs_as_torch_does():
    """05's TinyDDP script packs its buckets with its own `bucket_assignment`: the same buckets as torch's
    `dist._compute_bucket_assignment_by_size` on the issue's sizes, mixed dtypes, a first cap and random mixes."""
    import random

    import torch
    import torch.distributed as dist

    tree = ast.parse(SCRIPTS["tiny_ddp.py"])  # the script trains at module level: take the one function alone
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bucket_assignment")
    space = {}
    exec(compile(ast.Module([node], type_ignores=[]), "tiny_ddp.py", "exec"), space)
    rule = space["bucket_assignment"]
    f32, f64, f16 = torch.float32, torch.float64, torch.float16
    cases = [
        ([40, 120, 20, 200, 4, 400], [f32] * 6, 100, 100),  # 3 buckets, not the 6 of "close before overflow"
        ([40, 120, 20, 200, 4, 400], [f32] * 6, 100, 1000),
        ([400, 4, 4, 4, 4], [f32] * 5, 100, 8),
        ([40, 80, 80, 40, 12, 8, 16], [f32, f64, f32, f64, f32, f16, f64], 60, 10),
    ]
    rng = random.Random(7)
    for _ in range(30):
        dtypes = [rng.choice([f32, f64, f16]) for _ in range(rng.randint(1, 12))]
        cases.append(([rng.choice([2, 6, 100, 1400, 8000]) * t.itemsize for t in dtypes], dtypes, 4000, rng.choice([400, 4000])))
    for sizes, dtypes, cap, first_cap in cases:
        tensors = [torch.empty(size // t.itemsize, dtype=t) for size, t in zip(sizes, dtypes, strict=True)]
        torchs = dist._compute_bucket_assignment_by_size(tensors, [first_cap, cap])[0]
        assert rule(tensors, cap, first_cap) == torchs, (sizes, dtypes, cap, first_cap)


def test_04s_buffer_sync_option_is_the_one_the_installed_ddp_has():
    """forward_sync_buffers is new in torch 2.13; on the 2.6-2.12 a GPU image may keep, broadcast_buffers=False
    stops the same per-forward broadcast (and a TypeError would stop the script)."""
    script = load_script("inside_collectives.py")
    assert script.no_forward_sync() == {"forward_sync_buffers": False}  # the locked torch

    def ddp_before_2_13(module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True, **rest):
        raise AssertionError("not built here")

    script.DDP = ddp_before_2_13
    assert script.no_forward_sync() == {"broadcast_buffers": False}
