"""The install of a GPU image, run as far as a machine without a GPU can (docs/gpu.md). Two ways:

- a fresh copy of the course whose .venv already holds a torch (standing in for a CUDA build you
  installed), then ``COURSE_KEEP_TORCH=1 make setup``;
- a fresh copy with no .venv and ``PYTHON=`` an image's interpreter that holds a torch (a temporary venv
  standing in for a ModelScope notebook's Python): set-up makes .venv on it, sees that torch and installs
  the rest into .venv alone, leaving the image's site-packages as they were.

Everything but the CUDA build itself runs for real. Both set the Jupyter data folder to a temporary one
(set-up registers a kernel there) and skip compiling to bytecode (COURSE_COMPILE_BYTECODE=0: 40 s more
each on 2 cores, and not what these tests are about).
"""

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import environment, paths

UV = str(paths.ROOT / ".venv" / "bin" / "uv")
PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The course as git sees it (tracked and untracked, not ignored files), copied once for the module."""
    repo = tmp_path_factory.mktemp("pristine") / "course"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=paths.ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (paths.ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.ROOT / name, repo / name)
    return repo


def course_copy(pristine: Path, tmp_path: Path) -> Path:
    repo = tmp_path / "course"
    shutil.copytree(pristine, repo, symlinks=True)
    return repo


def what_torch_imports() -> list[str]:
    """torch's dependencies, all the way down, at the versions of this venv: ``name==version`` each."""
    pinned: dict[str, str] = {}
    todo = [Requirement(line) for line in metadata.requires("torch") or []]
    while todo:
        wanted = todo.pop()
        if wanted.marker is not None and not wanted.marker.evaluate({"extra": ""}):
            continue
        try:
            dist = metadata.distribution(wanted.name)
        except metadata.PackageNotFoundError:
            continue
        if dist.metadata["Name"] not in pinned:
            pinned[dist.metadata["Name"]] = dist.version
            todo += [Requirement(line) for line in dist.requires or []]
    return [f"{name}=={version}" for name, version in sorted(pinned.items())]


def install_torch(python: Path, importable: bool = False) -> str:
    """This venv's torch, installed into ``python``'s environment with uv as set-up would find it; with
    ``importable``, its dependencies too (as an image's torch has them), each pinned, still ``--no-deps``."""
    version = environment.installed("torch")
    subprocess.run(
        [UV, "pip", "install", "--quiet", "--python", str(python), "--no-deps", f"torch=={version}",
         *(what_torch_imports() if importable else []),
         "--index-strategy", "unsafe-best-match", *environment.uv_sources()],
        check=True,
    )  # fmt: skip
    return version


def purelib(python: Path) -> Path:
    done = subprocess.run([python, "-c", PURELIB], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def setup_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "COURSE_KEEP_TORCH": "1",
        "COURSE_CPU_KERNEL": "0",  # the kernel: 45 s, not this path
        "COURSE_COMPILE_BYTECODE": "0",
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"),
        **extra,
    }


def kernel_python(tmp_path: Path) -> Path:
    spec = json.loads((tmp_path / "jupyter" / "kernels" / "ddp-course" / "kernel.json").read_text())
    return Path(spec["argv"][0])


def test_keep_torch_setup_installs_the_rest_and_leaves_the_images_torch_alone(pristine, tmp_path):
    repo = course_copy(pristine, tmp_path)
    python = repo / ".venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(repo / ".venv")], check=True)  # as docs/gpu.md says
    torch_version = install_torch(python)
    marker = purelib(python) / "torch" / "IMAGE_BUILD"  # a file only the image's own torch has
    marker.write_text("the image's torch\n")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=setup_env(tmp_path), capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"setup: keeping torch {torch_version}." in done.stdout
    assert (
        "requirements-lock-no-torch.txt" in done.stdout
        and "kernel skipped (COURSE_CPU_KERNEL=0)" in done.stdout
    )
    assert marker.is_file(), "setup replaced the torch that was already in .venv"
    assert kernel_python(tmp_path) == python
    check = subprocess.run(
        [python, "-c", "import deepspeed, swift, torch, transformers; from helpers import environment; "
                       "print(torch.__version__, environment.check_torch() or 'in range')"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    assert (
        check.stdout.strip().splitlines()[-1].split()[0] == torch_version
    )  # the last line: deepspeed logs first


def test_keep_torch_without_a_venv_keeps_the_image_pythons_torch_and_installs_nothing_into_it(
    pristine, tmp_path
):
    # the image's interpreter: itself a venv, the case --system-site-packages alone would miss
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True)
    image_python = image / "bin" / "python"
    torch_version = install_torch(image_python, importable=True)  # set-up checks that the image's imports
    image_site = purelib(image_python)
    marker = image_site / "torch" / "IMAGE_BUILD"
    marker.write_text("the image's torch\n")
    before = sorted(entry.name for entry in image_site.iterdir())
    repo = course_copy(pristine, tmp_path)
    python = repo / ".venv" / "bin" / "python"

    bare = tmp_path / "bare"  # a Python 3.11 without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    refused = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True,
                             env=setup_env(tmp_path, PYTHON=str(bare / "bin" / "python")))  # fmt: skip
    assert refused.returncode != 0
    said = (refused.stdout + refused.stderr).strip().splitlines()
    assert len(said) == 1 and said[0].startswith("setup: COURSE_KEEP_TORCH=1 keeps the torch of "), said
    assert "has no torch; run it with PYTHON=" in said[0], said
    assert not (repo / ".venv").exists()

    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True,
                          env=setup_env(tmp_path, PYTHON=str(image_python)))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"keeping its torch (from {image_site})" in done.stdout, done.stdout
    assert f"setup: keeping torch {torch_version}." in done.stdout
    assert 'pick the kernel "Python 3 (ddp-course)"' in done.stdout
    assert sorted(entry.name for entry in image_site.iterdir()) == before, "setup installed into the image"
    assert marker.is_file()
    assert kernel_python(tmp_path) == python
    again = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True,
                           env=setup_env(tmp_path, PYTHON=str(image_python)))  # fmt: skip
    assert again.returncode == 0 and "nothing to install" in again.stdout, again.stdout + again.stderr

    check = subprocess.run(
        [python, "-c", "import os, sys, sysconfig, deepspeed, swift, torch, transformers; "
                       "own = sys.path.index(sysconfig.get_paths()['purelib']); "
                       "print(own, sys.path.index(os.path.dirname(os.path.dirname(torch.__file__))), "
                       "torch.__file__)"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    last = check.stdout.strip().splitlines()[-1]  # deepspeed logs first
    own, image_index, torch_file = last.split(maxsplit=2)
    assert Path(torch_file).parent == image_site / "torch" and marker.is_file()
    assert int(own) < int(image_index), ".venv's own packages must come before the image's"
