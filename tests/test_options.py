"""`-o KEY=VALUE` storage options shared by the demo and the examples."""

from __future__ import annotations

import argparse

import pytest

from oncelog.options import storage_option_arg


def test_values_are_json_when_they_parse_else_strings() -> None:
    assert storage_option_arg("use_ssl=false") == ("use_ssl", False)
    assert storage_option_arg('client_kwargs={"region_name": "eu"}') == (
        "client_kwargs", {"region_name": "eu"},
    )
    assert storage_option_arg("key=AKIA=x") == ("key", "AKIA=x")
    assert storage_option_arg("anon=") == ("anon", "")


@pytest.mark.parametrize("bad", ["novalue", "=x", ""])
def test_missing_key_or_equals_is_a_usage_error(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        storage_option_arg(bad)
