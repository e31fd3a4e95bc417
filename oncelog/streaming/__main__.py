"""`python -m oncelog.streaming ...` runs `oncelog serve ...` (for tests and containers)."""

import sys

from oncelog.cli import main

main(["serve", *sys.argv[1:]])
