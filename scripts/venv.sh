#!/usr/bin/env bash
# Create or reuse the project virtual environment and install oncelog with the given extras.
# Usage: scripts/venv.sh [extras]   e.g. scripts/venv.sh dev
# Prints the venv's python path on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv="${ONCELOG_VENV:-.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv" >&2
fi
stamp="$venv/.oncelog-installed-${extras:-base}"
# Reinstall only when the build inputs (pyproject.toml, setup.py, the C speed-ups) changed
# since the last install of these extras.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
    || [ oncelog/_speedups.c -nt "$stamp" ]; then
    spec="."
    [ -n "$extras" ] && spec=".[$extras]"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$spec" >&2
    touch "$stamp"
fi
echo "$venv/bin/python"
