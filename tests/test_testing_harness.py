"""The user-facing test harness: histories against the model, exactly-once checks."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.framing import CONTENT_TYPE_CSV, CONTENT_TYPE_JSON_LINES, for_content_type
from oncelog.journal import JournalSpec, open_journals
from oncelog.testing import (
    ExactlyOnceViolation,
    ReadCommittedModel,
    assert_exactly_once,
    csv_records,
    histories,
    json_messages,
    read_committed_with_restarts,
    run_history,
)

JOURNALS = ["harness/a", "harness/b"]


def fresh_client():
    client = open_journals(f"memory:///harness-{uuid.uuid4().hex}")
    for name in JOURNALS:
        client.create(JournalSpec(name, labels={"content-type": CONTENT_TYPE_JSON_LINES}))
    return client


@settings(max_examples=40, deadline=None)
@given(
    history=histories(producers=3, journals=2, max_steps=30),
    restarts=st.lists(st.integers(1, 5), max_size=3),
    ring=st.integers(0, 6),
)
def test_read_committed_matches_the_model(history, restarts, ring) -> None:
    client = fresh_client()
    try:
        run = run_history(client, JOURNALS, history)
        for name in JOURNALS:
            delivered = read_committed_with_restarts(client, name, restarts, buffer=ring)
            assert_exactly_once(
                run.model.committed_in(name), delivered, output_key=lambda e: e.message.doc["id"]
            )
            by_producer_id: dict[bytes, list[int]] = {}
            for e in delivered:
                by_producer_id.setdefault(e.producer, []).append(e.clock)
            # Per producer ID, delivery follows clock order (a crash starts a new ID).
            assert all(c == sorted(c) for c in by_producer_id.values())
    finally:
        client.close()


def test_assert_exactly_once_reports_missing_doubled_and_extra() -> None:
    assert_exactly_once([1, 2, 3], [3, 1, 2])
    with pytest.raises(ExactlyOnceViolation) as info:
        assert_exactly_once([1, 2, 3], [1, 1, 2, 9])
    err = info.value
    assert err.missing == [3] and err.doubled == {1: 2} and err.extra == [9]
    assert "1 missing" in str(err) and "more than once" in str(err) and "unexpected" in str(err)
    with pytest.raises(ValueError, match="distinct keys"):
        assert_exactly_once([1, 1], [1])


def test_model_semantics() -> None:
    m = ReadCommittedModel()
    m.publish_committed("p", "j", 1)
    m.publish_uncommitted("p", "j", 2)
    m.publish_uncommitted("q", "j", 3)
    with pytest.raises(ValueError, match="roll them back"):
        m.publish_committed("p", "j", 4)
    m.rollback("p")
    m.commit("q")
    m.publish_uncommitted("p", "j", 5)
    m.crash("p")
    assert m.committed_keys() == [1, 3]
    assert [k for _, k in m.rolled_back] == [2, 5]


@settings(max_examples=30, deadline=None)
@given(msg=json_messages())
def test_json_message_strategy_round_trips(msg) -> None:
    framing = for_content_type(CONTENT_TYPE_JSON_LINES)
    frame = framing.marshal(msg)
    (env,) = framing.decode(frame, journal="j", final=True).envelopes
    assert env.message.doc == msg.doc


@settings(max_examples=30, deadline=None)
@given(rec=csv_records())
def test_csv_record_strategy_round_trips(rec) -> None:
    framing = for_content_type(CONTENT_TYPE_CSV)
    frame = framing.marshal(rec)
    (env,) = framing.decode(frame, journal="j", final=True).envelopes
    assert env.message.fields == rec.fields
