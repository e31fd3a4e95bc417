"""The `oncelog` command line: manage, append to and read journals on any store.

`main()` is the console script's entry point; `cli` is the click group, for embedding or
for click's test runner. See docs/cli.md.
"""

from oncelog.cli import (  # noqa: F401  (register them)
    append,
    export,
    groups,
    journals,
    read,
    serve,
    status,
    txns,
)
from oncelog.cli.app import cli, main

__all__ = ["cli", "main"]
