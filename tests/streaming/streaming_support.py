"""Helpers shared by the streaming tests (imported by name: tests/streaming is on sys.path)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from oncelog.streaming import ConsumedMessage

WAIT = 60.0


class Collector:
    """The items of a scanner, read by a thread into a queue: `messages(n)` waits (bounded)
    for the next n messages."""

    def __init__(self, scanner: Any) -> None:
        self.scanner = scanner
        self.items: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for item in self.scanner:
                self.items.put(item)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            self.items.put(exc)

    def messages(self, n: int, timeout: float = WAIT) -> list[ConsumedMessage]:
        out: list[ConsumedMessage] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                item = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"only {len(out)} of {n} messages within {timeout} s: "
                                     f"{[m.payload for m in out]}") from None
            if isinstance(item, Exception):
                raise item
            if isinstance(item, ConsumedMessage):
                out.append(item)
        return out

    def close(self) -> None:
        self.scanner.close()
