"""The install of a GPU image, run as far as a machine without a GPU can (docs/gpu.md). Two ways:

- a fresh copy of the course whose .venv already holds a torch (standing in for a CUDA build you
  installed), then ``COURSE_KEEP_TORCH=1 make setup``;
- a fresh copy with no .venv and ``PYTHON=`` an image's interpreter that holds a torch (a temporary venv
  standing in for a ModelScope notebook's Python): set-up makes .venv on it, sees that torch and installs
  the rest into .venv alone, leaving the image's site-packages as they were.

Everything but the CUDA build itself runs for real. Both set the Jupyter data folder to a temporary one
(set-up registers a kernel there) and skip compiling to bytecode (COURSE_COMPILE_BYTECODE=0: 40 s more
each on 2 cores, and not what these tests are about). The first then goes on as a learner would, with
`make run`, `make lab` and `make setup` and no COURSE_KEEP_TORCH: each must leave that torch where it is,
and installs the learner's group only; then as a maintainer, with the development group beside that torch;
until `COURSE_KEEP_TORCH=0 make setup` asks for the lock's.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import environment, launching, paths

UV = str(paths.ROOT / ".venv" / "bin" / "uv")
PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
DEV_ONLY = ("pytest", "ruff", "jupyterhub", "sphinx", "vulture")  # a few of the development group's packages


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


def stand_in_for_a_cuda_build(site: Path) -> str:
    """Relabel the torch in ``site`` as ``<release>+standin``: like a CUDA build's (2.13.0+cu130), its version
    string is not the lock's (2.13.0+cpu), so installing the lock would replace it. uv installs by hard link
    from its cache: each file changed here is written anew and moved over the old one, never edited in place."""
    [dist] = site.glob("torch-*.dist-info")
    old = dist.name.removeprefix("torch-").removesuffix(".dist-info")
    new = f"{old.split('+')[0]}+standin"
    for path, before, after in (
        (dist / "METADATA", f"Version: {old}\n", f"Version: {new}\n"),
        (dist / "RECORD", f"torch-{old}.dist-info/", f"torch-{new}.dist-info/"),
        (site / "torch" / "version.py", f"__version__ = '{old}'", f"__version__ = '{new}'"),
    ):
        text = path.read_text()
        assert before in text, f"{path} no longer holds {before!r}"
        fresh = path.with_name(path.name + ".new")
        fresh.write_text(text.replace(before, after))
        os.replace(fresh, path)
    dist.rename(site / f"torch-{new}.dist-info")
    return new


def torch_state(python: Path) -> tuple:
    """The torch ``python`` imports: its version, its file, and the inode and mtime of its version.py (the
    file the stand-in rewrote: a reinstall brings back another)."""
    done = subprocess.run(
        [python, "-c", "import os, torch; v = os.path.join(os.path.dirname(torch.__file__), 'version.py'); "
                       "s = os.stat(v); print(torch.__version__, torch.__file__, s.st_ino, s.st_mtime_ns)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return tuple(done.stdout.split())


def make_lab_until_it_serves(repo: Path, env: dict[str, str], timeout: float = 180) -> str:
    """`make lab` as a learner runs it (its set-up first, then JupyterLab), stopped once JupyterLab serves:
    what it printed."""
    port = launching.free_port()
    log = repo.parent / "make-lab.log"
    with log.open("w") as out:
        lab = subprocess.Popen(["make", "lab", f"LAB_PORT={port}"], cwd=repo, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while f"127.0.0.1:{port}/" not in log.read_text() and lab.poll() is None:
            assert time.monotonic() < deadline, (
                f"make lab did not serve within {timeout} s:\n{log.read_text()}"
            )
            time.sleep(0.5)
        assert lab.poll() is None, f"make lab stopped (exit {lab.returncode}):\n{log.read_text()}"
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait()
    return log.read_text()


def has(python: Path, *packages: str) -> dict[str, bool]:
    """Whether each package is installed in ``python``'s environment."""
    done = subprocess.run(
        [python, "-c", "import sys, importlib.metadata as m\nfor p in sys.argv[1:]:\n"
                       "    try: m.version(p); print(p, True)\n    except m.PackageNotFoundError: print(p, False)",
         *packages],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {name: said == "True" for name, said in (line.split() for line in done.stdout.splitlines())}


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


def test_keep_torch_setup_installs_the_rest_and_every_later_setup_keeps_that_torch(pristine, tmp_path):
    repo = course_copy(pristine, tmp_path)
    python = repo / ".venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(repo / ".venv")], check=True)  # as docs/gpu.md says
    # with its dependencies, as `pip install torch` leaves them: set-up adds the rest with --no-deps, and the
    # make run below builds a model, which imports torch.fx and so sympy
    install_torch(python, importable=True)
    torch_version = stand_in_for_a_cuda_build(purelib(python))
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

    # Later, without COURSE_KEEP_TORCH: `make run`, `make lab` and `make setup` each run set-up first, and
    # each keeps that torch, saying so in one line, without installing anything again.
    kept = torch_state(python)
    assert kept[0] == torch_version
    later = setup_env(tmp_path, COURSE_BUILD_DIR=str(tmp_path / "build"), JUPYTER_RUNTIME_DIR=str(tmp_path / "run"),
                      JUPYTER_CONFIG_DIR=str(tmp_path / "config"))  # fmt: skip
    del later["COURSE_KEEP_TORCH"]
    keeping = "setup: keeping the torch in .venv"
    run = subprocess.run(["make", "run", "ONLY=00", "PROFILE=smoke"], cwd=repo, env=later, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert torch_state(python) == kept, "make run replaced the kept torch:\n" + run.stdout[-3000:]
    said = [line for line in run.stdout.splitlines() if line.startswith("setup: ")]
    assert len(said) == 2 and said[0].startswith(keeping) and "nothing to install" in said[1], said
    lab = make_lab_until_it_serves(repo, later)
    assert torch_state(python) == kept, "make lab replaced the kept torch:\n" + lab[-3000:]
    assert keeping in lab and "nothing to install" in lab, lab[-3000:]
    again = subprocess.run(["make", "setup"], cwd=repo, env=later, capture_output=True, text=True)
    assert again.returncode == 0 and torch_state(python) == kept, again.stdout + again.stderr
    assert keeping in again.stdout and "nothing to install" in again.stdout, again.stdout
    assert not any(has(python, *DEV_ONLY).values()), "the learner's set-up installed the development group"

    # A maintainer's target (make lint, make test) installs the development group beside that torch; the
    # learner's set-ups after it keep that group.
    dev = subprocess.run(["make", "setup", "GROUP=dev"], cwd=repo, env=later, capture_output=True, text=True)
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert torch_state(python) == kept, "the development group's set-up replaced the kept torch:\n" + dev.stdout
    assert "that requirements-lock-dev.txt adds (the development group)" in dev.stdout, dev.stdout
    assert all(has(python, *DEV_ONLY).values()), dev.stdout
    learner = subprocess.run(["make", "setup"], cwd=repo, env=later, capture_output=True, text=True)
    assert learner.returncode == 0 and "nothing to install" in learner.stdout, learner.stdout + learner.stderr
    assert all(has(python, *DEV_ONLY).values()) and torch_state(python) == kept

    # Only when asked: COURSE_KEEP_TORCH=0 installs the lock, its CPU torch included, and forgets the kept one.
    replaced = subprocess.run(["make", "setup"], cwd=repo, env={**later, "COURSE_KEEP_TORCH": "0"},
                              capture_output=True, text=True)  # fmt: skip
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    lock_torch = environment.read_lock()["torch"]["version"]
    assert torch_state(python)[0] == lock_torch, replaced.stdout
    assert all(has(python, *DEV_ONLY).values()), "the venv lost the development group:\n" + replaced.stdout
    plain = subprocess.run(["make", "setup"], cwd=repo, env=later, capture_output=True, text=True)
    assert plain.returncode == 0 and keeping not in plain.stdout and "nothing to install" in plain.stdout, (
        plain.stdout + plain.stderr
    )


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


def test_setup_keeps_a_cuda_torch_it_finds_in_a_venv_without_the_mark(tmp_path):
    """A .venv that holds a CUDA build of torch (its torch/version.py names a CUDA) but was not set up with
    COURSE_KEEP_TORCH=1 (the learner pip-installed it, then ran `make run`): set-up keeps that torch and says
    why; with a CPU build it says nothing and goes on to install the lock. A COURSE_KEEP_TORCH other than 0
    or 1 is refused in one line. The stand-in .venv's python answers only the version question, so set-up
    stops soon after (installing uv), having said what it chose."""
    repo = tmp_path / "course"
    for name in ("requirements.txt", "requirements-nodeps.txt", environment.LOCK, environment.LOCK_NO_TORCH,
                 "pyproject.toml", "scripts/setup.sh", "scripts/uv.sh"):  # fmt: skip
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(paths.ROOT / name, repo / name)
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        '#!/bin/sh\ncase "$*" in *importlib.metadata*) echo 2.13.0+cu130 ;; *) exit 3 ;; esac\n'
    )
    (bin_dir / "python").chmod(0o755)
    version_py = repo / ".venv" / "lib" / "python3.11" / "site-packages" / "torch" / "version.py"
    version_py.parent.mkdir(parents=True)
    env = {key: value for key, value in os.environ.items() if key != "COURSE_KEEP_TORCH"}

    def setup(**extra: str) -> list[str]:
        done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env={**env, **extra}, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode != 0  # the stand-in python cannot install uv
        return done.stdout.splitlines()

    version_py.write_text("__version__ = '2.13.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n")
    said = setup()
    assert said[0] == (
        "setup: keeping the torch in .venv, torch 2.13.0+cu130: it is a CUDA 13.0 build, which the lock's CPU "
        "torch would replace; COURSE_KEEP_TORCH=0 make setup replaces it with the lock's CPU build."
    ), said
    assert not any("keeping" in line for line in setup(COURSE_KEEP_TORCH="0"))  # asked for the lock's
    version_py.write_text("__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\n")
    assert not any("keeping" in line for line in setup())
    refused = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env={**env, "COURSE_KEEP_TORCH": "yes"},
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and refused.stdout.startswith(
        "setup: COURSE_KEEP_TORCH=yes: 1 keeps the torch"
    )
    assert len(refused.stdout.splitlines()) == 1


def test_a_venv_left_without_pip_by_a_stopped_setup_gets_pip_back(tmp_path):
    """Set-up stopped (Ctrl-C, a killed job) while `python -m venv` was putting pip in leaves .venv/bin/python
    without pip; the next set-up puts pip back and goes on, where it used to stop on "No module named pip"."""
    repo = tmp_path / "course"
    for name in (environment.LOCK, "scripts/uv.sh"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(paths.ROOT / name, repo / name)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(repo / ".venv")], check=True)
    done = subprocess.run(["bash", "scripts/uv.sh"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "putting it back with ensurepip" in done.stderr and done.stdout.strip() == ".venv/bin/uv"
    assert subprocess.run([repo / ".venv" / "bin" / "uv", "--version"], capture_output=True).returncode == 0


def test_run_and_lab_set_up_the_learners_group_and_the_maintainers_targets_everything():
    """What each target's set-up installs: the learner's lock for run and lab, the development lock (the tests',
    linters', site's and hub's packages as well) for the targets that need them."""
    said = {}
    for target in ("run", "lab", "setup", "test", "lint", "unit", "notebooks", "book", "zh", "hub", "student",
                   "webui-shot"):  # fmt: skip
        done = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=paths.ROOT, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        groups = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("bash scripts/setup.sh")]
        said[target] = groups[0] if groups else "no set-up"
    assert {target for target, group in said.items() if group == "learner"} == {"run", "lab", "setup"}, said
    assert set(said.values()) == {"learner", "dev"}, said
