#!/usr/bin/env bash
# Create .venv and install exactly the packages of a lock, once: a second call sees nothing changed and says
# so. Nothing here resolves versions: `make lock` makes the locks from requirements.txt and
# requirements-dev.txt. Its argument names the group: `learner` (the default; `make run` and `make lab`)
# installs requirements-lock.txt, what the lessons need; `dev` (`make test`, `make lint`, `make book` and the
# other maintainers' targets) installs requirements-lock-dev.txt, the same packages at the same versions and
# those of the tests, the linters, the site and the hub beside them. .venv remembers that it has the dev
# group (.venv/.course-group): a later learner set-up keeps it (remove .venv to go back to the learner's).
# COURSE_KEEP_TORCH=1 keeps the torch already in .venv (a CUDA build you installed) and installs the rest
# from requirements-lock-no-torch.txt (and, for dev, what requirements-lock-dev.txt adds to
# requirements-lock.txt); the notebooks check at start-up that this torch is in range. With no
# .venv yet, it keeps the torch of $PYTHON (a GPU image's or a hosted notebook's Python 3.11) without
# installing anything into it: .venv sees that interpreter's site-packages after its own, so the pinned
# packages win and torch comes from the image. It ends by registering .venv as the Jupyter kernel
# "Python 3 (ddp-course)" (COURSE_KERNEL_NAME names it; COURSE_KERNEL_NAME=none skips it).
# .venv remembers that it keeps its torch (.venv/.course-keep-torch): every later set-up without
# COURSE_KEEP_TORCH (`make run`, `make lab`, `make test` start with one) keeps it too, and says so in one
# line; so does one that finds a CUDA build of torch in .venv. Only COURSE_KEEP_TORCH=0 installs the
# lock's CPU torch over it (and forgets the mark).
# COURSE_COMPILE_BYTECODE=0 skips compiling the installed modules to bytecode (the tests set it: time).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GROUP=${1:-learner}
GROUP_MARK=.venv/.course-group
case "$GROUP" in
  learner | dev) ;;
  *) echo "setup: the group to install is learner (requirements-lock.txt) or dev (requirements-lock-dev.txt), not $GROUP."; exit 1 ;;
esac
# a .venv that has the dev group keeps it: make test's parts run set-up again as learners
if [ "$GROUP" = learner ] && [ -x .venv/bin/python ] && grep -qx dev "$GROUP_MARK" 2>/dev/null; then GROUP=dev; fi
KEEP_MARK=.venv/.course-keep-torch
KEEP_TORCH=${COURSE_KEEP_TORCH:-}
kept_kernel=
if [ -f "$KEEP_MARK" ]; then kept_kernel=$(sed -n 's/^kernel=//p' "$KEEP_MARK"); fi
case "$KEEP_TORCH" in
  0 | 1) ;;
  "")
    KEEP_TORCH=0
    venv_torch=$(ls -d .venv/lib/python3*/site-packages/torch 2>/dev/null | head -n1 || true)
    why=
    if [ -f "$KEEP_MARK" ] && [ -x .venv/bin/python ]; then
      why="it was set up with COURSE_KEEP_TORCH=1"
    elif [ -n "$venv_torch" ] && [ -x .venv/bin/python ] \
        && cuda=$(sed -n "s/^cuda\b[^=]*= *['\"]\([^'\"]*\)['\"].*/\1/p" "$venv_torch/version.py" 2>/dev/null) \
        && [ -n "$cuda" ]; then
      why="it is a CUDA $cuda build, which the lock's CPU torch would replace"
    fi
    if [ -n "$why" ]; then
      KEEP_TORCH=1
      version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null) \
        || version="(not found)"
      echo "setup: keeping the torch in .venv, torch $version: $why; COURSE_KEEP_TORCH=0 make setup replaces it with the lock's CPU build."
    fi
    ;;
  *)
    echo "setup: COURSE_KEEP_TORCH=$KEEP_TORCH: 1 keeps the torch in .venv (or \$PYTHON's), 0 installs the lock's CPU torch; unset, a .venv set up with 1 keeps its torch."
    exit 1
    ;;
esac
KERNEL=${COURSE_KERNEL_NAME:-${kept_kernel:-ddp-course}}
LOCK=requirements-lock.txt
if [ "$KEEP_TORCH" = 1 ]; then LOCK=requirements-lock-no-torch.txt; fi
DEV_LOCK=requirements-lock-dev.txt
inputs=(requirements.txt requirements-nodeps.txt "$LOCK" pyproject.toml scripts/setup.sh scripts/uv.sh)
if [ "$GROUP" = dev ]; then inputs+=(requirements-dev.txt "$DEV_LOCK"); fi
want=$( (cat "${inputs[@]}"; echo "group: $GROUP"
         echo "keep torch: $KEEP_TORCH"; if [ "$KEEP_TORCH" = 1 ]; then echo "kernel: $KERNEL"; fi) \
       | sha256sum | cut -c1-16)
stamp=.venv/.course-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  if [ "$GROUP" = dev ]; then which="the learner's and the development group's"; else which="the learner's"; fi
  echo "setup: .venv already has every locked package ($which; locks unchanged); nothing to install."
  exit 0
fi
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  if [ "$KEEP_TORCH" = 1 ]; then
    # A GPU image's Python (a ModelScope notebook, a GPU server) already holds a CUDA build of torch; pip
    # would overwrite the image's own jupyterlab, tornado and the rest with the lock's pins. Instead .venv
    # gets the pins and sees the image's site-packages after its own: --system-site-packages where that
    # Python is a base interpreter, and the .pth below where it is itself a venv (venvs do not chain).
    about=$("$PYTHON" -c 'import sys; print(f"Python {sys.version.split()[0]} at {sys.executable}")' 2>/dev/null) \
      || about="not a Python that runs"
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      problem="is not Python 3.11, for which $LOCK is resolved"
    elif ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
      problem="has no torch"
    elif ! torch_at=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
        2>/dev/null); then
      problem="has a torch that does not import (try: $PYTHON -c 'import torch')"
    else
      problem=
    fi
    if [ -n "$problem" ]; then
      echo "setup: COURSE_KEEP_TORCH=1 keeps the torch of $PYTHON, and $PYTHON ($about) $problem;" \
        "run it with PYTHON=<the image's Python 3.11 that has torch>, or without COURSE_KEEP_TORCH for the" \
        "locked CPU build."
      exit 1
    fi
    # The image's folders that --system-site-packages does not bring: its own, when it is a venv. Each
    # goes through site.addsitedir (after .venv's own folder), so the .pth files in it count as well.
    image_site=$("$PYTHON" -c 'import site, sys, sysconfig
base = set(site.getsitepackages([sys.base_prefix]))
found = site.getsitepackages() + [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
print("; ".join(["import site"] + [f"site.addsitedir({d!r})" for d in dict.fromkeys(found) if d not in base]))')
    echo "setup: creating .venv on $about, keeping its torch (from $torch_at) ..."
    "$PYTHON" -m venv --system-site-packages .venv
    own_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    {
      echo "# scripts/setup.sh (COURSE_KEEP_TORCH=1): after .venv's own packages, those of $PYTHON, whose torch .venv keeps."
      echo "$image_site"
    } > "$own_site/_course_image_site.pth"
  elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "setup: $LOCK is resolved for Python 3.11 and $PYTHON is $("$PYTHON" --version 2>&1);" \
      "run it again with PYTHON=python3.11 (or another Python 3.11)."
    exit 1
  fi
fi
echo "setup: [1/4] uv, the installer (its pin and hashes are in requirements-lock.txt) ..."
uv=$(bash scripts/uv.sh)
# uv does not read pip's configuration: pass on its find-links (torch's CPU wheel) and indexes (mirrors).
# Versions and hashes are fixed by the lock, so taking each file from whichever source has it is safe.
mapfile -t sources < <(.venv/bin/python -c "from helpers import environment as e; print(*e.uv_sources(), sep='\n')")
count_packages() { grep -c '^[A-Za-z0-9]' "$1"; }
files=("$LOCK")
what="the $(count_packages "$LOCK") packages of $LOCK (the learner's group)"
if [ "$GROUP" = dev ] && [ "$KEEP_TORCH" = 1 ]; then
  # what the dev group adds to the learner's lock, beside the no-torch lock: torch and its own stay as they are
  .venv/bin/python - "$DEV_LOCK" > .venv/.course-dev-only.txt <<'PY'
import sys
from helpers import environment
learner = environment.read_lock()
print("".join("\n".join(entry["block"]) + "\n" for name, entry in environment.read_lock(sys.argv[1]).items()
              if name not in learner), end="")
PY
  files+=(.venv/.course-dev-only.txt)
  what="the $(count_packages "$LOCK") packages of $LOCK and the $(count_packages .venv/.course-dev-only.txt) that $DEV_LOCK adds (the development group)"
elif [ "$GROUP" = dev ]; then
  files=("$DEV_LOCK")
  what="the $(count_packages "$DEV_LOCK") packages of $DEV_LOCK (the learner's group and the development group)"
fi
echo "setup: [2/4] installing $what (first time: 10 to 25 s) ..."
if [ "$KEEP_TORCH" = 1 ]; then
  .venv/bin/python - <<'PY'  # stop here, with one sentence, if that torch is outside the supported range
from helpers import environment, errors
try:
    note = environment.check_torch()
except errors.CourseError as error:
    raise SystemExit(f"setup: {error}") from None
print(f"setup: keeping torch {environment.installed('torch')}. {note}".rstrip())
PY
  # from now on every set-up keeps this torch, until COURSE_KEEP_TORCH=0
  {
    echo "# scripts/setup.sh: this .venv keeps its own torch (COURSE_KEEP_TORCH=1); COURSE_KEEP_TORCH=0 make setup installs the lock's CPU torch instead."
    echo "kernel=$KERNEL"
  } > "$KEEP_MARK"
  install=(install --no-deps)  # add to what is there: torch and its CUDA libraries stay
  for file in "${files[@]}"; do install+=(-r "$file"); done
else
  install=(sync "${files[@]}")  # exactly the lock: anything else in .venv goes
fi
# Compile to bytecode now, once: uv does not by default, and with PYTHONDONTWRITEBYTECODE=1 (set on the
# course machines and in CI) every process would compile every module it imports from source again
# (`from swift import sft_main`: 39 s, of them 16 s compiling; 15 s once compiled).
compile=(--compile-bytecode)
if [ "${COURSE_COMPILE_BYTECODE:-1}" = 0 ]; then compile=(); fi
if ! "$uv" pip "${install[@]}" --python .venv/bin/python --require-hashes --index-strategy unsafe-best-match \
    "${compile[@]}" "${sources[@]}"; then
  echo "setup: installing $what failed (above: which package)."
  if [ "$KEEP_TORCH" != 1 ]; then
    echo "       The lock holds torch's CPU build, found through pip's find-links; on a GPU machine, install a"
    echo "       CUDA build of torch into .venv and run with COURSE_KEEP_TORCH=1 (docs/gpu.md)."
  fi
  exit 1
fi
echo "setup: [3/4] installing the course helpers (editable) ..."
"$uv" pip install --python .venv/bin/python --quiet --no-deps --no-build-isolation "${compile[@]}" -e .
packages=$(( $(date +%s) - start ))
echo "setup: the packages took ${packages} s."
# DeepSpeed compiles its CPU communication kernel when it first starts on a machine without a GPU
# (notebook 11's SWIFT runs); built here, once, it is cached in ~/.cache/torch_extensions. With CUDA,
# DeepSpeed talks through NCCL and there is nothing to build; COURSE_CPU_KERNEL=0 skips it too.
if [ "${COURSE_CPU_KERNEL:-1}" = 0 ]; then
  echo "setup: [4/4] DeepSpeed's CPU communication kernel skipped (COURSE_CPU_KERNEL=0); notebook 11 builds it if it needs it."
elif .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "setup: [4/4] CUDA is available: DeepSpeed uses NCCL, no CPU communication kernel to build."
else
  echo "setup: [4/4] building DeepSpeed's CPU communication kernel (first time: 30 to 45 s on 2 cores) ..."
  # the venv's ninja, as under make (Makefile): one ninja keeps the cached kernel valid
  if ! PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" 2>&1 \
      | { grep -v "real_accelerator" || true; }; then
    echo "setup: the kernel did not build (is a C++ compiler installed?); DeepSpeed will try again when it starts."
  fi
fi
# With a kept torch, JupyterLab may run from elsewhere (the image's own, in a hosted notebook): a named
# kernel runs .venv's python there. --user writes to $(jupyter --data-dir)/kernels (JUPYTER_DATA_DIR).
if [ "$KEEP_TORCH" = 1 ] && [ "$KERNEL" != none ]; then
  if ! .venv/bin/python -m ipykernel install --user --name "$KERNEL" --display-name "Python 3 ($KERNEL)" >/dev/null; then
    echo "setup: registering .venv as the Jupyter kernel $KERNEL failed (above: why); COURSE_KERNEL_NAME=none skips it."
    exit 1
  fi
  echo "setup: in JupyterLab, pick the kernel \"Python 3 ($KERNEL)\" (Kernel > Change Kernel): it runs .venv/bin/python."
fi
if [ "$KEEP_TORCH" = 0 ]; then rm -f "$KEEP_MARK"; fi  # the lock's torch now: nothing left to keep
echo "$GROUP" > "$GROUP_MARK"
echo "$want" > "$stamp"
seconds=$(( $(date +%s) - start ))
printf '{"seconds": %d, "packages_seconds": %d, "date": "%s"}\n' "$seconds" "$packages" \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > .venv/.course-setup.json
echo "setup: done in ${seconds} s."
