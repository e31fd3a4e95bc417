"""Where a consumer's objects live, as named in errors (shared by checkpoints, state and
sinks, which must not import each other for it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncelog.journal import JournalClient

__all__ = ["display_path"]


def display_path(client: JournalClient, rel: str) -> str:
    """The full location of `<root>/.oncelog/<rel>`."""
    return f"{client.root.rstrip('/')}/.oncelog/{rel}"
