"""Streaming error codes and the exception carrying one.

`Code` mirrors the `StreamingCode` enum of streaming.proto with short names; a
`StreamingError` is what the client raises for an error answer of a node (and what the node
turns into an error message). Meanings follow Milvus's streaming service: see
docs/streaming.md for when each is returned.
"""

from __future__ import annotations

import enum

from oncelog.errors import OncelogError

__all__ = ["RETRIABLE", "Code", "StreamingError"]


class Code(enum.IntEnum):
    """Why a streaming request failed (the proto's `STREAMING_CODE_*` values)."""

    OK = 0
    CHANNEL_EXIST = 1
    CHANNEL_NOT_EXIST = 2
    CHANNEL_FENCED = 3
    ON_SHUTDOWN = 4
    INVALID_REQUEST_SEQ = 5
    UNMATCHED_CHANNEL_TERM = 6
    IGNORED_OPERATION = 7
    INNER = 8
    EOF = 9
    INVALID_ARGUMENT = 10
    TRANSACTION_EXPIRED = 11
    UNAUTHENTICATED = 12
    UNKNOWN = 999

    @classmethod
    def of(cls, value: int) -> Code:
        """The Code of a wire value; UNKNOWN for values this version does not know."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


RETRIABLE = frozenset(
    {Code.CHANNEL_FENCED, Code.CHANNEL_NOT_EXIST, Code.UNMATCHED_CHANNEL_TERM, Code.ON_SHUTDOWN}
)
"""Codes after which a producer looks the channel's owner up again and resends there (a
CHANNEL_NOT_EXIST from a node that is not the owner; a channel that is really gone stays
CHANNEL_NOT_EXIST everywhere and the retry gives up)."""


class StreamingError(OncelogError):
    """A node answered a request with an error `code` and a `cause`."""

    def __init__(self, code: Code | int, cause: str = "") -> None:
        self.code = Code.of(int(code))
        self.cause = cause
        super().__init__(f"{self.code.name}: {cause}" if cause else self.code.name)
