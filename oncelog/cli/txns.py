"""Transaction commands: `txns list` and `txns recover`.

They work on the transaction records under `<store>/.oncelog/txns/` (oncelog.transactions):
commits over several journals whose ACKs may be incomplete, and the records of
transactional ids.
"""

from __future__ import annotations

from typing import Any

import click

from oncelog.cli.app import State, cli, pass_state, store_options
from oncelog.cli.journals import require_confirmation
from oncelog.cli.output import notice, print_table, write_json
from oncelog.cli.params import format_option, plural

__all__ = ["txns"]


def _record_doc(record: Any, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "record": f".oncelog/{record.path}" if record.path else None,
        "kind": record.kind,
        "producer": record.producer.hex(),
        "journals": record.intent_journals,
        "created": record.created.isoformat(),
    }


@cli.group()
def txns() -> None:
    """List and finish interrupted transactions across journals."""


@txns.command("list")
@format_option
@store_options
@pass_state
def list_txns(state: State, fmt: str) -> None:
    """List commits whose ACKs may be incomplete (pending records), and each transactional
    id with its latest record."""
    from oncelog.transactions import TransactionalLog, pending_records, transactional_ids

    client = state.client()
    pending = [_record_doc(r, status="pending") for r in pending_records(client)]
    ids = []
    for tid in transactional_ids(client):
        seq, record = TransactionalLog(client, tid).latest()
        if record is not None:
            ids.append(_record_doc(record, status=f"id {tid} #{seq}"))
    docs = pending + ids
    if fmt == "json":
        write_json(docs)
        return
    print_table(
        ["STATUS", "KIND", "PRODUCER", "JOURNALS", "CREATED", "RECORD"],
        [
            (d["status"], d["kind"], d["producer"], ",".join(d["journals"]), d["created"],
             d["record"])
            for d in docs
        ],
    )


@txns.command("recover")
@click.option(
    "--id",
    "ids",
    multiple=True,
    metavar="TRANSACTIONAL_ID",
    help="Also take over this transactional id: finish its last commit, roll back what it "
    "left uncommitted, and fence its running instance (repeatable).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@store_options
@pass_state
def recover(state: State, ids: tuple[str, ...], yes: bool) -> None:
    """Roll forward every pending commit: append its ACKs again in every journal (harmless
    where they are already), then retire its record."""
    from oncelog.publisher import Publisher
    from oncelog.transactions import pending_records, recover_pending

    client = state.client()
    records = pending_records(client)
    if ids:
        require_confirmation(
            f"Take over {'transactional id' if len(ids) == 1 else 'transactional ids'} "
            f"{', '.join(ids)}? Their running instances will be fenced out (their next "
            "commit fails)",
            yes,
            "take over transactional ids",
        )
    done = recover_pending(client, records)
    for record in done:
        notice(f"rolled forward {record.path}: journals {', '.join(record.intent_journals)}")
    finished = len(records) - len(done)
    notice(f"{plural(len(done), 'pending commit')} rolled forward, {finished} "
           f"{'was' if finished == 1 else 'were'} already finished by their publisher")
    for tid in ids:
        Publisher(client, transactional_id=tid)
        notice(f"transactional id {tid!r}: taken over, last commit rolled forward")
