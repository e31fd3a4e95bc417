"""Spec updates between processes: each change claims the next revision only if absent, so
of two concurrent updates one wins and the other writes nothing; a change interrupted
between its revision and spec.json is completed by the next update; lost replies of the
revision write are recognised by its token."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from typing import Any

import pytest

from oncelog.journal import JournalClient, JournalError, JournalSpec, _revisions
from oncelog.labels import LabelSet
from oncelog.testing.faults import LOST_REPLY, FaultRule
from oncelog.testing.fixtures import FaultTarget, StoreTarget


def label_lists(spec: JournalSpec) -> dict[str, list[str]]:
    return {
        k: [v] if isinstance(v, str) else list(v) for k, v in spec.labels.to_dict().items()
    }


def with_label(spec: JournalSpec, name: str, value: str) -> JournalSpec:
    labels = label_lists(spec)
    labels.setdefault(name, []).append(value)
    return replace(spec, labels=LabelSet(labels))


def values(spec: JournalSpec, name: str) -> list[str]:
    return sorted(label_lists(spec).get(name, []))


def test_an_update_racing_another_client_loses_nothing(store_url: StoreTarget) -> None:
    """B's whole update lands inside A's (between A's read and A's write, as another process
    would): A must be refused (and succeed on re-reading), never overwrite B's change."""
    a, b = store_url.open(), store_url.open()
    try:
        a.create(JournalSpec("upd/race"))
        backend: Any = a.store.backend
        fired = []

        def interfere() -> None:
            if not fired:
                fired.append(True)
                spec = b.get("upd/race")
                b.update(with_label(spec, "by", "b"), expect=spec)

        real_create, real_write = backend.create, backend.write

        def create(path: str, data: bytes) -> bool:
            if "/revisions/" in path:
                interfere()
            return bool(real_create(path, data))

        def write(path: str, data: Any) -> None:
            if path.endswith("spec.json"):
                interfere()
            real_write(path, data)

        backend.create, backend.write = create, write
        spec = a.get("upd/race")
        try:
            a.update(with_label(spec, "by", "a"), expect=spec)
        except JournalError as exc:
            assert "upd/race" in str(exc)
            spec = a.get("upd/race")
            a.update(with_label(spec, "by", "a"), expect=spec)
        assert fired
        assert values(store_url.open().get("upd/race"), "by") == ["a", "b"]
    finally:
        a.close()
        b.close()


WORKER = textwrap.dedent(
    """
    import sys
    from dataclasses import replace
    from oncelog.journal import JournalError, open_journals
    from oncelog.labels import LabelSet

    url, storage, who, count = sys.argv[1], eval(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    client = open_journals(url, **storage)
    conflicts = 0
    for i in range(count):
        for attempt in range(200):
            spec = client.get("upd/many")
            labels = {
                k: [v] if isinstance(v, str) else list(v)
                for k, v in spec.labels.to_dict().items()
            }
            labels.setdefault("seen", []).append(f"{who}-{i:03d}")
            try:
                client.update(replace(spec, labels=LabelSet(labels)), expect=spec)
                break
            except JournalError:
                conflicts += 1
        else:
            raise SystemExit(f"{who}: update {i} refused 200 times")
    print("conflicts", conflicts)
    """
)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_processes_updating_one_spec_lose_no_update(
    backend: str, request: pytest.FixtureRequest
) -> None:
    store: StoreTarget = request.getfixturevalue(f"{backend}_store")
    client = store.open()
    client.create(JournalSpec("upd/many"))
    count = 12
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, store.url, repr(store.storage_options), who,
             str(count)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for who in ("p", "q", "r")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    final = store.open().get("upd/many")
    expected = sorted(f"{w}-{i:03d}" for w in "pqr" for i in range(count))
    assert values(final, "seen") == expected
    newest = _revisions.latest(client, "upd/many", final.incarnation)
    assert newest is not None and newest.number == 3 * count
    assert newest.spec == final.to_json()
    client.close()


def test_an_update_cut_between_its_revision_and_spec_json_is_completed(
    journals: JournalClient,
) -> None:
    spec = journals.create(JournalSpec("upd/cut", labels={"ver": "1"}))
    backend: Any = journals.store.backend
    real_write = backend.write

    def crash(path: str, data: Any) -> None:
        raise KeyboardInterrupt("killed after the revision, before spec.json")

    backend.write = crash
    with pytest.raises(KeyboardInterrupt):
        journals.update(replace(spec, labels=LabelSet({"ver": "2"})))
    backend.write = real_write
    assert values(journals.get("upd/cut"), "ver") == ["1"]  # spec.json not written yet
    # The next update, based on what it reads, sees revision 1 and completes it first: an
    # update expecting the old spec is refused, one expecting the new spec succeeds.
    with pytest.raises(JournalError):
        journals.update(replace(spec, labels=LabelSet({"ver": "3"})), expect=spec)
    assert values(journals.get("upd/cut"), "ver") == ["2"]
    current = journals.get("upd/cut")
    journals.update(replace(current, labels=LabelSet({"ver": "3"})), expect=current)
    assert values(journals.get("upd/cut"), "ver") == ["3"]
    newest = _revisions.latest(journals, "upd/cut", spec.incarnation)
    assert newest is not None and newest.number == 2


def test_a_recreated_journal_starts_its_revisions_afresh(journals: JournalClient) -> None:
    spec = journals.create(JournalSpec("upd/again"))
    journals.update(replace(spec, labels=LabelSet({"ver": "1"})))
    journals.delete("upd/again")
    assert _revisions.latest(journals, "upd/again", spec.incarnation) is None
    again = journals.create(JournalSpec("upd/again"))
    journals.update(replace(again, labels=LabelSet({"ver": "2"})))
    newest = _revisions.latest(journals, "upd/again", again.incarnation)
    assert newest is not None and newest.number == 1
    assert values(journals.get("upd/again"), "ver") == ["2"]


@pytest.mark.s3
@pytest.mark.fault
def test_a_revision_whose_reply_was_lost_is_not_reported_as_a_conflict(
    s3_fault_proxy: FaultTarget,
) -> None:
    rule = s3_fault_proxy.proxy.add_rule(
        FaultRule(LOST_REPLY, method="PUT", key=r"/revisions/", times=1)
    )
    with s3_fault_proxy.open(retries=False, retry_timeout=10) as client:
        spec = client.create(JournalSpec("upd/lost"))
        client.update(replace(spec, labels=LabelSet({"ver": "1"})), expect=spec)
        assert values(client.get("upd/lost"), "ver") == ["1"]
    assert rule.fired == 1
