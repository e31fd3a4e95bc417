"""Journal management: `journals create|list|describe|delete`, `fragments`, `head`, `gc`."""

from __future__ import annotations

import sys
from datetime import timedelta
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
    selector_option,
)

if TYPE_CHECKING:
    from oncelog.journal import Fragment, JournalSpec

__all__ = ["journals", "require_confirmation", "fragment_doc"]

_COMPRESSION_NAMES = {".raw": "none", ".gz": "gzip", ".zst": "zstd"}


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
    help="Roll fragments over at this size, e.g. 16MiB [default: 64MiB].",
)
@click.option(
    "--flush-interval",
    type=DURATION,
    default=None,
    help="How long an append may wait for others to share its fragment, e.g. 100ms [default: 0s].",
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
    )
    owner = None
    if owner_role is not None or owner_address is not None or owner_description is not None:
        owner = JournalOwner(owner_role or "", owner_address or "", owner_description or "")
    spec = JournalSpec(name, values, fragment, owner)  # type: ignore[arg-type]
    state.client().create(spec)
    notice(f"created journal {name} ({content_type})")


@journals.command("list")
@click.option(
    "--selector",
    "-l",
    default="",
    help="Gazette label selector, e.g. 'app=web, name:prefix=logs/'.",
)
@format_option
@store_options
@pass_state
def list_journals(state: State, selector: str, fmt: str) -> None:
    """List journals, optionally those matching a label selector."""
    specs = state.client().list(selector_option(selector))
    if fmt == "json":
        write_json([s.to_dict() for s in specs])
        return
    from oncelog.labels import CONTENT_TYPE

    print_table(
        ["NAME", "CONTENT-TYPE", "COMPRESSION", Column("FRAGMENT", numeric=True), "LABELS"],
        [
            (
                s.name,
                s.content_type,
                s.fragment.compression,
                format_size(s.fragment.length),
                _labels_text(s, (CONTENT_TYPE,)),
            )
            for s in specs
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
    begin = frags[0].begin if frags else head
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
            f"Delete journal {name} and its {len(frags)} fragments ({size})?",
            yes,
            f"delete journal {name}",
        )
    with progress(f"deleting {name}", unit="none"):
        client.delete(name)
    notice(f"deleted journal {name}")


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
@store_options
@pass_state
def head(state: State, name: str) -> None:
    """Print the write head of journal NAME: the offset the next append begins at."""
    click.echo(state.client().head(name))


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
    help="Leave unclaimed fragments younger than this (30s, 15m, 1h, 2d): their writer may "
    "still claim them.",
)
@store_options
@pass_state
def gc(state: State, names: tuple[str, ...], selector: str | None, grace: timedelta) -> None:
    """Delete the unclaimed fragments of journals (writers that lost a race or died).

    Prints the path of each deleted fragment.
    """
    client = state.client()
    targets = list(dict.fromkeys(names))
    if selector is not None:
        targets += [s.name for s in client.list(selector_option(selector)) if s.name not in targets]
    if not targets:
        raise click.UsageError("name a journal or give --selector")
    deleted: list[Fragment] = []
    with progress("gc", total=len(targets), unit="items") as bar:
        for name in targets:
            bar.describe(f"gc {name}")
            for frag in client.gc(name, grace=grace):
                click.echo(frag.content_path)
                deleted.append(frag)
            bar.advance(1)
    size = sum(f.size or 0 for f in deleted)
    notice(
        f"gc: deleted {len(deleted)} unclaimed fragment{'s' if len(deleted) != 1 else ''} "
        f"({format_size(size)}) from {len(targets)} journal{'s' if len(targets) != 1 else ''}"
    )
