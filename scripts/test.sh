#!/usr/bin/env bash
# Set up (or reuse) the virtual environment with the dev extras, then check and test:
# pip check (conflicting requirements), ruff (lint), mypy (types), the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CI:-}" = "true" ]; then
    # CI must test the C speed-ups: a build that fails to compile them fails the run.
    export ONCELOG_REQUIRE_SPEEDUPS=1
fi
py="$(bash scripts/venv.sh all,dev)"
"$py" -m pip check  # conflicting installed requirements fail the run before the tests
"$py" -m ruff check oncelog tests benchmarks examples scripts
"$py" -m mypy
exec "$py" -m pytest -n 2 --dist loadgroup -q --durations=25 "$@"
