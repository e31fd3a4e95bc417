"""Framing registry, the error types and stream decoding across chunks."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import threading

import pytest

from oncelog.framing import (
    CSVFraming,
    DecodeResult,
    DesyncDetected,
    FixedFraming,
    FrameDecodeError,
    Framing,
    FramingError,
    JSONFraming,
    MalformedFrame,
    TruncatedFrame,
    UnknownContentType,
    content_types,
    decode_stream,
    for_content_type,
    register,
)
from oncelog.framing.base import gc_paused, set_gc_pausing
from oncelog.message import JSONMessage


def test_builtin_content_types_are_gazettes() -> None:
    assert content_types() == ["application/x-ndjson", "application/x-protobuf-fixed", "text/csv"]
    for framing in (for_content_type(ct) for ct in content_types()):
        assert isinstance(framing, Framing)


def test_content_type_lookup_ignores_case_and_parameters() -> None:
    assert isinstance(for_content_type("Text/CSV; charset=utf-8"), CSVFraming)
    assert isinstance(for_content_type(" application/x-ndjson "), JSONFraming)


def test_unknown_content_type_names_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownContentType) as info:
        for_content_type("application/x-gazette-recoverylog")
    err = info.value
    assert isinstance(err, FramingError) and isinstance(err, LookupError)
    assert err.content_type == "application/x-gazette-recoverylog"
    assert str(err) == (
        "no framing for content type 'application/x-gazette-recoverylog'; known content types: "
        "application/x-ndjson, application/x-protobuf-fixed, text/csv"
    )


def test_register_replaces_and_returns_the_previous_framing() -> None:
    custom = JSONFraming(uuid_field="id")
    previous = register(custom)
    try:
        assert isinstance(previous, JSONFraming) and previous is not custom
        assert for_content_type("application/x-ndjson") is custom
    finally:
        assert register(previous) is custom  # type: ignore[arg-type]
    assert for_content_type("application/x-ndjson") is previous


def test_register_a_new_content_type_and_reject_nameless_framings() -> None:
    class Upper:
        content_type = "text/x-upper-lines"

        def marshal(self, msg: str) -> bytes:
            return msg.upper().encode() + b"\n"

        def decode(self, buf, *, journal, base=0, final=False, new_message=None) -> DecodeResult:
            return JSONFraming().decode(buf, journal=journal, base=base, final=final)

    assert register(Upper()) is None
    try:
        assert "text/x-upper-lines" in content_types()
        assert isinstance(for_content_type("text/x-upper-lines"), Upper)
    finally:
        from oncelog.framing import base

        del base._registry["text/x-upper-lines"]
    with pytest.raises(TypeError, match="no content_type"):
        register(object())  # type: ignore[arg-type]


def test_errors_keep_their_fields_through_pickle() -> None:
    err = MalformedFrame(
        "unexpected character", what="malformed JSON frame", journal="logs/a", begin=1234,
        end=1290, data=b"{bad\n",
    )
    assert str(err) == (
        "journal logs/a: malformed JSON frame at offset 1234-1290: unexpected character"
    )
    for original in (err, DesyncDetected("skipped 3", journal="j", begin=0, end=3, data=b"abc"),
                     TruncatedFrame("cut", data=b"x")):
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is type(original) and str(copy) == str(original)
        assert (copy.journal, copy.begin, copy.end, copy.data) == (
            original.journal, original.begin, original.end, original.data)
    assert str(TruncatedFrame("cut", data=b"x")) == "truncated frame: cut"


JSON = JSONFraming()


def test_decode_stream_yields_good_envelopes_before_raising() -> None:
    data = b'{"a":1}\n{"a":2}\n{bad\n{"a":3}\n'
    seen: list[int] = []
    with pytest.raises(MalformedFrame) as info:
        for env in decode_stream(JSON, [data[:10], data[10:]], journal="logs/s", offset=50):
            seen.append(env.message.doc["a"])
    assert seen == [1, 2]
    assert (info.value.begin, info.value.end) == (66, 71)


def test_decode_stream_skips_through_on_error_and_can_stop() -> None:
    data = b'{"a":1}\n{bad\n{"a":3}\n{"a":4'
    errors: list[FrameDecodeError] = []
    got = [e.message.doc["a"] for e in decode_stream(JSON, [data], journal="j",
                                                     on_error=errors.append)]
    assert got == [1, 3]
    assert [(type(e), e.begin, e.end) for e in errors] == [
        (MalformedFrame, 8, 13), (TruncatedFrame, 21, 27)
    ]

    def stop(err: FrameDecodeError) -> None:
        raise RuntimeError(f"stopped at {err.begin}")

    with pytest.raises(RuntimeError, match="stopped at 8"):
        list(decode_stream(JSON, [data], journal="j", on_error=stop))


def test_decode_stream_carries_a_large_frame_across_small_chunks() -> None:
    fixed = FixedFraming(new_message=lambda p: JSONMessage({"n": len(p)}))
    frame = fixed.marshal(b"x" * 100_000)
    chunks = [frame[i : i + 1000] for i in range(0, len(frame), 1000)] + [frame]
    envelopes = list(decode_stream(fixed, chunks, journal="j", offset=7))
    assert [(e.begin, e.end, e.message.doc["n"]) for e in envelopes] == [
        (7, 7 + len(frame), 100_000), (7 + len(frame), 7 + 2 * len(frame), 100_000)
    ]


@pytest.fixture
def gc_pausing():
    from oncelog.framing import set_gc_pausing

    previous = set_gc_pausing(True)
    yield
    set_gc_pausing(previous)


def test_gc_is_left_alone_unless_the_process_opts_in() -> None:
    # The default, in a fresh process (this one may have run the CLI, which opts in).
    fresh = subprocess.run(
        [sys.executable, "-c", "import oncelog.framing.base as b; print(b._gc_pausing)"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "ONCELOG_GC_PAUSE": ""},
    )
    assert fresh.stdout.strip() == "False", fresh.stderr
    previous = set_gc_pausing(False)
    try:
        _check_gc_left_alone()
    finally:
        set_gc_pausing(previous)


def _check_gc_left_alone() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with gc_paused():
        assert gc.isenabled()
    envelopes = JSON.decode(b'{"a":1}\n' * 3, journal="j").envelopes
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert len(envelopes) == 3


def test_gc_pause_nests_across_threads_and_restores_the_collector(gc_pausing) -> None:
    assert gc.isenabled()
    inner_started, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gc_paused():
            inner_started.set()
            assert release.wait(10)

    with gc_paused():
        assert not gc.isenabled()
        worker = threading.Thread(target=hold)
        worker.start()
        assert inner_started.wait(10)
    assert not gc.isenabled()  # the other thread's pause is still on
    release.set()
    worker.join(10)
    assert gc.isenabled()

    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


def test_a_large_batch_is_promoted_to_the_oldest_generation(monkeypatch, gc_pausing) -> None:
    from oncelog.framing import base

    monkeypatch.setattr(base, "PROMOTE_BATCH", 3)
    data = b'{"a":1}\n' * 3
    envelopes = JSON.decode(data, journal="j").envelopes
    assert gc.isenabled()
    young = {id(o) for o in gc.get_objects(generation=0)}
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(e) not in young and id(e) in oldest for e in envelopes)

    small = JSON.decode(b'{"a":1}\n', journal="j").envelopes  # below the threshold
    assert id(small[0]) not in {id(o) for o in gc.get_objects(generation=2)}


def test_promotion_leaves_a_process_with_frozen_objects_alone(monkeypatch) -> None:
    from oncelog.framing import base

    monkeypatch.setattr(base, "PROMOTE_BATCH", 1)
    calls: list[str] = []
    real_freeze, real_unfreeze = gc.freeze, gc.unfreeze
    keep = [[i] for i in range(10)]
    real_freeze()
    try:
        assert gc.get_freeze_count() >= len(keep)
        # Spy on the calls rather than compare freeze counts: other threads of the test
        # process may free frozen objects meanwhile, which changes the count.
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        JSON.decode(b'{"a":1}\n' * 2, journal="j")
        assert calls == []  # nothing of the process was frozen anew or unfrozen
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        monkeypatch.undo()
        real_unfreeze()
