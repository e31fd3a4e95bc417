# The C core of a journal's appender: see oncelog/_spool.c and oncelog/journal/_spoolcore.py
# (whose pure classes have the same interface and are what the appender is typed against).
from collections.abc import Callable
from typing import Any

OPEN: int

class BatchCore:
    buf: bytearray
    used: bool
    created: float

class AppendCore:
    def __init__(self, appender: AppenderCore, batch: BatchCore, begin: int) -> None: ...
    @property
    def _appender(self) -> AppenderCore: ...
    @property
    def _batch(self) -> BatchCore: ...
    @property
    def _begin(self) -> int: ...
    _end: int
    def write(self, data: bytes | bytearray | memoryview) -> int: ...
    def release(self) -> None: ...

class AppenderCore:
    index: Any
    _write_lock: Any
    _open: BatchCore
    _room: int
    _seal_requested: bool
    _closed: bool
    _append_type: type[AppendCore]
    @property
    def reusable(self) -> bool: ...
    def start_append(self) -> Any: ...
    def append_made(self, make: Callable[..., tuple[Any, Any]], *args: Any) -> tuple[Any, Any]: ...

class Outstanding:
    def add(self, append: Any) -> bool: ...
    def take(self) -> list[Any]: ...
    def restore(self, front: list[Any]) -> None: ...
    def __len__(self) -> int: ...

class Lane:
    def __init__(
        self,
        appender: AppenderCore,
        make: Callable[..., tuple[Any, Any]],
        fixed: tuple[Any, ...],
        outstanding: Outstanding,
        on_full: Callable[[], object],
    ) -> None: ...
    @property
    def appender(self) -> AppenderCore: ...
    def append(self, *args: Any) -> tuple[Any, Any] | None: ...
