"""`oncelog append`: append a file or stdin to a journal, frames checked first.

The input is decoded with the journal's framing as it is read, and appended in chunks of
whole frames, each chunk one append (so frames never straddle appends, and a concurrent
writer's append can only land between whole frames). An input that fits in one chunk is
appended all or nothing; after a bad frame nothing more is appended, and the error says
what was appended before it.
"""

from __future__ import annotations

import bisect
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.output import Progress, notice, progress
from oncelog.cli.params import SIZE, format_size

if TYPE_CHECKING:
    from oncelog.framing import FrameDecodeError, Framing
    from oncelog.journal import AppendResult, AsyncAppend, JournalClient

__all__ = ["append", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 8 << 20
"""Bytes of input per append, unless the journal's fragments are smaller."""
_READ_BLOCK = 1 << 20


@cli.command("append")
@click.argument("name")
@click.argument("file", type=click.File("rb"), default="-")
@click.option(
    "--raw",
    is_flag=True,
    help="Append the input as it is, unchecked, as one append (held in memory until written).",
)
@click.option(
    "--chunk-size",
    type=SIZE,
    default=None,
    help="Input bytes per append, cut at frame boundaries [default: 8MiB or the fragment length].",
)
@store_options
@pass_state
def append(state: State, name: str, file: BinaryIO, raw: bool, chunk_size: int | None) -> None:
    """Append FILE (default: stdin) to journal NAME.

    Frames are checked against the journal's content type (JSON objects one per line, CSV
    records, or fixed protobuf frames) unless --raw. Prints where the data landed on stderr.
    """
    client = state.client()
    spec = client.get(name)
    source = "stdin" if file.name in ("-", "<stdin>") else str(file.name)
    if source == "stdin" and file.isatty():
        notice(f"appending what you type to {name}; end with Ctrl-D")
    with progress(f"append {name}", total=_input_size(file)) as bar:
        if raw:
            appended = _append_raw(client, name, file, bar)
        else:
            from oncelog.framing import UnknownContentType, for_content_type

            try:
                framing = for_content_type(spec.content_type)
            except UnknownContentType as exc:
                raise click.ClickException(f"journal {name}: {exc}; append with --raw") from None
            size = chunk_size or min(DEFAULT_CHUNK, spec.fragment.length)
            appended = _append_frames(client, name, framing, file, source, size, bar)
    notice(appended.summary(name))


def _input_size(file: BinaryIO) -> int | None:
    try:
        info = os.fstat(file.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


@dataclass(slots=True)
class _Appended:
    """What was appended: each append's result, the input bytes and frames they held."""

    results: list[AppendResult] = field(default_factory=list)
    size: int = 0
    frames: int | None = 0

    def where(self) -> str:
        if not self.results:
            return "nothing"
        first, last = self.results[0], self.results[-1]
        count = len(self.results)
        size = f"{self.size} bytes" + (f" ({format_size(self.size)})" if self.size >= 1024 else "")
        appends = f"{count} append{'s' if count != 1 else ''}"
        return f"{size} in {appends} at offsets {first.begin}-{last.end}"

    def summary(self, name: str) -> str:
        if not self.results:
            return f"nothing to append to {name}: the input is empty"
        frames = (
            "" if self.frames is None else f"{self.frames} frame{'s' if self.frames != 1 else ''}, "
        )
        return f"appended {frames}{self.where()} of journal {name}"


def _append_raw(client: JournalClient, name: str, file: BinaryIO, bar: Progress) -> _Appended:
    done = _Appended(frames=None)
    block = file.read(_READ_BLOCK)
    if not block:
        return done
    pending = client.start_append(name)
    try:
        while block:
            pending.write(block)
            done.size += len(block)
            bar.advance(len(block))
            block = file.read(_READ_BLOCK)
    except BaseException:
        pending.abort()
        raise
    pending.release()
    done.results.append(pending.result())
    return done


def _append_frames(
    client: JournalClient,
    name: str,
    framing: Framing,
    file: BinaryIO,
    source: str,
    chunk_size: int,
    bar: Progress,
) -> _Appended:
    from oncelog.cli.frames import new_message_for
    from oncelog.framing import FrameDecodeError

    new_message = new_message_for(framing.content_type)
    done = _Appended()
    buf = bytearray()  # input from `buf_offset` on, not appended yet
    buf_offset = 0
    checked = 0  # bytes of `buf` that are whole, valid frames
    ends: list[int] = []  # input offsets where those frames end
    in_flight: AsyncAppend | None = None

    def submit(data: bytes, count: int) -> None:
        nonlocal in_flight
        settle()
        in_flight = client.start_append(name)
        try:
            in_flight.write(data)
        except BaseException:
            in_flight.abort()
            in_flight = None
            raise
        in_flight.release()
        done.size += len(data)
        done.frames = (done.frames or 0) + count

    def settle() -> None:
        nonlocal in_flight
        if in_flight is not None:
            pending, in_flight = in_flight, None
            done.results.append(pending.result())

    while True:
        block = file.read(_READ_BLOCK)
        eof = not block
        buf += block
        bar.advance(len(block))
        try:
            with memoryview(buf) as view, view[checked:] as unchecked:
                result = framing.decode(
                    unchecked,
                    journal=name,
                    base=buf_offset + checked,
                    final=eof,
                    new_message=new_message,
                )
        except FrameDecodeError as exc:
            settle()
            raise click.ClickException(_invalid(name, framing, source, exc, done)) from None
        checked += result.consumed
        ends.extend(env.end for env in result.envelopes)
        # Append whole frames, up to `chunk_size` bytes at a time (one larger frame alone).
        while ends and (checked >= chunk_size or eof):
            count = bisect.bisect_right(ends, buf_offset + chunk_size) or 1
            cut = ends[count - 1] - buf_offset
            submit(bytes(buf[:cut]), count)
            del buf[:cut], ends[:count]
            buf_offset += cut
            checked -= cut
        if eof:
            break
    settle()
    return done


def _invalid(
    name: str, framing: Framing, source: str, exc: FrameDecodeError, done: _Appended
) -> str:
    head = (
        f"invalid {framing.content_type} input for journal {name}: {exc.what} "
        f"at byte {exc.begin} of {source}: {exc.reason}"
    )
    if not done.results:
        return f"{head}; nothing was appended"
    return f"{head}; appended only the input before byte {done.size}: {done.where()}"
