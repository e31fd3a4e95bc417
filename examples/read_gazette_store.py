"""Reading a Gazette broker's fragment store with oncelog.

A Gazette broker persists each journal as fragment files named
`<begin:016x>-<end:016x>-<sha1 of the content>.raw|gz`, optionally under path-postfix
directories such as `date=2024-01-01/`, with no oncelog spec or claims. This example
writes such a store by hand (as a broker would: three fragments, one gzipped, one
overlapped by a longer one), then reads it with oncelog: the raw bytes, every message
read-uncommitted, and read-committed, where only committed transactions are delivered,
each once. The store has no spec to name the journal's content type, so the reader is
given it (`with_content_type`).

    python examples/read_gazette_store.py [--store URL] [-o KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import tempfile
from typing import Any

import fsspec

from oncelog import (
    Flags,
    JournalClient,
    JournalNotFound,
    JournalSpec,
    build_uuid,
    clock_from_unix_ns,
    open_journals,
    read_committed,
    read_uncommitted,
)
from oncelog.options import storage_option_arg

NDJSON = "application/x-ndjson"
JOURNAL = "examples/gazette/events"
PRODUCERS = {"a": bytes.fromhex("01aaaaaaaaaa"), "b": bytes.fromhex("01bbbbbbbbbb"),
             "c": bytes.fromhex("01cccccccccc")}
BASE = clock_from_unix_ns(1_700_000_000 * 10**9)


def frame(producer: str, tick: int, flags: Flags, text: str | None = None) -> bytes:
    """One JSON-lines frame with a Gazette message UUID."""
    doc: dict[str, Any] = {"uuid": str(build_uuid(PRODUCERS[producer], BASE + tick * 16, flags))}
    if text is not None:
        doc["text"] = text
    return json.dumps(doc).encode() + b"\n"


def journal_content() -> tuple[list[bytes], list[str]]:
    """Three fragments' worth of frames, and the texts a read-committed reader must see."""
    first = [
        frame("a", 1, Flags.OUTSIDE_TXN, "a1: committed on its own"),
        frame("b", 5, Flags.OUTSIDE_TXN, "b0: committed on its own"),
        frame("b", 10, Flags.CONTINUE_TXN, "b1: rolled back later"),
        frame("a", 2, Flags.CONTINUE_TXN, "a2: in a's transaction"),
    ]
    second = [
        frame("a", 3, Flags.CONTINUE_TXN, "a3: in a's transaction"),
        frame("a", 4, Flags.ACK_TXN),  # commits a2 and a3
        first[0],  # a duplicate of a1, as a retried append leaves
        frame("b", 5, Flags.ACK_TXN),  # re-asserts b's last commit: b1 is rolled back
    ]
    third = [frame("c", 20, Flags.CONTINUE_TXN, "c1: never committed")]
    chunks = [b"".join(first), b"".join(second), b"".join(third)]
    committed = ["a1: committed on its own", "b0: committed on its own",
                 "a2: in a's transaction", "a3: in a's transaction"]
    return chunks, committed


def write_gazette_store(store: str, options: dict[str, Any]) -> bytes:
    """Write the journal's fragments as a Gazette broker names them; returns its bytes."""
    fs, root = fsspec.core.url_to_fs(store, **options)
    chunks, _ = journal_content()
    content = b"".join(chunks)
    begin = 0
    spans = []
    for i, chunk in enumerate(chunks):
        spans.append((begin, begin + len(chunk), i == 1))
        begin += len(chunk)
    # A broker may also persist an overlapping shorter fragment; readers take the longest.
    spans.append((0, len(chunks[0]) // 2, False))
    for begin, end, gzipped in spans:
        data = content[begin:end]
        name = f"{begin:016x}-{end:016x}-{hashlib.sha1(data).hexdigest()}"
        postfix = "date=2024-01-01/" if gzipped else ""
        path = f"{root.rstrip('/')}/{JOURNAL}/{postfix}{name}{'.gz' if gzipped else '.raw'}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "wb") as f:
            f.write(gzip.compress(data) if gzipped else data)
    return content


class with_content_type:
    """A JournalClient view that gives spec-less (Gazette) journals a content type, which
    oncelog's readers need to pick the framing."""

    def __init__(self, client: JournalClient, content_type: str) -> None:
        self._client, self._content_type = client, content_type

    def get(self, name: str) -> JournalSpec:
        try:
            return self._client.get(name)
        except JournalNotFound:
            return JournalSpec(name, {"content-type": self._content_type})

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._client, attr)


def run(store: str, options: dict[str, Any]) -> int:
    content = write_gazette_store(store, options)
    _, want = journal_content()
    with open_journals(store, **options) as raw_client:
        client = with_content_type(raw_client, NDJSON)
        print(f"fragments of {JOURNAL}:")
        for fragment in raw_client.fragments(JOURNAL):
            print(f"  [{fragment.begin:4d}, {fragment.end:4d})  {fragment.codec.name.lower()}")
        same_bytes = raw_client.read(JOURNAL).read() == content
        print(f"head {raw_client.head(JOURNAL)}; bytes read back identical: {same_bytes}")

        print("read uncommitted:")
        for env in read_uncommitted(client, JOURNAL):
            doc = env.message.doc
            flags = Flags(env.flags).name
            print(f"  @{env.begin:4d} {flags:<12} {doc.get('text', '(ACK)')}")
        got = [env.message.doc["text"] for env in read_committed(client, JOURNAL)]
        print("read committed:")
        for text in got:
            print(f"  {text}")
    ok = same_bytes and got == want
    print("committed messages exactly as expected:" if ok else "MISMATCH:", ok)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="fsspec URL or directory (default: temp dir)")
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], type=storage_option_arg,
        metavar="KEY=VALUE",
    )
    args = parser.parse_args(argv)
    options = dict(args.storage_option)
    if args.store is None:
        with tempfile.TemporaryDirectory(prefix="oncelog-gazette-") as tmp:
            return run(tmp, options)
    return run(args.store, options)


if __name__ == "__main__":
    sys.exit(main())
