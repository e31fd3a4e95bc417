#!/usr/bin/env bash
# Set up (or reuse) the virtual environment with the dev extras, then check and test:
# pip check (conflicting requirements), ruff (lint), mypy (types), the whole test suite.
# Each step prints one line on stderr first ("oncelog: ..."), so a long one is never silent.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "oncelog: $*" >&2; }
if [ "${CI:-}" = "true" ]; then
    # CI must test the C speed-ups: a build that fails to compile them fails the run.
    export ONCELOG_REQUIRE_SPEEDUPS=1
fi
# all: every optional feature; dev: the test kit, ruff, mypy, and what the docs test runs.
py="$(bash scripts/venv.sh all,dev)"
say "pip check (conflicting installed requirements fail the run before the tests)"
if ! out="$("$py" -m pip check 2>&1)"; then
    echo "$out" >&2
    exit 1
fi
say "ruff (lint)"
"$py" -m ruff check oncelog tests benchmarks examples scripts
say "mypy (types)"
"$py" -m mypy
say "pytest (2 workers)"
exec "$py" -m pytest -n 2 --dist loadgroup -q --durations=25 "$@"
