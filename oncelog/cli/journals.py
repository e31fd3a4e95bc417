"""Journal management: `journals create|list|describe|apply|edit|delete|verify|compact|trim`,
`fragments`, `head`, `gc`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.output import Column, notice, print_fields, print_table, progress, write_json
from oncelog.cli.params import (
    DURATION,
    LABEL,
    SIZE,
    format_duration,
    format_option,
    format_size,
    parse_size,
    plural,
    selector_option,
)

if TYPE_CHECKING:
    from oncelog.journal import Fragment, JournalSpec

__all__ = ["journals", "require_confirmation", "fragment_doc"]

_COMPRESSION_NAMES = {".raw": "none", ".gz": "gzip", ".zst": "zstd"}


def _parse_compact_after(text: str) -> int:
    """`--compact-after N`: a number of fragments (0: off). A size is refused with a clear
    message: the spec's setting (FragmentSpec.compact_after) counts fragments."""
    value = text.strip()
    if not value.isdigit():
        try:
            parse_size(value)
        except ValueError:
            pass
        else:
            raise ValueError(
                f"--compact-after counts fragments (e.g. 8), not bytes: {text!r} is a size"
            )
        raise ValueError(f"--compact-after counts fragments (e.g. 8): {text!r} is not a number")
    return int(value)


class _CompactAfter(click.ParamType[int]):
    """A click type for `--compact-after`."""

    name = "n"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return _parse_compact_after(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


_COMPACT_AFTER = _CompactAfter()


def require_confirmation(question: str, yes: bool, what: str) -> None:
    """Go on only if `--yes` was given or the user at the terminal says yes; with no
    terminal on stdin (and no --yes), refuse rather than guess."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(
            f"refusing to {what} without confirmation: stdin is not a terminal; pass --yes"
        )
    if not click.confirm(question, default=False, err=True):
        raise click.ClickException(f"did not {what}: not confirmed")


def _labels_text(spec: JournalSpec, skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.labels if k not in skip) or "-"


def fragment_doc(fragment: Fragment) -> dict[str, Any]:
    """A fragment as a JSON document."""
    from oncelog.cli.output import iso_time

    return {
        "journal": fragment.journal,
        "begin": fragment.begin,
        "end": fragment.end,
        "length": fragment.content_length,
        "sum": fragment.sum,
        "compression": _COMPRESSION_NAMES.get(fragment.codec.extension, fragment.codec.extension),
        "path": fragment.content_path,
        "stored_size": fragment.size,
        "mod_time": iso_time(fragment.mod_time),
    }


@cli.group()
def journals() -> None:
    """Create, list, describe and delete journals."""


@journals.command("create")
@click.argument("name")
@click.option(
    "--label", "-l", "labels", type=LABEL, multiple=True, help="A label NAME=VALUE; repeatable."
)
@click.option(
    "--content-type",
    "-t",
    default=None,
    help="Message framing: application/x-ndjson (default), text/csv or "
    "application/x-protobuf-fixed.",
)
@click.option(
    "--compression",
    type=click.Choice(["none", "gzip", "zstd"]),
    default="none",
    show_default=True,
    help="Codec of the journal's fragments.",
)
@click.option(
    "--fragment-length",
    type=SIZE,
    default=None,
    help="Roll fragments over at this size, e.g. 64MiB [default: 16MiB].",
)
@click.option(
    "--flush-interval",
    type=DURATION,
    default=None,
    help="How long an append may wait for others to share its fragment, e.g. 100ms [default: 0s].",
)
@click.option(
    "--retention",
    type=DURATION,
    default=None,
    help="Keep data this long, e.g. 30d or 720h; `journals trim NAME` (and automatic "
    "compaction) then deletes whole fragments older than that [default: forever].",
)
@click.option(
    "--compact-after",
    type=_COMPACT_AFTER,
    default=None,
    metavar="N",
    help="Compact the journal automatically once a writing client has seen N new small "
    "fragments since the last compaction [default: off].",
)
@click.option("--owner-role", default=None, help="Owner role, e.g. producer.")
@click.option("--owner-address", default=None, help="Owner address, e.g. a host or service URL.")
@click.option("--owner-description", default=None, help="Free-form owner description.")
@store_options
@pass_state
def create(
    state: State,
    name: str,
    labels: tuple[tuple[str, str], ...],
    content_type: str | None,
    compression: str,
    fragment_length: int | None,
    flush_interval: timedelta | None,
    retention: timedelta | None,
    compact_after: int | None,
    owner_role: str | None,
    owner_address: str | None,
    owner_description: str | None,
) -> None:
    """Create journal NAME."""
    from oncelog.framing import for_content_type
    from oncelog.journal import DEFAULT_FRAGMENT_LENGTH, FragmentSpec, JournalOwner, JournalSpec
    from oncelog.labels import CONTENT_TYPE, CONTENT_TYPE_JSON_LINES

    values: dict[str, list[str]] = {}
    for key, value in labels:
        values.setdefault(key, []).append(value)
    labelled = values.get(CONTENT_TYPE)
    if content_type is not None and labelled is not None and labelled != [content_type]:
        raise click.UsageError(
            f"--content-type {content_type!r} contradicts --label {CONTENT_TYPE}={labelled[0]}"
        )
    content_type = content_type or (labelled[0] if labelled else CONTENT_TYPE_JSON_LINES)
    for_content_type(content_type)  # unknown content types fail here, listing the known ones
    values[CONTENT_TYPE] = [content_type]
    fragment = FragmentSpec(
        length=fragment_length or DEFAULT_FRAGMENT_LENGTH,
        compression=compression,
        flush_interval=flush_interval.total_seconds() if flush_interval is not None else 0.0,
        compact_after=compact_after or 0,
        retention=retention.total_seconds() if retention is not None else 0.0,
    )
    owner = None
    if owner_role is not None or owner_address is not None or owner_description is not None:
        owner = JournalOwner(owner_role or "", owner_address or "", owner_description or "")
    spec = JournalSpec(name, values, fragment, owner)
    client = state.client()
    # A local store's directory is made by its first journal: say so, so that a mistyped
    # path shows up here rather than as an empty store later.
    backend = client.store.backend
    new_store = backend.creates_root and backend.missing_store() is not None
    client.create(spec)
    if new_store:
        notice(f"created a new store in directory {client.root}")
    notice(f"created journal {name} ({content_type})")


@journals.command("list")
@click.option(
    "--selector",
    "-l",
    default="",
    help="Gazette label selector, e.g. 'app=web, name:prefix=logs/'.",
)
@click.option(
    "--stats/--no-stats",
    default=True,
    show_default=True,
    help="Show each journal's write head and fragment count (a few listings per journal).",
)
@format_option
@store_options
@pass_state
def list_journals(state: State, selector: str, stats: bool, fmt: str) -> None:
    """List journals, optionally those matching a label selector, with their write heads
    and fragment counts."""
    client = state.client()
    specs = client.list(selector_option(selector))
    heads: list[tuple[int, int] | None] = [None] * len(specs)
    if stats and specs:
        from concurrent.futures import ThreadPoolExecutor

        def stat(spec: JournalSpec) -> tuple[int, int]:
            return client.head(spec.name), len(client.fragments(spec.name))

        with ThreadPoolExecutor(max_workers=min(8, len(specs))) as pool:
            heads = list(pool.map(stat, specs))
    if fmt == "json":
        docs = []
        for s, h in zip(specs, heads, strict=True):
            doc = s.to_dict()
            if h is not None:
                doc.update(head=h[0], fragments=h[1])
            docs.append(doc)
        write_json(docs)
        return
    from oncelog.labels import CONTENT_TYPE

    columns: list[Column | str] = ["NAME", "CONTENT-TYPE", "COMPRESSION"]
    columns.append(Column("FRAGMENT", numeric=True))
    if stats:
        columns += [Column("HEAD", numeric=True), Column("FRAGMENTS", numeric=True)]
    print_table(
        [*columns, "LABELS"],
        [
            (
                s.name,
                s.content_type,
                s.fragment.compression,
                format_size(s.fragment.length),
                *((h[0], h[1]) if h is not None else ()),
                _labels_text(s, (CONTENT_TYPE,)),
            )
            for s, h in zip(specs, heads, strict=True)
        ],
    )


@journals.command("describe")
@click.argument("name")
@format_option
@store_options
@pass_state
def describe(state: State, name: str, fmt: str) -> None:
    """Show journal NAME's spec, write head and fragments (a journal with fragments but no
    spec, such as a Gazette fragment store, is described without one)."""
    from oncelog.journal import JournalNotFound

    client = state.client()
    head = client.head(name)  # fails for a journal with neither spec nor fragments
    try:
        spec: JournalSpec | None = client.get(name)
    except JournalNotFound:
        spec = None
    frags = client.fragments(name)
    content = sum(f.content_length for f in frags)
    stored = sum(f.size or 0 for f in frags)
    begin = client.first_offset(name) if frags else head
    if fmt == "json":
        doc: dict[str, Any] = (
            spec.to_dict()
            if spec is not None
            else {"name": name, "labels": None, "fragment": None, "owner": None}
        )
        doc.update(
            head=head,
            begin=begin,
            fragments={"count": len(frags), "content_bytes": content, "stored_bytes": stored},
        )
        write_json(doc)
        return
    if spec is None:
        fields: list[tuple[str, Any]] = [
            ("name", name),
            ("spec", "none: fragments without an oncelog spec (a Gazette fragment store?)"),
        ]
    else:
        owner = spec.owner
        fields = [
            ("name", spec.name),
            ("labels", _labels_text(spec)),
            ("compression", spec.fragment.compression),
            ("fragment length", format_size(spec.fragment.length)),
            ("flush interval", format_duration(spec.fragment.flush_interval)),
            (
                "retention",
                format_duration(spec.fragment.retention) if spec.fragment.retention else "forever",
            ),
            (
                "compact after",
                plural(spec.fragment.compact_after, "fragment")
                if spec.fragment.compact_after
                else "off",
            ),
            (
                "owner",
                "-"
                if owner is None
                else f"role={owner.role or '-'} address={owner.address or '-'} "
                f"description={owner.description or '-'}",
            ),
        ]
    print_fields(
        [
            *fields,
            ("offsets", f"{begin}-{head}"),
            ("head", head),
            ("fragments", len(frags)),
            ("content bytes", f"{content} ({format_size(content)})"),
            ("stored bytes", f"{stored} ({format_size(stored)})"),
        ]
    )


@journals.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def delete(state: State, name: str, yes: bool) -> None:
    """Delete journal NAME with all its fragments (asks first unless --yes)."""
    client = state.client()
    client.get(name)  # an unknown journal fails before any question
    if not yes:
        frags = client.fragments(name)
        size = format_size(sum(f.size or 0 for f in frags))
        require_confirmation(
            f"Delete journal {name} and its {plural(len(frags), 'fragment')} ({size})?",
            yes,
            f"delete journal {name}",
        )
    with progress(f"deleting {name}", unit="none"):
        client.delete(name)
    notice(f"deleted journal {name}")


@journals.command("verify")
@click.argument("names", metavar="[NAME]...", nargs=-1)
@click.option(
    "--selector", "-l", default=None, help="Also verify the journals matching this selector."
)
@format_option
@store_options
@pass_state
def verify(state: State, names: tuple[str, ...], selector: str | None, fmt: str) -> None:
    """Check journals in full: every fragment readers read (the compaction record's, then the
    claimed ones) read whole and checked against the SHA1 in its name and the CRC-32Cs
    recorded for it; missing fragments, unreadable records and claims, and gaps.

    Without NAME or --selector, every journal of the store is checked. Prints one line per
    problem (journal, fragment, offsets, what) and exits with status 1 if any was found; a
    summary goes to stderr. Reads every byte of the journals.
    """
    client = state.client()
    targets = list(dict.fromkeys(names))
    if selector is not None or not targets:
        every = client.list(selector_option(selector or ""))
        targets += [s.name for s in every if s.name not in targets]
    if not targets:
        what = f"match {selector!r}" if selector is not None else "exist"
        notice(f"verify: no journals {what} in {client.root}: nothing to check")
        return
    reports = []
    with progress("verify", total=None) as bar:
        last = [0, 0]  # bytes of the current journal checked so far, and in all

        def advance(done: int, total: int) -> None:
            # The bar grows journal by journal (and when a check starts over).
            bar.add_total(total - last[1])
            bar.advance(done - last[0])
            last[0], last[1] = done, total

        for name in targets:
            bar.describe(f"verify {name}")
            last[0] = last[1] = 0
            report = client.verify(name, progress=advance)
            reports.append(report)
            if fmt != "json":
                for problem in report.problems:
                    click.echo(str(problem))
    problems = [p for r in reports for p in r.problems]
    if fmt == "json":
        write_json(
            [
                {
                    "journal": r.journal,
                    "fragments": r.fragments,
                    "bytes": r.bytes,
                    "begin": r.begin,
                    "head": r.head,
                    "retiring": r.retiring,
                    "problems": [
                        {
                            "journal": p.journal,
                            "fragment": p.fragment,
                            "begin": p.begin,
                            "end": p.end,
                            "what": p.what,
                        }
                        for p in r.problems
                    ],
                }
                for r in reports
            ]
        )
    checked = sum(r.fragments for r in reports)
    size = sum(r.bytes for r in reports)
    notice(
        f"verify: {plural(checked, 'fragment')} ({format_size(size)}) of "
        f"{plural(len(targets), 'journal')} checked, {plural(len(problems), 'problem')}"
    )
    if problems:
        from oncelog.cli.app import EXIT_ERROR

        raise click.exceptions.Exit(EXIT_ERROR)


@cli.command("fragments")
@click.argument("name")
@format_option
@store_options
@pass_state
def fragments(state: State, name: str, fmt: str) -> None:
    """List the fragments of journal NAME in offset order."""
    frags = state.client().fragments(name)
    docs = [fragment_doc(f) for f in frags]
    if fmt == "json":
        write_json(docs)
        return
    print_table(
        [
            Column("BEGIN", numeric=True),
            Column("END", numeric=True),
            Column("LENGTH", numeric=True),
            Column("STORED", numeric=True),
            "CODEC",
            "MODIFIED",
            "PATH",
        ],
        [
            (
                d["begin"],
                d["end"],
                d["length"],
                d["stored_size"],
                d["compression"],
                d["mod_time"],
                d["path"],
            )
            for d in docs
        ],
    )


@cli.command("head")
@click.argument("name")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help='text: the offset alone; json: {"journal": NAME, "head": OFFSET}.',
)
@store_options
@pass_state
def head(state: State, name: str, fmt: str) -> None:
    """Print the write head of journal NAME: the offset the next append begins at."""
    offset = state.client().head(name)
    if fmt == "json":
        write_json({"journal": name, "head": offset})
    else:
        click.echo(offset)


@cli.command("gc")
@click.argument("names", metavar="[NAME]...", nargs=-1)
@click.option(
    "--selector", "-l", default=None, help="Also collect the journals matching this selector."
)
@click.option(
    "--grace",
    type=DURATION,
    default="1h",
    show_default=True,
    help="Leave fragments younger than this (30s, 15m, 1h, 2d): a writer may still claim "
    "a fragment it stored, and a reader may still be reading one compaction superseded "
    "(that grace counts from the compaction).",
)
@click.option(
    "--dry-run",
    "-n",
    is_flag=True,
    help="Only list the fragments gc would delete now; delete nothing.",
)
@store_options
@pass_state
def gc(
    state: State, names: tuple[str, ...], selector: str | None, grace: timedelta, dry_run: bool
) -> None:
    """Delete the fragment objects of journals that readers no longer read, of two kinds:

    \b
    - unclaimed: never claimed, left by writers that lost a race for an offset or crashed
      before claiming it (or by a compaction killed before its record), older than --grace;
    - superseded by compaction: small fragments (and older big ones) whose bytes a
      compaction record made --grace ago or earlier holds in big fragments.

    Prints the path of each deleted fragment (with --dry-run: of each fragment that would
    be deleted, deleting nothing), and a count of each kind on stderr.
    """
    from oncelog.journal.compaction import gc_skips

    client = state.client()
    targets = list(dict.fromkeys(names))
    if selector is not None:
        targets += [s.name for s in client.list(selector_option(selector)) if s.name not in targets]
    if not targets:
        raise click.UsageError("name a journal or give --selector")
    unclaimed: list[Fragment] = []
    superseded: list[Fragment] = []
    with progress("gc", total=len(targets), unit="items") as bar:
        for name in targets:
            bar.describe(f"gc {name}")
            # gc leaves unclaimed fragments below the newest compaction record's end to
            # retirement, which deletes only fragments ending at or before the end of a
            # record older than the grace: so below `covered` (read first, records only
            # grow) a deleted fragment was superseded by compaction, above it never claimed.
            covered = gc_skips(client, name)
            for frag in client.gc(name, grace=grace, dry_run=dry_run):
                click.echo(frag.content_path)
                (superseded if frag.end <= covered else unclaimed).append(frag)
            bar.advance(1)
    size = sum(f.size or 0 for f in unclaimed + superseded)
    kinds = []
    if unclaimed:
        kinds.append(
            f"{plural(len(unclaimed), 'unclaimed fragment')} (left by writers that lost a "
            "race or crashed)"
        )
    if superseded:
        kinds.append(f"{plural(len(superseded), 'fragment')} superseded by compaction")
    done = "would delete" if dry_run else "deleted"
    if kinds:
        what = f"{done} {' and '.join(kinds)}, {format_size(size)} in all"
    else:
        what = f"{done} nothing"
    notice(
        f"gc{' --dry-run' if dry_run else ''}: {what}, from {plural(len(targets), 'journal')}"
    )


# -- compaction and trimming --------------------------------------------------------------------


@journals.command("compact")
@click.argument("names", metavar="[NAME]...", nargs=-1)
@click.option(
    "--selector", "-l", default=None, help="Also compact the journals matching this selector."
)
@click.option("--dry-run", is_flag=True, help="Show what would be done; read and write nothing.")
@click.option(
    "--target-length",
    type=SIZE,
    default=None,
    help="Size of the fragments written, e.g. 64MiB [default: the spec's fragment length].",
)
@click.option(
    "--min-age",
    type=DURATION,
    default="0s",
    show_default=True,
    help="Leave fragments stored less than this long ago (and any after them).",
)
@store_options
@pass_state
def compact(
    state: State,
    names: tuple[str, ...],
    selector: str | None,
    dry_run: bool,
    target_length: int | None,
    min_age: timedelta,
) -> None:
    """Merge the small fragments of journals into big ones behind their heads.

    Offsets and bytes never change and appends go on meanwhile; cold reads then cost a
    request per big fragment instead of two per small one. Prints one line per journal.
    """
    client = state.client()
    targets = list(dict.fromkeys(names))
    if selector is not None:
        targets += [s.name for s in client.list(selector_option(selector)) if s.name not in targets]
    if not targets:
        raise click.UsageError("name a journal or give --selector")
    verb = "would merge" if dry_run else "merged"
    for name in targets:
        with progress(f"compact {name}") as bar:

            def on_progress(
                done: int, total: int, bar: Any = bar, started: list[bool] = [False]  # noqa: B006
            ) -> None:
                if not started[0]:
                    bar.add_total(total)
                    started[0] = True
                bar.update(done)

            result = client.compact(
                name,
                target_length=target_length,
                min_age=min_age,
                dry_run=dry_run,
                progress=on_progress,
            )
        if result.record is None:
            click.echo(f"{name}: nothing to compact (offsets {result.start}-{result.through})")
            continue
        retired = result.retired
        tail = (
            f"; retired {plural(len(retired.claims), 'claim')} and "
            f"{plural(len(retired.fragments), 'fragment')}"
            if retired is not None and (retired.claims or retired.fragments)
            else ""
        )
        click.echo(
            f"{name}: {verb} {plural(result.fragments_read, 'fragment')} "
            f"({format_size(result.bytes_compacted)}) into "
            f"{plural(len(result.chunks), 'fragment')}; offsets "
            f"{result.start}-{result.through} now in record {result.record}"
            f"{'' if dry_run or result.record_won else ' (written by a racing compactor)'}"
            f"{tail}"
        )


def _trim_point(text: str) -> int | datetime:
    if text.isdigit():
        return int(text)
    try:
        point = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an offset nor an ISO date-time (e.g. 2024-05-01T00:00:00Z)",
            param_hint="--before",
        ) from None
    return point if point.tzinfo is not None else point.replace(tzinfo=UTC)


@journals.command("trim")
@click.argument("name")
@click.option(
    "--before",
    default=None,
    help="Delete whole fragments ending at or before this offset, or stored at or before "
    "this ISO date-time (UTC unless it says). Default: the spec's retention.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def trim(state: State, name: str, before: str | None, dry_run: bool, yes: bool) -> None:
    """Delete the oldest data of journal NAME, oldest first, in whole fragments.

    Readers asking for earlier offsets then get OffsetNotAvailable; the head and appends
    are never affected. Asks first unless --yes or --dry-run.
    """
    client = state.client()
    point = _trim_point(before) if before is not None else None
    try:
        plan = client.trim(name, point, dry_run=True)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    summary = (
        f"{plural(len(plan.fragments), 'fragment')} ({format_size(plan.bytes_deleted)}) and "
        f"{plural(len(plan.claims), 'claim')} of {name}; its first offset becomes {plan.first}"
    )
    if dry_run or not plan.fragments and not plan.claims:
        click.echo(f"{name}: would delete {summary}" if dry_run else f"{name}: nothing to trim")
        return
    require_confirmation(f"Delete {summary}?", yes, f"trim journal {name}")
    with progress(f"trim {name}", unit="items") as bar:
        started = [False]

        def on_progress(done: int, total: int) -> None:
            if not started[0]:
                bar.add_total(total)
                started[0] = True
            bar.update(done)

        result = client.trim(name, point, progress=on_progress)
    click.echo(
        f"{name}: deleted {plural(len(result.fragments), 'fragment')} "
        f"({format_size(result.bytes_deleted)}) and {plural(len(result.claims), 'claim')}; "
        f"first offset now {result.first}"
    )


# -- changing specs: apply and edit ---------------------------------------------------------

_NOT_SPEC_FIELDS = ("head", "begin", "fragments", "incarnation")
"""Fields of `journals describe|list --format json` that are not part of a spec: ignored."""


def _spec_text(spec: JournalSpec) -> str:
    """A spec as pretty JSON without its incarnation: what is edited and diffed."""
    import orjson

    doc = spec.to_dict()
    doc.pop("incarnation", None)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"


def _spec_from_doc(doc: Any, where: str) -> JournalSpec:
    from oncelog.journal import InvalidJournalName, InvalidJournalSpec, JournalSpec

    if not isinstance(doc, dict):
        raise click.ClickException(f"{where}: a journal spec must be a JSON object, not {doc!r}")
    if "fragment" in doc and doc["fragment"] is None:
        raise click.ClickException(
            f"{where}: journal {doc.get('name')!r} has no oncelog spec (a Gazette fragment "
            "store?): give its labels and fragment settings"
        )
    doc = {k: v for k, v in doc.items() if k not in _NOT_SPEC_FIELDS}
    try:
        return JournalSpec.from_dict(doc)
    except (InvalidJournalSpec, InvalidJournalName) as exc:
        raise click.ClickException(f"{where}: {exc}") from None


def _spec_diff(old: JournalSpec, new: JournalSpec, source: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            _spec_text(old).splitlines(keepends=True),
            _spec_text(new).splitlines(keepends=True),
            fromfile=f"{old.name} (stored)",
            tofile=f"{new.name} ({source})",
        )
    )


@journals.command("apply")
@click.argument("file", type=click.File("rb"))
@click.option("--dry-run", "-n", is_flag=True, help="Show the plan and diffs; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def apply(state: State, file: Any, dry_run: bool, yes: bool) -> None:
    """Create or update the journals whose specs FILE holds ('-': stdin).

    FILE is JSON: one spec object or a list of them, as `journals describe NAME --format
    json` or `journals list --format json` print them (head, begin, fragments and
    incarnation are ignored). Missing journals are created; for changed ones a diff is
    printed and, once confirmed (or with --yes), the spec is rewritten, keeping the
    journal's data; identical ones are left alone.
    """
    import orjson

    from oncelog.journal import JournalNotFound

    source = getattr(file, "name", None)
    if not isinstance(source, str) or source in ("-", "<stdin>"):
        source = "stdin"
    try:
        loaded = orjson.loads(file.read())
    except orjson.JSONDecodeError as exc:
        raise click.ClickException(f"{source} is not JSON: {exc}") from None
    docs = loaded if isinstance(loaded, list) else [loaded]
    specs = [_spec_from_doc(doc, f"{source}[{i}]") for i, doc in enumerate(docs)]
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise click.UsageError(f"{source} gives journal {duplicates[0]!r} more than once")
    if not specs:
        notice(f"{source} holds no journal specs")
        return
    client = state.client()
    creates: list[JournalSpec] = []
    updates: list[tuple[JournalSpec, JournalSpec]] = []  # (stored, new)
    for spec in specs:
        try:
            stored = client.get(spec.name)
        except JournalNotFound:
            creates.append(spec)
            click.echo(f"{spec.name}: {'would create' if dry_run else 'to create'}")
            continue
        if _spec_text(stored) == _spec_text(spec):
            click.echo(f"{spec.name}: unchanged")
            continue
        updates.append((stored, spec))
        click.echo(f"{spec.name}: {'would update' if dry_run else 'to update'}")
        click.echo(_spec_diff(stored, spec, source), nl=False)
    if dry_run or not creates and not updates:
        return
    if updates:
        also = f" and create {plural(len(creates), 'journal')}" if creates else ""
        require_confirmation(
            f"Update {plural(len(updates), 'journal spec')}{also}?",
            yes,
            "update journal specs",
        )
    for spec in creates:
        client.create(spec)
        notice(f"created journal {spec.name}")
    for stored, spec in updates:
        client.update(spec, expect=stored)
        notice(f"updated journal {spec.name}")


@journals.command("edit")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def edit(state: State, name: str, yes: bool) -> None:
    """Edit journal NAME's spec in $VISUAL or $EDITOR, then show the diff and update it
    once confirmed (or with --yes). Refused if the spec changed meanwhile."""
    import orjson

    if not yes and not sys.stdin.isatty():  # refuse before the editing, not after it
        raise click.UsageError(
            f"refusing to edit journal {name} without confirmation: stdin is not a "
            "terminal; pass --yes"
        )
    client = state.client()
    stored = client.get(name)
    text = click.edit(_spec_text(stored), extension=".json", require_save=True)
    if text is None:
        click.echo(f"{name}: unchanged")
        return
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.ClickException(f"the edited spec is not JSON: {exc}") from None
    spec = _spec_from_doc(doc, "the edited spec")
    if spec.name != name:
        raise click.ClickException(
            f"the edited spec names journal {spec.name!r}: a journal cannot be renamed"
        )
    if _spec_text(spec) == _spec_text(stored):
        click.echo(f"{name}: unchanged")
        return
    click.echo(_spec_diff(stored, spec, "edited"), nl=False)
    require_confirmation(f"Update the spec of journal {name}?", yes, f"update journal {name}")
    client.update(spec, expect=stored)
    notice(f"updated journal {name}")
