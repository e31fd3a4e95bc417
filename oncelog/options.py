"""Command-line parsing shared by the demo and the examples."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["storage_option_arg"]


def storage_option_arg(text: str) -> tuple[str, Any]:
    """An argparse `type` for `-o KEY=VALUE` storage options: the value is parsed as JSON
    when it is JSON (`use_ssl=false`, `client_kwargs={...}`), else kept as a string.

    Collect with `action="append"` and pass `**dict(args.storage_option)` to
    `open_journals`. (The `oncelog` command has its own, richer `KEY:=JSON` syntax.)
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value
