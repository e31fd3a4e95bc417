#!/usr/bin/env bash
# Create or reuse the project virtual environment and install oncelog with the given extras.
# Usage: scripts/venv.sh [extras]   e.g. scripts/venv.sh all,dev (what scripts/test.sh uses),
# scripts/venv.sh bench (what benchmarks/ import), or no argument (oncelog alone).
# Prints the venv's python path on stdout, and one line per step on stderr; pip's own output
# goes to a log in the venv, printed only if pip fails.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv="${ONCELOG_VENV:-.venv}"
py="${PYTHON:-python3}"
say() { echo "oncelog: $*" >&2; }
if [ ! -x "$venv/bin/python" ]; then
    say "creating the virtual environment $venv ($("$py" --version 2>&1))"
    "$py" -m venv "$venv" >&2
fi
stamp="$venv/.oncelog-installed-${extras:-base}"
# Reinstall only when the build inputs (pyproject.toml, setup.py, the C speed-ups) changed
# since the last install of these extras.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
    || [ oncelog/_speedups.c -nt "$stamp" ] || [ oncelog/_bulk.c -nt "$stamp" ] \
    || [ oncelog/_spool.c -nt "$stamp" ]; then
    spec="."
    what="oncelog"
    if [ -n "$extras" ]; then
        spec=".[$extras]"
        what="oncelog with extras $extras"
    fi
    say "installing $what into $venv, building the C speed-ups (this can take a minute)"
    log="$venv/.oncelog-pip.log"
    start=$SECONDS
    # An editable install: the venv runs this checkout's code. (pyproject.toml makes it a
    # static .pth entry, so PySpark finds `pyspark_oncelog` as it does in a regular install.)
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input \
        -e "$spec" >"$log" 2>&1; then
        cat "$log" >&2
        say "pip install failed (its output is above, and in $log)"
        exit 1
    fi
    if "$venv/bin/python" -c "import oncelog._speedups, oncelog._bulk, oncelog._spool" \
        >/dev/null 2>&1; then
        speedups="C speed-ups built"
    else
        speedups="C speed-ups not built (no C compiler?): the pure-Python path runs"
    fi
    say "installed in $((SECONDS - start)) s; $speedups"
    touch "$stamp"
else
    say "$venv is up to date (oncelog${extras:+ with extras $extras})"
fi
echo "$venv/bin/python"
