"""`oncelog read` of protobuf journals: one that records its message class (label
`oncelog.dev/protobuf-class`) is read committed by default, its messages printed as
protobuf's JSON mapping; one without a class is read uncommitted with a warning naming the
label, and `--committed` says what is missing."""

from __future__ import annotations

from typing import Any

import orjson
from click.testing import CliRunner
from proto_support import EVENT_CLASS, Event

from oncelog.cli import cli
from oncelog.cli.app import State
from oncelog.framing import CONTENT_TYPE_PROTOBUF_FIXED
from oncelog.framing.protoclass import PROTOBUF_CLASS_LABEL
from oncelog.journal import JournalClient, JournalSpec
from oncelog.message import ProtoMessage
from oncelog.publisher import Publisher
from oncelog.testing.fixtures import StoreTarget

PROTO = CONTENT_TYPE_PROTOBUF_FIXED


def _read(target: StoreTarget, *args: str, rc: int = 0) -> tuple[str, str]:
    state = State(store=target.url)
    try:
        result = CliRunner().invoke(
            cli, ["read", "--format", "json", *args], obj=state, catch_exceptions=False
        )
    finally:
        state.close()
    assert result.exit_code == rc, (result.stdout, result.stderr)
    return result.stdout, result.stderr


def _write(client: JournalClient, name: str, proto_class: str | None) -> None:
    """Committed seq 1; a committed transaction of seq 2; a rolled-back one of seq 3."""
    labels: dict[str, Any] = {"content-type": PROTO}
    if proto_class is not None:
        labels[PROTOBUF_CLASS_LABEL] = proto_class
    client.create(JournalSpec(name, labels=labels))
    to = lambda _m: (name, PROTO)  # noqa: E731
    pub = Publisher(client)
    pub.publish_committed(to, ProtoMessage(Event(seq=1, user="u", tags=["a"])))
    with pub.transaction():
        pub.publish_uncommitted(to, ProtoMessage(Event(seq=2)))
    pub.publish_uncommitted(to, ProtoMessage(Event(seq=3)))
    pub.flush()
    pub.append_intents(pub.build_rollback_intents())


def test_a_journal_recording_its_class_is_read_committed(local_store: StoreTarget) -> None:
    with local_store.open() as client:
        _write(client, "proto/named", EVENT_CLASS)
    out, err = _read(local_store, "proto/named")
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert [r["message"].get("seq") for r in rows] == ["1", "2"]  # int64 as JSON strings
    assert rows[0]["message"]["user"] == "u" and rows[0]["message"]["tags"] == ["a"]
    assert all(r["flags"] != "ACK_TXN" for r in rows)
    assert "uncommitted" not in err
    table, _ = _read(local_store, "proto/named", "--format", "table")  # (the last --format)
    assert '"seq":"2"' in table.replace(" ", "")
    everything, _ = _read(local_store, "proto/named", "--uncommitted")
    assert len(everything.splitlines()) == 5  # 3 messages and 2 acknowledgements


def test_a_journal_without_a_class_is_read_uncommitted_and_says_why(
    local_store: StoreTarget,
) -> None:
    with local_store.open() as client:
        _write(client, "proto/bare", None)
        _write(client, "proto/lost", "nowhere_at_all.Event")
    out, err = _read(local_store, "proto/bare")
    assert len(out.splitlines()) == 5 and PROTOBUF_CLASS_LABEL in err
    assert isinstance(orjson.loads(out.splitlines()[0])["message"], str)  # base64 payload
    _, err = _read(local_store, "proto/bare", "--committed", rc=1)
    assert "records none" in err and PROTOBUF_CLASS_LABEL in err
    out, err = _read(local_store, "proto/lost")
    assert len(out.splitlines()) == 5 and "nowhere_at_all" in err
