#!/usr/bin/env bash
# Set up (or reuse) the virtual environment with the dev extras and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(bash scripts/venv.sh all,dev)"
exec "$py" -m pytest -n 2 --dist loadgroup -q "$@"
