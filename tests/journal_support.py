"""Support for the journal tests: fresh journals with unique names."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from oncelog.journal import FragmentSpec, JournalClient, JournalSpec

_names = itertools.count()


def new_journal(client: JournalClient, prefix: str = "t", **fragment: Any) -> str:
    """Create a journal with a name no other test uses (FragmentSpec fields as keywords)."""
    name = f"{prefix}/j-{next(_names)}-{uuid.uuid4().hex[:6]}"
    client.create(JournalSpec(name, fragment=FragmentSpec(**fragment)))
    return name
