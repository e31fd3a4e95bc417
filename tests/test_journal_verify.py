"""Integrity at memory speed: whole-fragment reads check the CRC-32Cs of their claim instead
of the SHA1 (which stays in the name), falling back to the SHA1 without them; the full check
`JournalClient.verify` / `oncelog journals verify`; `gc --dry-run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import crc32c
import orjson
import pytest
from journal_support import new_journal
from test_cli import Cli, _env
from test_journal_blocks import corrupt, fragment_of, rewrite_claim_without_sums

from oncelog.journal import (
    Fragment,
    FragmentChecksumError,
    JournalClient,
    VerifyReport,
    _blocks,
    compaction,
)
from oncelog.journal import fragment as fragment_module
from oncelog.journal import verify as verify_module
from oncelog.journal._blocks import block_sums
from oncelog.journal.errors import MissingFragment, StorageUnavailable
from oncelog.journal.fragment import Codec, content_sum, encode
from oncelog.journal.store import Claim
from oncelog.testing.fixtures import StoreTarget
from oncelog.testing.processes import run_python


@pytest.fixture
def sha1_calls() -> Iterator[list[int]]:
    """Lengths of the contents SHA1-checked by `fragment.verify` (the read path's SHA1)."""
    calls: list[int] = []
    real = fragment_module.content_sum

    def counting(data: Any) -> str:
        calls.append(len(data))
        return real(data)

    with mock.patch.object(fragment_module, "content_sum", counting):
        yield calls


@pytest.fixture
def small_blocks() -> Iterator[int]:
    with mock.patch.object(_blocks, "BLOCK_SIZE", 64):
        yield 64


def two_fragments(client: JournalClient, **spec: Any) -> tuple[str, bytes]:
    name = new_journal(client, **spec)
    head, data = b"h" * 100, bytes(range(250)) * 4  # fragments [0, 100) and [100, 1100)
    client.append(name, head)
    client.append(name, data)
    return name, head + data


# -- whole-fragment reads ------------------------------------------------------------------------


def test_whole_reads_check_crcs_and_never_the_sha1(
    store_url: Any, small_blocks: int, sha1_calls: list[int]
) -> None:
    client = store_url.open()
    try:
        name, whole = two_fragments(client)
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == whole
            assert fresh.read(name, offset=100).read() == whole[100:]
            assert sha1_calls == []
        finally:
            fresh.close()
        fragment = fragment_of(client, name, 500)
        corrupt(client, store_url.kind, fragment, 500)  # block 6: offsets 484-548
        fresh = store_url.open()
        try:
            with pytest.raises(FragmentChecksumError, match="CRC-32C") as info:
                fresh.read(name).read()
            message = str(info.value)
            assert repr(name) in message and fragment.content_name in message
            assert "offsets 484-548" in message
            assert sha1_calls == []
        finally:
            fresh.close()
    finally:
        client.close()


def test_whole_reads_fall_back_to_the_sha1_without_crcs(
    store_url: Any, small_blocks: int, sha1_calls: list[int]
) -> None:
    client = store_url.open()
    try:
        name, whole = two_fragments(client)
        fragment = fragment_of(client, name, 500)
        rewrite_claim_without_sums(client, name, fragment.begin)
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == whole
            assert sha1_calls == [1000]  # only the fragment whose claim has no sums
        finally:
            fresh.close()
        corrupt(client, store_url.kind, fragment, 500)
        fresh = store_url.open()
        try:
            with pytest.raises(FragmentChecksumError, match="SHA1") as info:
                fresh.read(name).read()
            assert repr(name) in str(info.value) and "offsets 100-1100" in str(info.value)
        finally:
            fresh.close()
    finally:
        client.close()


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_fragments_check_the_stored_crc_before_decompressing(
    store_url: Any, compression: str, sha1_calls: list[int]
) -> None:
    client = store_url.open()
    try:
        name, whole = two_fragments(client, compression=compression)
        fragment = fragment_of(client, name, 500)
        claim = client.store.read_claim(name, fragment.begin)
        stored = client.store.backend.read(client.store.fragment_path(fragment))
        assert claim is not None and claim.blocks is None
        assert claim.stored_crc32c == crc32c.crc32c(stored)
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == whole
            assert fresh.read(name, offset=700).read() == whole[700:]
            assert sha1_calls == []
        finally:
            fresh.close()
        bad = bytearray(stored)
        bad[len(bad) // 2] ^= 0x55
        client.store.fs.pipe_file(client.store.fragment_path(fragment), bytes(bad))
        fresh = store_url.open()
        try:
            with pytest.raises(FragmentChecksumError, match="stored object") as info:
                fresh.read(name).read()
            assert repr(name) in str(info.value) and "offsets 100-1100" in str(info.value)
        finally:
            fresh.close()
    finally:
        client.close()


def test_claims_round_trip_the_stored_crc() -> None:
    name = f"{0:016x}-{250:016x}-{'ab' * 20}.zst"
    claim = Claim(0, name, "w", "inc", None, 0x0BAD_CAFE)
    assert orjson.loads(claim.to_bytes())["stored_crc32c"] == "0badcafe"
    assert Claim.from_bytes("j", 0, claim.to_bytes()) == claim
    for bad in ("0BADCAFE", "badcafe", 7, None):
        doc = orjson.dumps({"fragment": name, "writer": "w", "stored_crc32c": bad})
        with pytest.raises(Exception, match="stored_crc32c"):
            Claim.from_bytes("j", 0, doc)


# -- verify ----------------------------------------------------------------------------------


def test_verify_passes_a_healthy_journal(journals: JournalClient) -> None:
    name, whole = two_fragments(journals)
    gz, _ = two_fragments(journals, compression="gzip")
    seen: list[tuple[int, int]] = []
    report = journals.verify(name, progress=lambda done, total: seen.append((done, total)))
    assert isinstance(report, VerifyReport) and report.ok
    assert (report.fragments, report.bytes, report.head) == (2, len(whole), len(whole))
    assert seen == [(0, 1100), (100, 1100), (1100, 1100)]
    assert journals.verify(gz).ok


def test_verify_finds_corrupt_content_missing_fragments_and_gaps(
    store_url: Any, small_blocks: int
) -> None:
    client = store_url.open()
    try:
        name, _ = two_fragments(client)
        client.append(name, b"third")  # [1100, 1105)
        client.append(name, b"fourth")  # [1105, 1111)
        second = fragment_of(client, name, 500)
        corrupt(client, store_url.kind, second, 500)
        third = fragment_of(client, name, 1100)
        client.store.delete_fragments([third])
        fourth = fragment_of(client, name, 1105)
        client.store.delete_claims(name, [fourth.begin])  # offsets 1105-1200: no claim
        client.store.backend.create(
            client.store.claim_path(name, 1200),
            Claim(1200, f"{1200:016x}-{1205:016x}-{content_sum(b'fifth')}.raw", "w").to_bytes(),
        )
        client.store.write_fragment(Fragment(name, 1200, 1205, content_sum(b"fifth")), b"fifth")
        report = client.verify(name)
        assert not report.ok
        by_fragment = {p.fragment: p for p in report.problems}
        bad = by_fragment[second.content_name]
        assert (bad.journal, bad.begin, bad.end) == (name, 100, 1100)
        assert "SHA1" in bad.what and "offsets 484-548" in bad.what and "CRC-32C" in bad.what
        missing = by_fragment[third.content_name]
        assert (missing.begin, missing.end) == (1100, 1105) and "missing" in missing.what
        gaps = [p for p in report.problems if p.what.startswith("gap")]
        assert [(g.begin, g.end) for g in gaps] == [(1105, 1200)]
        assert report.fragments == 2  # the first and the hand-made one at 1200
    finally:
        client.close()


def test_verify_finds_a_fragment_whose_crcs_match_but_sha1_does_not(
    store_url: Any, small_blocks: int, sha1_calls: list[int]
) -> None:
    """A writer that named its bytes wrongly (or a fragment copied under another name with
    sums recomputed): readers' CRC checks pass, only the full check sees it."""
    client = store_url.open()
    try:
        name = new_journal(client)
        data = b"the bytes stored\n" * 10
        lie = Fragment(name, 0, len(data), content_sum(b"other bytes, same length".ljust(170)))
        client.store.write_fragment(lie, data)
        claim = Claim(0, lie.content_name, "w", "", block_sums(data, small_blocks))
        assert client.store.create_claim(name, claim)
        fresh = store_url.open()
        try:
            assert fresh.read(name).read() == data  # CRCs match: readers accept it
            assert sha1_calls == []
            report = fresh.verify(name)
        finally:
            fresh.close()
        (problem,) = report.problems
        assert (problem.journal, problem.fragment) == (name, lie.content_name)
        assert (problem.begin, problem.end) == (0, len(data))
        assert "SHA1" in problem.what and "CRC" not in problem.what
    finally:
        client.close()


def test_verify_checks_compressed_fragments_both_ways(store_url: Any) -> None:
    client = store_url.open()
    try:
        name = new_journal(client, compression="zstd")
        data = b"x" * 300
        client.append(name, data)
        (fragment,) = client.fragments(name)
        path = client.store.fragment_path(fragment)
        other = encode(Codec.ZSTANDARD, b"y" * 300)  # decodes fine, wrong content and CRC
        client.store.fs.pipe_file(path, bytes(other))
        (problem,) = client.verify(name).problems
        assert "CRC-32C" in problem.what and "SHA1" in problem.what
    finally:
        client.close()


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def cli(local_store: Any) -> Iterator[Cli]:
    runner = Cli(local_store, _env(local_store.url))
    yield runner
    if runner._client is not None:
        runner._client.close()


def test_cli_verify_exit_status_and_output(cli: Cli) -> None:
    client = cli.client
    name, _ = two_fragments(client)
    ok = cli.run("journals", "verify", name)
    assert ok.stdout == b""
    summary = ok.stderr.decode()
    assert summary.startswith("oncelog: verify: 2 fragments (") and summary.endswith(
        "of 1 journal checked, 0 problems\n"
    )
    fragment = fragment_of(client, name, 500)
    corrupt(client, "local", fragment, 500)
    bad = cli.run("journals", "verify", name, rc=1)
    line = bad.stdout.decode().strip()
    assert name in line and fragment.content_name in line and "offsets 100-1100" in line
    assert "1 problem" in bad.stderr.decode()
    doc = orjson.loads(cli.run("journals", "verify", name, "--format", "json", rc=1).stdout)
    assert doc[0]["problems"][0]["fragment"] == fragment.content_name
    assert doc[0]["problems"][0]["begin"] == 100
    # Without a name: every journal of the store (the corrupt one among them).
    other = new_journal(client)
    client.append(other, b"fine\n")
    every = cli.run("journals", "verify", rc=1)
    assert fragment.content_name in every.stdout.decode()
    assert "of 2 journals checked, 1 problem" in every.stderr.decode()
    none = cli.run("journals", "verify", "--selector", "nothing=here", rc=0)
    assert "no journals match" in none.stderr.decode()


def test_cli_gc_dry_run_lists_what_gc_deletes_and_deletes_nothing(cli: Cli) -> None:
    client = cli.client
    name = new_journal(client)
    client.append(name, b"claimed\n")
    stray_data = b"never claimed\n"
    stray = Fragment(name, 8, 8 + len(stray_data), content_sum(stray_data))
    client.store.write_fragment(stray, stray_data)
    old = time.time() - 3 * 3600
    os.utime(os.path.join(cli.target.url, stray.content_path), (old, old))
    assert client.gc(name, grace=3600, dry_run=True) == [
        f for f in client.store.list_fragments(name) if f.content_name == stray.content_name
    ]
    dry = cli.run("gc", name, "--dry-run")
    assert dry.stdout.decode() == f"{stray.content_path}\n"
    assert "would delete 1 unclaimed fragment" in dry.stderr.decode()
    assert len(client.store.list_fragments(name)) == 2  # nothing deleted
    real = cli.run("gc", name)
    assert real.stdout == dry.stdout
    assert len(client.store.list_fragments(name)) == 1


# -- verify checks what readers read: after compaction, retirement and trims --------------------


def msg(i: int) -> bytes:
    return b'{"n": %d}\n' % i


def append_msgs(client: JournalClient, name: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        client.append(name, msg(i))


def read_all(client: JournalClient, name: str) -> bytes:
    with client.read(name) as reader:
        return reader.read()


def compacted(client: JournalClient, name: str, offset: int) -> Fragment:
    """The fragment of the newest compaction record holding `offset` (what readers read)."""
    fragment = fragment_of(client, name, offset)
    record, _, _ = compaction.newest_record(client.store, name)
    assert record is not None
    assert fragment.content_name in {f.content_name for f in record.fragments}
    return fragment


def verified(target: StoreTarget, name: str) -> VerifyReport:
    """Verify `name` from a cold client and check the report is clean and covers exactly
    what that client's readers read: the same fragments and bytes, from the first
    available offset to the head."""
    cold = target.open()
    try:
        report = cold.verify(name)
        assert report.problems == [] and report.ok
        fragments = cold.fragments(name)
        assert report.fragments == len(fragments)
        assert report.bytes == sum(f.content_length for f in fragments)
        assert report.begin == cold.first_offset(name)
        assert report.head == cold.head(name)
        assert len(read_all(cold, name)) == report.head - report.begin
        return report
    finally:
        cold.close()


def _compact(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 60)
    assert client.compact(name).record_won  # default grace: the small claims stay a while


def _compact_retire_now(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 60)
    assert client.compact(name, retire_grace=0).retired is not None
    append_msgs(client, name, 5, 60)  # claims after the record


def _gc(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 60)
    client.compact(name)
    client.gc(name, grace=0)  # retires what the record covers


def _trim_by_offset(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 30)  # 290 bytes, compacted into [0, 100), [100, 200), [200, 290)
    client.compact(name, retire_grace=0)
    append_msgs(client, name, 10, 30)
    assert client.trim(name, before=150).first == 100  # inside the record


def _trim_past_the_record(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 30)
    client.compact(name, retire_grace=0)
    append_msgs(client, name, 10, 30)
    point = client.head(name) - 25
    assert client.trim(name, before=point).first > 290  # claims after the record


def _trim_without_compaction(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 20)
    assert client.trim(name, before=100).first == 100


def _trim_during_compaction(client: JournalClient, name: str) -> None:
    append_msgs(client, name, 30)
    client.compact(name, retire_grace=0)
    append_msgs(client, name, 20, 30)
    trimmed: list[int] = []

    def trim_once(done: int, total: int) -> None:
        if not trimmed:
            trimmed.append(client.trim(name, before=150).first)

    client.compact(name, retire_grace=0, progress=trim_once)
    assert trimmed and trimmed[0] > 0


MAINTENANCE = {
    "compact": _compact,
    "compact-retire-0": _compact_retire_now,
    "gc": _gc,
    "trim-offset": _trim_by_offset,
    "trim-past-record": _trim_past_the_record,
    "trim-no-record": _trim_without_compaction,
    "trim-during-compact": _trim_during_compaction,
}


S3_MAINTENANCE = ("compact", "gc", "trim-during-compact")
"""The kinds also run on the S3 test server (its listings and conditional writes); the
others differ from these only in what the journal layer does, the same on every store."""


@pytest.mark.parametrize(
    ("store", "maintenance"),
    [(store, kind) for store in ("memory", "local") for kind in MAINTENANCE]
    + [("s3", kind) for kind in S3_MAINTENANCE],
)
def test_verify_is_clean_after_maintenance(
    request: pytest.FixtureRequest, store: str, maintenance: str
) -> None:
    store_url: StoreTarget = request.getfixturevalue(f"{store}_store")
    client = store_url.open()
    try:
        name = new_journal(client, length=100)
        MAINTENANCE[maintenance](client, name)
        report = verified(store_url, name)
        # Claims below the record's end are left for retirement (the one at the highest
        # offset below it always): counted, never checked.
        assert report.retiring >= 1
        if maintenance == "compact":
            assert report.retiring == 60 and report.fragments < 10
    finally:
        client.close()


def test_verify_is_clean_after_trim_by_retention(local_store: StoreTarget) -> None:
    client = local_store.open()
    try:
        name = new_journal(client, length=100, retention=3600)
        append_msgs(client, name, 30)
        old = time.time() - 2 * 3600
        for fragment in client.store.list_fragments(name):  # written two hours ago
            os.utime(os.path.join(local_store.url, fragment.content_path), (old, old))
        client.compact(name, retire_grace=0)
        through = client.head(name)
        append_msgs(client, name, 10, 30)
        assert client.trim(name).first == through  # the record's fragments are too old
        report = verified(local_store, name)
        assert report.begin == through and report.fragments == 10
    finally:
        client.close()


def test_verify_reports_a_corrupt_compacted_fragment_as_readers_do(
    store_url: StoreTarget, small_blocks: int
) -> None:
    client = store_url.open()
    try:
        name = new_journal(client, length=200)
        append_msgs(client, name, 60)
        client.compact(name)  # the small fragments stay (grace): they must not be checked
        fragment = compacted(client, name, 300)
        corrupt(client, store_url.kind, fragment, 300)
        report = client.verify(name)
        (problem,) = report.problems
        assert (problem.journal, problem.fragment) == (name, fragment.content_name)
        assert (problem.begin, problem.end) == (fragment.begin, fragment.end)
        assert "SHA1" in problem.what and "CRC-32C" in problem.what
        lo = fragment.begin + (300 - fragment.begin) // 64 * 64
        assert f"offsets {lo}-{min(lo + 64, fragment.end)}" in problem.what
        assert "compaction record" in problem.what
        text = str(problem)
        assert repr(name) in text and f"offsets {fragment.begin}-{fragment.end}" in text
        cold = store_url.open()
        try:
            with pytest.raises(FragmentChecksumError, match=fragment.content_name):
                read_all(cold, name)  # readers fail on the very same fragment
        finally:
            cold.close()
    finally:
        client.close()


def test_verify_reports_a_missing_compacted_fragment(store_url: StoreTarget) -> None:
    client = store_url.open()
    try:
        name = new_journal(client, length=200)
        append_msgs(client, name, 60)
        client.compact(name)
        fragment = compacted(client, name, 300)
        client.store.delete_fragments([fragment])
        (problem,) = client.verify(name).problems
        assert (problem.fragment, problem.begin, problem.end) == (
            fragment.content_name,
            fragment.begin,
            fragment.end,
        )
        assert "fragment missing" in problem.what and "compaction record" in problem.what
        cold = store_url.open()
        try:
            with pytest.raises(MissingFragment):
                read_all(cold, name)
        finally:
            cold.close()
    finally:
        client.close()


def test_verify_reports_a_corrupt_record(store_url: StoreTarget) -> None:
    client = store_url.open()
    try:
        name = new_journal(client, length=200)
        append_msgs(client, name, 60)
        through = client.compact(name).through
        append_msgs(client, name, 3, 60)
        (rec,) = compaction.list_records(client.store, name)
        path = compaction.record_path(client.store, name, rec.name)
        client.store.fs.pipe_file(path, b'{"journal": "not json')
        report = client.verify(name)
        (problem,) = report.problems
        assert problem.journal == name and rec.name in problem.fragment
        assert (problem.begin, problem.end) == (0, through)
        assert "cannot be parsed" in problem.what
        assert report.fragments == 3 and report.head == client.head(name)  # claims after it
        cold = store_url.open()
        try:
            with pytest.raises(compaction.CorruptRecord):
                read_all(cold, name)
        finally:
            cold.close()
    finally:
        client.close()


def test_verify_reports_a_gap_after_the_record(memory_store: StoreTarget) -> None:
    client = memory_store.open()
    try:
        name = new_journal(client, length=100)
        append_msgs(client, name, 30)
        through = client.compact(name, retire_grace=0).through
        append_msgs(client, name, 3, 30)
        client.store.delete_claims(name, [through])
        gaps = [p for p in client.verify(name).problems if p.what.startswith("gap")]
        assert [(g.begin, g.end) for g in gaps] == [(through, through + len(msg(30)))]
        assert "compaction record" in gaps[0].what
    finally:
        client.close()


def test_verify_starts_over_when_retirement_removes_what_it_was_about_to_read(
    store_url: StoreTarget,
) -> None:
    """A compaction (retiring at once) between verify's listing and its reads deletes a
    fragment of the record verify uses: no false "missing", the check starts over."""
    client = store_url.open()
    try:
        name = new_journal(client, length=100)
        append_msgs(client, name, 25)  # compacted into 100 + 100 + 40 bytes
        client.compact(name, retire_grace=0)
        (old,) = compaction.list_records(client.store, name)
        last = compacted(client, name, client.head(name) - 1)
        assert last.content_length < 100  # the next compaction merges it, and retires it
        append_msgs(client, name, 10, 25)
        seen: list[tuple[int, int]] = []

        def compact_once(done: int, total: int) -> None:
            seen.append((done, total))
            if done > 0 and len(seen) == 2:
                assert client.compact(name, retire_grace=0).record_won
                assert not any(f.content_name == last.content_name
                               for f in client.store.list_fragments(name))

        report = client.verify(name, progress=compact_once)
        assert report.ok, report.problems
        assert compaction.list_records(client.store, name)[-1].name != old.name
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # progress never goes back
        assert [t for _, t in seen] == sorted(t for _, t in seen)
        assert seen[-1][0] == seen[-1][1]
        verified(store_url, name)
    finally:
        client.close()


def test_verify_starts_over_when_a_trim_runs_meanwhile(store_url: StoreTarget) -> None:
    client = store_url.open()
    try:
        name = new_journal(client, length=100)
        append_msgs(client, name, 40)
        client.compact(name, retire_grace=0)
        trimmed: list[int] = []

        def trim_once(done: int, total: int) -> None:
            if done > 0 and not trimmed:
                trimmed.append(client.trim(name, before=300).first)

        report = client.verify(name, progress=trim_once)
        assert report.ok, report.problems
        assert trimmed and report.begin == trimmed[0] > 100
    finally:
        client.close()


def test_verify_gives_up_when_every_attempt_is_overtaken(memory_store: StoreTarget) -> None:
    """A trim on every attempt (after its first fragment) makes each one find fragments the
    new record no longer names: after a bounded number of attempts verify says to try
    again (StorageUnavailable), never reports those fragments missing."""
    client = memory_store.open()
    try:
        name = new_journal(client, length=20)
        append_msgs(client, name, 10, 10)  # ten fragments of 10 bytes...
        client.compact(name, retire_grace=0)  # ...compacted into pairs: 20 bytes each
        append_msgs(client, name, 50, 20)
        client.compact(name, retire_grace=0)
        totals: list[int] = []
        trims: list[int] = []

        def trim_each_attempt(done: int, total: int) -> None:
            if not totals or total != totals[-1]:
                totals.append(total)  # a new attempt (its total is added)
            elif len(trims) < len(totals) and done > 0:
                trims.append(client.trim(name, before=client.first_offset(name) + 45).first)

        with pytest.raises(StorageUnavailable, match="try again") as info:
            client.verify(name, progress=trim_each_attempt)
        assert repr(name) in str(info.value)
        assert len(totals) == len(trims) == verify_module._ATTEMPTS  # bounded
        assert trims == sorted(trims)
        verified(memory_store, name)  # once left alone, clean
    finally:
        client.close()


MAINTAINER = r"""
import json, sys
from oncelog.journal import open_journals
from oncelog.testing.faults import kill_after_writes
url, options, name, kill_at = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = open_journals(url, **options)
writes = kill_after_writes(client, kill_at)
client.compact(name, retire_grace=0)
client.trim(name, before=client.head(name) - 25)
print(writes(), flush=True)
"""


def test_verify_is_clean_after_a_maintainer_sigkilled_at_any_write(
    local_store: StoreTarget,
) -> None:
    """A compaction + retirement + trim killed after any of its writes (half-retired
    claims and fragments, a record without its deletions, unreferenced big fragments)
    leaves a journal that verify finds clean, checking exactly what readers read."""

    def run(kill_at: int) -> subprocess.CompletedProcess[str]:
        name = new_journal(client, length=100)
        append_msgs(client, name, 30)
        client.compact(name, retire_grace=0)
        append_msgs(client, name, 20, 30)
        proc = run_python(
            [sys.executable, "-c", MAINTAINER, local_store.url,
             orjson.dumps(local_store.storage_options).decode(), name, str(kill_at)],
            text=True, timeout=120,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        verified(local_store, name)
        return proc

    client = local_store.open()
    try:
        full = run(0)  # never killed: count its writes
        assert full.returncode == 0
        writes = int(full.stdout.split()[-1])
        assert writes >= 6, writes
        killed = 0
        for kill_at in range(1, writes + 1):  # after each write of the run
            killed += run(kill_at).returncode == -signal.SIGKILL
        assert killed == writes
    finally:
        client.close()


def test_cli_verify_after_maintenance(cli: Cli, small_blocks: int) -> None:
    client = cli.client
    name = new_journal(client, length=100)
    _trim_past_the_record(client, name)  # the claim kept below the record names a deleted
    ok = cli.run("journals", "verify", name)  # fragment: readers never read it; exit 0
    assert ok.stdout == b"" and ", 0 problems\n" in ok.stderr.decode()
    first = client.first_offset(name)
    doc = orjson.loads(cli.run("journals", "verify", name, "--format", "json").stdout)
    assert doc[0]["problems"] == [] and doc[0]["begin"] == first > 290
    assert doc[0]["retiring"] >= 1
    append_msgs(client, name, 10, 40)
    client.compact(name)
    fragment = compacted(client, name, first)
    corrupt(client, "local", fragment, first + 1)
    bad = cli.run("journals", "verify", name, rc=1)
    (line,) = bad.stdout.decode().splitlines()
    assert repr(name) in line and fragment.content_name in line
    assert f"offsets {fragment.begin}-{fragment.end}:" in line and "SHA1" in line
    assert ", 1 problem\n" in bad.stderr.decode()
