#!/usr/bin/env bash
# Create .venv and install exactly the packages of requirements-lock.txt, once: a second call sees nothing
# changed and says so. Nothing here resolves versions: `make lock` makes the lock from requirements.txt.
# COURSE_KEEP_TORCH=1 keeps the torch already in .venv (a CUDA build you installed) and installs the rest
# from requirements-lock-no-torch.txt; the notebooks check at start-up that this torch is in range.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
KEEP_TORCH=${COURSE_KEEP_TORCH:-0}
LOCK=requirements-lock.txt
if [ "$KEEP_TORCH" = 1 ]; then LOCK=requirements-lock-no-torch.txt; fi
want=$( (cat requirements.txt requirements-nodeps.txt "$LOCK" pyproject.toml scripts/setup.sh scripts/uv.sh;
         echo "keep torch: $KEEP_TORCH") | sha256sum | cut -c1-16)
stamp=.venv/.course-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  echo "setup: .venv already has every locked package (lock unchanged); nothing to install."
  exit 0
fi
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  if [ "$KEEP_TORCH" = 1 ]; then
    echo "setup: COURSE_KEEP_TORCH=1 keeps the torch in .venv, and there is no .venv yet: create it with your"
    echo "       CUDA build of torch first (python3.11 -m venv .venv && .venv/bin/pip install torch==...)."
    exit 1
  fi
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
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
echo "setup: [2/4] installing the $(grep -c '^[A-Za-z0-9]' "$LOCK") packages of $LOCK (first time: 10 to 25 s) ..."
if [ "$KEEP_TORCH" = 1 ]; then
  .venv/bin/python - <<'PY'  # stop here, with one sentence, if that torch is outside the supported range
from helpers import environment, errors
try:
    note = environment.check_torch()
except errors.CourseError as error:
    raise SystemExit(f"setup: {error}") from None
print(f"setup: keeping torch {environment.installed('torch')}. {note}".rstrip())
PY
  install=(install --no-deps -r "$LOCK")  # add to what is there: torch and its CUDA libraries stay
else
  install=(sync "$LOCK")  # exactly the lock: anything else in .venv goes
fi
if ! "$uv" pip "${install[@]}" --python .venv/bin/python --require-hashes --index-strategy unsafe-best-match \
    "${sources[@]}"; then
  echo "setup: installing $LOCK failed (above: which package)."
  if [ "$KEEP_TORCH" != 1 ]; then
    echo "       The lock holds torch's CPU build, found through pip's find-links; on a GPU machine, install a"
    echo "       CUDA build of torch into .venv and run with COURSE_KEEP_TORCH=1 (README, On GPUs)."
  fi
  exit 1
fi
echo "setup: [3/4] installing the course helpers (editable) ..."
"$uv" pip install --python .venv/bin/python --quiet --no-deps --no-build-isolation -e .
packages=$(( $(date +%s) - start ))
echo "setup: the packages took ${packages} s."
# DeepSpeed compiles its CPU communication kernel when it first starts on a machine without a GPU
# (notebook 08's SWIFT runs); built here, once, it is cached in ~/.cache/torch_extensions. With CUDA,
# DeepSpeed talks through NCCL and there is nothing to build; COURSE_CPU_KERNEL=0 skips it too.
if [ "${COURSE_CPU_KERNEL:-1}" = 0 ]; then
  echo "setup: [4/4] DeepSpeed's CPU communication kernel skipped (COURSE_CPU_KERNEL=0); notebook 08 builds it if it needs it."
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
echo "$want" > "$stamp"
seconds=$(( $(date +%s) - start ))
printf '{"seconds": %d, "packages_seconds": %d, "date": "%s"}\n' "$seconds" "$packages" \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > .venv/.course-setup.json
echo "setup: done in ${seconds} s."
