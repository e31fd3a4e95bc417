"""Multi-process races and SIGKILL crashes against one journal, on local disk and on S3.

Writers are separate processes running this file as a script (see `_worker`): they append
records `<writer>:<seq>:<filler>\\n` whose bytes the test can recompute, and print the
offsets of each append once `append` returned (i.e. once it is durable).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"


def record(writer: int, seq: int) -> bytes:
    """The bytes writer `writer` appends as its `seq`-th record (random length 0-150)."""
    rng = random.Random(writer * 1_000_003 + seq)
    filler = bytes(rng.choice(ALPHABET) for _ in range(rng.randrange(151)))
    return b"%d:%d:%s\n" % (writer, seq, filler)


@dataclass
class Writer:
    """A writer process and the append results it reported."""

    writer: int
    proc: subprocess.Popen[str]
    results: dict[int, tuple[int, int]] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)
    stats: dict[str, Any] = field(default_factory=dict)
    pump: threading.Thread | None = None

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut short by SIGKILL
            if line == "ready\n":
                self.ready.set()
            elif line.startswith("done "):
                self.stats = json.loads(line[5:])
            else:
                seq, begin, end = map(int, line.split())
                self.results[seq] = (begin, end)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()


def start_writer(
    target: Any, journal: str, writer: int, count: int, threads: int, crash_at: str = ""
) -> Writer:
    config = {
        "url": target.url,
        "options": target.storage_options,
        "journal": journal,
        "writer": writer,
        "count": count,
        "threads": threads,
        "crash_at": crash_at,
    }
    proc = subprocess.Popen(
        [sys.executable, __file__, json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    w = Writer(writer, proc)
    w.pump = threading.Thread(target=w._pump, daemon=True)
    w.pump.start()
    return w


def start_all(writers: list[Writer]) -> None:
    for w in writers:
        assert w.ready.wait(60), f"writer {w.writer} did not start"
    for w in writers:
        w.go()


def check_journal(
    client: Any, journal: str, writers: list[Writer]
) -> dict[tuple[int, int], tuple[int, int]]:
    """Read the whole journal (verifying every fragment's SHA1) and check every reported
    append is there once, at its offsets; returns where each record is."""
    content = client.read(journal).read()
    assert len(content) == client.head(journal)
    found: dict[tuple[int, int], tuple[int, int]] = {}
    offset = 0
    for line in content.splitlines(keepends=True):
        writer, seq, _ = line.split(b":", 2)
        key = (int(writer), int(seq))
        assert line == record(*key), f"record {key} at offset {offset} is corrupt"
        assert key not in found, f"record {key} appears twice: {found[key]} and {offset}"
        found[key] = (offset, offset + len(line))
        offset += len(line)
    assert offset == len(content)
    for w in writers:
        for seq, span in w.results.items():
            assert found.get((w.writer, seq)) == span, f"acknowledged append {(w.writer, seq)} lost"
    frags = client.fragments(journal)
    assert [f.begin for f in frags[1:]] == [f.end for f in frags[:-1]]
    return found


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_four_processes_racing_on_one_journal(request: pytest.FixtureRequest, backend: str) -> None:
    """Local disk: 4 x 500 appends. S3 (moto, one Python process serving every request at
    ~100 requests/s here): 4 x 40 appends, still from 4 processes started together, each
    append its own fragment, so most claims are contended."""
    target = request.getfixturevalue(f"{backend}_store")
    count = 500 if backend == "local" else 40
    client = target.open()
    from oncelog.journal import FragmentSpec, JournalSpec

    client.create(JournalSpec("race/part-000", fragment=FragmentSpec(length=1)))
    writers = [start_writer(target, "race/part-000", w, count, threads=1) for w in range(4)]
    start_all(writers)
    for w in writers:
        assert w.proc.wait(180) == 0
        assert w.pump is not None
        w.pump.join(10)
    found = check_journal(target.open(), "race/part-000", writers)
    assert sorted(found) == [(w, s) for w in range(4) for s in range(count)]
    assert sum(len(w.results) for w in writers) == 4 * count
    # The writers really raced: claims were lost and retried at the new head.
    assert sum(w.stats["races_lost"] for w in writers) > 0
    # Losers renamed their objects to the new offsets instead of writing them again: every
    # byte of the journal was sent to storage once, however many races were lost.
    assert sum(w.stats["fragment_bytes"] for w in writers) == client.head("race/part-000")
    # ...and left no unclaimed object behind (only identical-named ones could remain).
    assert client.gc("race/part-000", grace=0) == []
    # A Gazette reader of the fragments alone (no claims) sees the same journal.
    assert gazette_view(target, "race/part-000") == client.read("race/part-000").read()
    client.close()


def gazette_view(target: Any, journal: str) -> bytes:
    """The journal as a Gazette broker's fragment index would serve it: the fragment files
    listed under the journal's directory (claims and specs ignored), each checked against
    the SHA1 in its name, tiling the journal from offset 0 with no gap or overlap."""
    from oncelog.journal import JournalClient
    from oncelog.journal.fragment import content_sum

    probe = target.open()
    try:
        fragments = probe.store.list_fragments(journal)
        parts = []
        offset = 0
        for fragment in fragments:
            assert fragment.begin == offset, f"gap or overlap at {fragment.content_name}"
            data = probe.store.read_fragment(fragment)
            assert content_sum(data) == fragment.sum and len(data) == fragment.content_length
            parts.append(data)
            offset = fragment.end
        as_gazette = JournalClient(probe.fs, probe.root)
        try:
            assert [f.content_name for f in as_gazette.store.list_fragments(journal)] == [
                f.content_name for f in fragments
            ]
        finally:
            as_gazette.close()
        return b"".join(parts)
    finally:
        probe.close()


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_writers_killed_at_random_points_lose_nothing_acknowledged(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """Rounds of two writer processes (three appending threads each) killed with SIGKILL at
    random moments: 4 rounds on local disk, where partial files are the danger, 1 on S3."""
    target = request.getfixturevalue(f"{backend}_store")
    rounds = 4 if backend == "local" else 1
    rng = random.Random()
    client = target.open()
    from oncelog.journal import FragmentSpec, JournalSpec

    client.create(JournalSpec("crash/part-000", fragment=FragmentSpec(length=600)))
    everyone: list[Writer] = []
    for r in range(rounds):
        writers = [
            start_writer(target, "crash/part-000", 10 * r + k, count=0, threads=3) for k in range(2)
        ]
        everyone += writers
        start_all(writers)
        for w in writers:
            deadline = time.monotonic() + 60
            while len(w.results) < 5 and time.monotonic() < deadline and w.proc.poll() is None:
                time.sleep(0.01)
        for w in writers:
            time.sleep(rng.uniform(0.0, 0.4))
            w.proc.send_signal(signal.SIGKILL)
        for w in writers:
            w.proc.wait(30)
            assert w.pump is not None
            w.pump.join(10)
            assert w.proc.returncode == -signal.SIGKILL
    assert all(len(w.results) >= 5 for w in everyone)
    # The journal is still appendable after the crashes, by a fresh writer.
    final = start_writer(target, "crash/part-000", 999, count=10, threads=1)
    start_all([final])
    assert final.proc.wait(120) == 0
    assert final.pump is not None
    final.pump.join(10)
    everyone.append(final)
    reader = target.open()  # a cold client: loads every claim from the store
    before = check_journal(reader, "crash/part-000", everyone)
    assert {k for k in before if k[0] == 999} == {(999, s) for s in range(10)}
    # Debris of the killed writers (unclaimed fragments, temporary files) is collectable,
    # and collecting it leaves the journal unchanged.
    client.gc("crash/part-000", grace=0)
    claimed = {f.content_name for f in client.fragments("crash/part-000")}
    listed = {f.content_name for f in client.store.list_fragments("crash/part-000")}
    assert listed == claimed
    assert check_journal(reader, "crash/part-000", everyone) == before
    client.close()


@pytest.mark.parametrize("phase", ["fragment-written", "claim-temp-written", "claim-created"])
def test_writer_killed_inside_the_protocol_leaves_a_consistent_journal(
    local_store: Any, phase: str
) -> None:
    """SIGKILL at exact points of the append protocol on local disk (the writer kills itself
    on its 3rd fragment): after storing the fragment, after writing the claim's temporary
    file, and after creating the claim but before the append returned."""
    client = local_store.open()
    from oncelog.journal import FragmentSpec, JournalSpec

    client.create(JournalSpec("kill/part-000", fragment=FragmentSpec(length=1)))
    victim = start_writer(local_store, "kill/part-000", 1, count=10, threads=1, crash_at=phase)
    start_all([victim])
    assert victim.proc.wait(60) == -signal.SIGKILL
    assert victim.pump is not None
    victim.pump.join(10)
    assert sorted(victim.results) == [0, 1]
    survivor = start_writer(local_store, "kill/part-000", 2, count=3, threads=1)
    start_all([survivor])
    assert survivor.proc.wait(60) == 0
    assert survivor.pump is not None
    survivor.pump.join(10)
    reader = local_store.open()
    found = check_journal(reader, "kill/part-000", [victim, survivor])
    victim_records = sorted(s for w, s in found if w == 1)
    # The third append is in the journal only if its claim was created.
    assert victim_records == ([0, 1, 2] if phase == "claim-created" else [0, 1])
    store_dir = local_store.url
    debris = [
        name
        for _, _, files in os.walk(store_dir)
        for name in files
        if name.startswith(".tmp-")
    ]
    assert bool(debris) == (phase == "claim-temp-written")
    removed = client.gc("kill/part-000", grace=0)
    assert len(removed) == (1 if phase in ("fragment-written", "claim-temp-written") else 0)
    assert not [n for _, _, files in os.walk(store_dir) for n in files if n.startswith(".tmp-")]
    assert check_journal(reader, "kill/part-000", [victim, survivor]) == found


def _install_crash(client: Any, phase: str) -> None:
    """Make this writer process SIGKILL itself at `phase` of its 3rd fragment."""
    backend = client.store.backend
    local = getattr(backend, "inner", backend)  # the LocalBackend under the retrying reads
    fragments = [0]
    write, write_temp, create = backend.write, local._write_temp, backend.create
    write_staged = local.write_staged

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def spy_write(path: str, data: Any) -> None:
        write(path, data)
        fragments[0] += 1
        if phase == "fragment-written" and fragments[0] == 3:
            die()

    def spy_write_staged(path: str, staged: Any) -> None:
        write_staged(path, staged)
        fragments[0] += 1
        if phase == "fragment-written" and fragments[0] == 3:
            die()

    def spy_write_temp(directory: str, data: Any) -> str:
        tmp = write_temp(directory, data)
        if phase == "claim-temp-written" and fragments[0] == 3 and "claims" in directory:
            die()
        return tmp

    def spy_create(path: str, data: bytes) -> bool:
        created = create(path, data)
        if phase == "claim-created" and fragments[0] == 3:
            die()
        return created

    backend.write, local._write_temp, backend.create = spy_write, spy_write_temp, spy_create
    local.write_staged = spy_write_staged  # fragments are staged, then named (local disk)


def _count_fragment_bytes(client: Any) -> list[int]:
    """Count the fragment bytes this process sends to storage (staged or written)."""
    from oncelog.journal.backends import StagedFile

    store = client.store
    count = [0]
    stage, write = store.stage_fragment, store.write_fragment

    def counting_stage(journal: str, data: Any) -> Any:
        count[0] += len(data)
        return stage(journal, data)

    def counting_write(fragment: Any, data: Any) -> None:
        if not isinstance(data, StagedFile):  # staged bytes were counted when staged
            count[0] += len(data)
        write(fragment, data)

    store.stage_fragment, store.write_fragment = counting_stage, counting_write
    return count


def _worker(config: dict[str, Any]) -> None:
    """Append records until `count` (0: forever), printing `seq begin end` per durable append."""
    import itertools

    from oncelog.journal import open_journals

    client = open_journals(config["url"], **config["options"])
    if config.get("crash_at"):
        _install_crash(client, config["crash_at"])
    fragment_bytes = _count_fragment_bytes(client)
    journal, writer, count = config["journal"], config["writer"], config["count"]
    print("ready", flush=True)
    sys.stdin.readline()
    seqs = itertools.count()
    lock = threading.Lock()

    def run() -> None:
        while True:
            seq = next(seqs)
            if count and seq >= count:
                return
            result = client.append(journal, record(writer, seq))
            with lock:
                sys.stdout.write(f"{seq} {result.begin} {result.end}\n")
                sys.stdout.flush()

    threads = [threading.Thread(target=run) for _ in range(config["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appender = client._appenders[journal]
    stats = {
        "races_lost": appender.races_lost,
        "fragments": appender.fragments_written,
        "fragment_bytes": fragment_bytes[0],
    }
    client.close()
    print("done " + json.dumps(stats), flush=True)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
