"""Integrity at memory speed: whole-fragment reads check the CRC-32Cs of their claim instead
of the SHA1 (which stays in the name), falling back to the SHA1 without them; the full check
`JournalClient.verify` / `oncelog journals verify`; `gc --dry-run`."""

from __future__ import annotations

import os
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
)
from oncelog.journal import fragment as fragment_module
from oncelog.journal._blocks import block_sums
from oncelog.journal.fragment import Codec, content_sum, encode
from oncelog.journal.store import Claim


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
    assert "name a journal" in cli.error("journals", "verify", rc=2)


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
