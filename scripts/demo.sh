#!/usr/bin/env bash
# Set up (or reuse) the virtual environment and run the exactly-once demo pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(bash scripts/venv.sh)"
exec "$py" -m oncelog.demo "$@"
