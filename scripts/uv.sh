#!/usr/bin/env bash
# Print the path of uv, the installer that scripts/setup.sh and `make lock` use. Its version and hashes
# come from requirements-lock.txt; the first call installs it into .venv with pip (a few seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
lock=requirements-lock.txt
want=$(sed -n 's/^uv==\([^ ;]*\).*/\1/p' "$lock" 2>/dev/null || true)
if [ -z "$want" ]; then  # no lock yet (or one without uv): the pin in requirements.txt, without hashes
  lock=requirements.txt
  want=$(sed -n 's/^uv==\([^ ;#]*\).*/\1/p' "$lock")
  [ -n "$want" ] || { echo "requirements.txt pins no uv (uv==...); add it." >&2; exit 1; }
fi
if [ -x .venv/bin/uv ] && [ "$(.venv/bin/uv --version | cut -d' ' -f2)" = "$want" ]; then
  echo .venv/bin/uv
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PYTHON" --version) ..." >&2
  "$PYTHON" -m venv .venv
elif ! .venv/bin/python -c "import pip" 2>/dev/null; then  # a set-up stopped while venv was putting pip in
  echo "setup: .venv has no pip (a set-up stopped part-way?); putting it back with ensurepip ..." >&2
  .venv/bin/python -m ensurepip --default-pip >/dev/null
fi
# uv's block of the lock: its pin and the hashes of its files
awk '/^uv==/ {keep = 1} keep {print} keep && !/\\$/ {exit}' "$lock" > .venv/.uv-requirement.txt
hashes=$(grep -q -- "--hash" .venv/.uv-requirement.txt && echo --require-hashes || true)
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps $hashes \
  -r .venv/.uv-requirement.txt 2>&1 | { grep -v "^WARNING: Location .* is ignored" || true; } >&2
echo .venv/bin/uv
