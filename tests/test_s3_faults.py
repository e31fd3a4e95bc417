"""Exactly-once on S3 under real HTTP faults: a proxy on 127.0.0.1 in front of the S3 test
server answers 500/503/409, resets connections, loses replies of requests the server applied
and truncates bodies; oncelog must neither lose nor double anything, and must never report
a write it made as lost."""

from __future__ import annotations

import pytest
from consumer_support import (
    committed_echo,
    create_journals,
    echo_consumer,
    expected_echo,
    write_upstream,
)

from oncelog.journal import JournalExists, JournalSpec, StorageUnavailable
from oncelog.testing.faults import (
    CONDITIONAL_CONFLICT,
    INTERNAL_ERROR,
    LOST_REPLY,
    RESET,
    SERVICE_UNAVAILABLE,
    SLOW_DOWN,
    Fault,
    FaultRule,
)
from oncelog.testing.fixtures import FaultTarget

pytestmark = [pytest.mark.s3, pytest.mark.fault]


@pytest.mark.parametrize("retries", [True, False], ids=["library-retries", "no-retries"])
def test_create_whose_reply_was_lost_is_not_reported_as_exists(
    s3_fault_proxy: FaultTarget, retries: bool
) -> None:
    rule = s3_fault_proxy.proxy.add_rule(
        FaultRule(LOST_REPLY, method="PUT", key=r"spec\.json$", times=1)
    )
    with s3_fault_proxy.open(retries=retries, retry_timeout=10) as client:
        spec = client.create(JournalSpec("lost/spec"))
        assert client.get("lost/spec").incarnation == spec.incarnation
        with pytest.raises(JournalExists):
            client.create(JournalSpec("lost/spec"))
    assert rule.fired == 1


def test_checkpoint_write_survives_409_conflicts_and_lost_replies(
    s3_fault_proxy: FaultTarget,
) -> None:
    proxy = s3_fault_proxy.proxy
    conflicts = proxy.add_rule(
        FaultRule(CONDITIONAL_CONFLICT, method="PUT", key=r"\.oncelog/objs/a$", times=3)
    )
    lost = proxy.add_rule(FaultRule(LOST_REPLY, method="PUT", key=r"\.oncelog/objs/b$", times=1))
    with s3_fault_proxy.open(retries=False, retry_timeout=10) as client:
        assert client.meta.put_if_absent("objs/a", b"mine-a")
        assert client.meta.put_if_absent("objs/b", b"mine-b")
        assert not client.meta.put_if_absent("objs/b", b"theirs")
    assert conflicts.fired == 3 and lost.fired == 1
    proxy.add_rule(FaultRule(CONDITIONAL_CONFLICT, method="PUT", key=r"\.oncelog/objs/c$"))
    with s3_fault_proxy.open(retries=False, retry_timeout=1) as client:
        with pytest.raises(StorageUnavailable, match="outcome is unknown") as info:
            client.meta.put_if_absent("objs/c", b"x")
        assert info.value.outcome_known is False


def test_first_append_of_a_fresh_client_survives_a_500_on_its_spec(
    s3_fault_proxy: FaultTarget,
) -> None:
    with s3_fault_proxy.direct().open() as setup:
        setup.create(JournalSpec("fresh/j"))
    rule = s3_fault_proxy.proxy.add_rule(
        FaultRule(INTERNAL_ERROR, method="GET", key=r"spec\.json$", times=1)
    )
    with s3_fault_proxy.open(retries=False, retry_timeout=10) as client:
        assert client.append("fresh/j", b"x\n").end == 2
    assert rule.fired == 1
    with s3_fault_proxy.direct().open() as check:
        assert check.read("fresh/j").read() == b"x\n"


def test_truncated_fragment_bodies_are_errors_or_retried_never_short_data(
    s3_fault_proxy: FaultTarget,
) -> None:
    data = b"".join(b'{"n":%d}\n' % i for i in range(2000))
    with s3_fault_proxy.direct().open() as setup:
        setup.create(JournalSpec("trunc/j"))
        setup.append("trunc/j", data)
    rule = s3_fault_proxy.proxy.add_rule(
        FaultRule(Fault.truncate(), method="GET", key=r"/trunc/j/[0-9a-f]{16}-", times=2)
    )
    with s3_fault_proxy.open(retries=False, retry_timeout=10) as client:
        assert client.read("trunc/j").read() == data
        assert client.read("trunc/j", offset=5000).read() == data[5000:]
    assert rule.fired == 2


def test_lost_race_moves_the_fragment_despite_a_lost_copy_reply(
    s3_fault_proxy: FaultTarget,
) -> None:
    """A writer that loses a claim race renames its fragment to the new offsets with a
    server-side copy; the copy's reply is lost (the server made the copy), the retry must
    neither fail nor leave an unclaimed object, and the journal reads back whole."""
    with s3_fault_proxy.direct().open() as setup:
        setup.create(JournalSpec("lostmove/j"))
    with s3_fault_proxy.open(retries=False, retry_timeout=10) as a:
        assert a.append("lostmove/j", b"first\n").end == 6
        with s3_fault_proxy.direct().open() as b:
            assert b.append("lostmove/j", b"second\n").end == 13  # a's index is now stale
        # a claims offset 6, loses, and moves its object to 13-19: that copy's reply is lost.
        rule = s3_fault_proxy.proxy.add_rule(
            FaultRule(LOST_REPLY, method="PUT", key=r"/lostmove/j/000000000000000d-", times=1)
        )
        result = a.append("lostmove/j", b"third\n")
        assert (result.begin, result.end) == (13, 19)
        assert a._appender("lostmove/j").races_lost == 1
        assert rule.fired == 1
    with s3_fault_proxy.direct().open() as check:
        assert check.read("lostmove/j").read() == b"first\nsecond\nthird\n"
        assert check.gc("lostmove/j", grace=0) == []  # the loser's old name is gone


@pytest.mark.slow
def test_consumer_pipeline_under_random_faults_is_exactly_once(
    s3_fault_proxy: FaultTarget,
) -> None:
    """An echo consumer over the proxy with faults on a fifth of all requests (errors,
    conflicts, resets, lost replies) commits exactly what a crash-free run would."""
    with s3_fault_proxy.direct().open() as setup:
        create_journals(setup)
        write_upstream(setup, seed=5, transactions=10)
        expected = expected_echo(setup)
    proxy = s3_fault_proxy.proxy
    for i, fault in enumerate(
        (INTERNAL_ERROR, SLOW_DOWN, SERVICE_UNAVAILABLE, CONDITIONAL_CONFLICT, RESET, LOST_REPLY)
    ):
        method = "PUT" if fault in (CONDITIONAL_CONFLICT, LOST_REPLY) else None
        proxy.add_rule(FaultRule(fault, method=method, rate=0.04, seed=100 + i))
    with s3_fault_proxy.open(retries=True, retry_timeout=30) as client:
        consumer = echo_consumer(client, max_messages=4, keep_checkpoints=3)
        for _ in range(40):  # bounded: each run() recovers after a failure
            try:
                consumer.run(until_idle=True)
                break
            except Exception:  # noqa: BLE001 - a fault surfaced: recover and go on
                consumer.close()
                consumer = echo_consumer(client, max_messages=4, keep_checkpoints=3)
        else:
            pytest.fail("the consumer never got through the faults")
        consumer.close()
    assert sum(rule.fired for rule in proxy.rules) > 10
    with s3_fault_proxy.direct().open() as check:
        assert committed_echo(check) == expected
