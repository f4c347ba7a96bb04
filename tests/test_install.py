"""The install of a GPU image, run as far as a machine without a GPU can: a fresh copy of the course whose
.venv already holds a torch (standing in for the image's CUDA build), then ``COURSE_KEEP_TORCH=1 make
setup`` (README, "On GPUs"). Everything but the CUDA build itself runs for real."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import environment, paths


def test_keep_torch_setup_installs_the_rest_and_leaves_the_images_torch_alone(tmp_path):
    repo = tmp_path / "course"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=paths.ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (paths.ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.ROOT / name, repo / name)
    uv = str(paths.ROOT / ".venv" / "bin" / "uv")
    python = repo / ".venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(repo / ".venv")], check=True)  # as the README says
    torch_version = environment.installed("torch")
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), "--no-deps", f"torch=={torch_version}",
         "--index-strategy", "unsafe-best-match", *environment.uv_sources()],
        check=True,
    )  # fmt: skip
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    marker = site / "torch" / "IMAGE_BUILD"  # a file only the image's own torch has
    marker.write_text("the image's torch\n")
    env = {
        **os.environ,
        "COURSE_KEEP_TORCH": "1",
        "COURSE_CPU_KERNEL": "0",
    }  # the kernel: 45 s, not this path
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"setup: keeping torch {torch_version}." in done.stdout
    assert (
        "requirements-lock-no-torch.txt" in done.stdout
        and "kernel skipped (COURSE_CPU_KERNEL=0)" in done.stdout
    )
    assert marker.is_file(), "setup replaced the torch that was already in .venv"
    check = subprocess.run(
        [python, "-c", "import deepspeed, swift, torch, transformers; from helpers import environment; "
                       "print(torch.__version__, environment.check_torch() or 'in range')"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    assert (
        check.stdout.strip().splitlines()[-1].split()[0] == torch_version
    )  # the last line: deepspeed logs first
