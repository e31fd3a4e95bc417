"""Data source options: parsed once, carried (pickled) to Spark's workers, which open the store.

Spark hands options over lower-cased with string values. Storage options for the
store (S3 endpoint and keys, or anything fsspec accepts) travel with them, so that
executors reach the same store as the driver without any other set-up.

Storage option names (`key`, `secret`, `token`, `endpoint_url`, `region`, `anon`,
`storage_options`) mean the same in reads and writes and are never a write's own
option: the column that routes rows to journals is `key_column`. A write's `key` is
the routing column only in the deprecated spelling that cannot be a credential (no
`key_column`, no `secret`, and `key` names a column: see `WriteOptions.resolve`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from oncelog.journal import JournalClient, JournalSpec, open_journals
from oncelog.labels import LabelSelector
from oncelog.spark.errors import OptionError
from oncelog.transactions import validate_transaction_id

__all__ = [
    "OptionError", "ReadOptions", "StoreOptions", "WriteOptions", "json_object_option",
    "parse_bool",
]

log = logging.getLogger(__name__)

_SELECTOR_MARKS = ("=", "!", "(", " in ", " notin ")


def parse_bool(name: str, value: str | bool) -> bool:
    """`true`/`false` (any case, or 1/0, yes/no) as a bool; OptionError otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, not {value!r}")


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    value = options.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
    if number < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, not {number}")
    return number


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    value = options.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(str(value).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be a number, not {value!r}") from None
    if not number >= 0:
        raise OptionError(f"option {name!r} must be a number >= 0, not {value!r}")
    return number


def json_object_option(name: str, text: str, what: str = "") -> dict[str, Any]:
    """Option `name`'s value `text` as a JSON object; OptionError saying which option is
    not JSON, or not an object (`what`: of what, for the message)."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise OptionError(f"option {name!r} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name!r} must be a JSON object{what}")
    return parsed


def _storage_options(options: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    text = options.get("storage_options")
    if text:
        out.update(json_object_option("storage_options", text))
    for name in ("key", "secret", "token", "endpoint_url"):
        if options.get(name):
            out[name] = options[name]
    if options.get("region"):
        client_kwargs = dict(out.get("client_kwargs") or {})
        client_kwargs["region_name"] = options["region"]
        out["client_kwargs"] = client_kwargs
    if options.get("anon"):
        out["anon"] = parse_bool("anon", options["anon"])
    return out


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Where the journals are: an fsspec URL and its storage options."""

    store: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StoreOptions:
        opts = _lower(options)
        store = opts.get("store") or opts.get("path")
        if not store:
            raise OptionError(
                "option 'store' is required: the journals' fsspec URL, e.g. s3://bucket/prefix"
            )
        return cls(store, _storage_options(opts))

    def open(self) -> JournalClient:
        """A new client of the store (call it in the process that uses it)."""
        return open_journals(self.store, **self.storage_options)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Options of `spark.read` / `spark.readStream` with format `oncelog`."""

    store: StoreOptions
    journals: tuple[str, ...] = ()
    selector: str = ""
    committed: bool = True
    schema: str | None = None
    split_bytes: int = 64 << 20
    chunk_bytes: int = 8 << 20
    batch_rows: int = 65536
    facts_threads: int = 4
    proto_class: str | None = None
    uuid_field: str = "uuid"
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    prune_horizon: float = 86400.0
    fast_path: bool = True
    """Batch reads parse JSON lines with Arrow in one pass and decide commits a batch at
    a time (same rows; `false` takes the per-message path, for comparison)."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = _lower(options)
        names: tuple[str, ...] = ()
        selector = opts.get("selector", "") or ""
        journals = (opts.get("journals") or "").strip()
        if journals:
            if any(mark in journals for mark in _SELECTOR_MARKS):
                if selector:
                    raise OptionError(
                        "give the label selector in 'journals' or 'selector', not both"
                    )
                selector = journals
            else:
                names = tuple(n.strip() for n in journals.split(",") if n.strip())
        if selector:
            try:
                LabelSelector.parse(selector)
            except ValueError as exc:
                raise OptionError(f"bad label selector {selector!r}: {exc}") from None
        if not names and not selector:
            raise OptionError(
                "option 'journals' is required: comma-separated journal names or a label "
                "selector such as 'app=web' (use 'name:prefix=' to select every journal)"
            )
        schema = opts.get("schema") or None
        limit_rows = opts.get("max_messages_per_trigger")
        limit_bytes = opts.get("max_bytes_per_trigger")
        return cls(
            store=StoreOptions.parse(opts),
            journals=names,
            selector=selector,
            committed=parse_bool("committed", opts.get("committed", "true")),
            schema=schema.strip() if schema else None,
            split_bytes=_int(opts, "split_bytes", 64 << 20),
            chunk_bytes=_int(opts, "chunk_bytes", 8 << 20, minimum=4096),
            batch_rows=_int(opts, "batch_rows", 65536),
            facts_threads=_int(opts, "facts_threads", 4),
            proto_class=opts.get("proto_class") or None,
            uuid_field=opts.get("uuid_field") or "uuid",
            max_messages_per_trigger=(
                _int(opts, "max_messages_per_trigger", 0) if limit_rows else None
            ),
            max_bytes_per_trigger=_int(opts, "max_bytes_per_trigger", 0) if limit_bytes else None,
            prune_horizon=_float(opts, "prune_horizon", 86400.0),
            fast_path=parse_bool("fast_path", opts.get("fast_path", "true")),
        )

    def list_journals(self, client: JournalClient) -> list[JournalSpec]:
        """The journals to read, by name: the named ones (each must exist) or the selected ones."""
        if self.journals:
            return sorted((client.get(name) for name in set(self.journals)), key=lambda s: s.name)
        return sorted(client.list(self.selector), key=lambda s: s.name)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Options of `df.write` / `df.writeStream` with format `oncelog`.

    Targets: `journal` (one name), or `journals` (comma-separated names or a label
    selector) or `selector`, with `key_column` naming the column that maps each row to
    one of several targets (`mapping`: modulo or rendezvous). Batch writes take an
    optional idempotency key, `write_id` and `write_version` (like Delta Lake's
    `txnAppId` / `txnVersion`); streams take `writer_id`.

    `legacy_key` holds a `key` option that may be the deprecated spelling of
    `key_column` (given without `key_column` and without `secret`): it is kept out of
    the storage options until `resolve` sees the DataFrame's columns.
    """

    store: StoreOptions
    journals: tuple[str, ...] = ()
    selector: str = ""
    key_column: str | None = None
    mapping: str = "modulo"
    uuid_field: str = "uuid"
    writer_id: str | None = None
    write_id: str | None = None
    write_version: int = 0
    legacy_key: str | None = None

    @property
    def several_targets(self) -> bool:
        """Whether rows go to several journals (then a routing column is needed)."""
        return bool(self.selector) or len(self.journals) > 1

    @classmethod
    def parse(
        cls, options: Mapping[str, str], columns: Sequence[str] | None = None
    ) -> WriteOptions:
        """Parse and check the options; with the DataFrame's `columns`, also `resolve`
        them (without, a `key` that may be a routing column stays undecided)."""
        opts = _lower(options)
        journal = (opts.get("journal") or "").strip()
        listed = (opts.get("journals") or "").strip()
        selector = (opts.get("selector") or "").strip()
        if sum(map(bool, (journal, listed, selector))) > 1:
            raise OptionError("give one of 'journal', 'journals' or 'selector' as the target")
        names: tuple[str, ...] = (journal,) if journal else ()
        if listed:
            if any(mark in listed for mark in _SELECTOR_MARKS):
                selector = listed
            else:
                names = tuple(n.strip() for n in listed.split(",") if n.strip())
        if not names and not selector:
            raise OptionError(
                "option 'journal' (the target journal), or 'journals' / 'selector' (target "
                "journals, with 'key_column' naming the column that picks one) is required"
            )
        if selector:
            try:
                LabelSelector.parse(selector)
            except ValueError as exc:
                raise OptionError(f"bad label selector {selector!r}: {exc}") from None
        key_column = (opts.get("key_column") or "").strip() or None
        legacy_key: str | None = None
        store_opts = opts
        if key_column is None and opts.get("key") and "secret" not in _storage_options(opts):
            # `key` without a secret is no usable access key: it may be the routing column
            # of old jobs. Keep it out of the store until the columns are known.
            legacy_key = opts["key"]
            store_opts = {k: v for k, v in opts.items() if k != "key"}
        if key_column is None and legacy_key is None and (selector or len(names) > 1):
            raise OptionError(
                f"option 'key_column' is required with several target journals "
                f"({selector or ', '.join(names)}): the column whose value maps each row to "
                "one of them"
            )
        mapping = (opts.get("mapping") or "modulo").strip().lower()
        if mapping not in ("modulo", "rendezvous"):
            raise OptionError(f"option 'mapping' must be modulo or rendezvous, not {mapping!r}")
        writer_id = opts.get("writer_id") or None
        if writer_id is not None and ("/" in writer_id or writer_id.startswith(".")):
            raise OptionError(f"option 'writer_id' must be a plain name, not {writer_id!r}")
        write_id = _write_id(opts.get("write_id") or None)
        version = opts.get("write_version")
        if write_id is None and version not in (None, ""):
            raise OptionError(
                "option 'write_version' needs 'write_id': the stable name of the write it numbers"
            )
        parsed = cls(
            store=StoreOptions.parse(store_opts),
            journals=names,
            selector=selector,
            key_column=key_column,
            mapping=mapping,
            uuid_field=opts.get("uuid_field") or "uuid",
            writer_id=writer_id,
            write_id=write_id,
            write_version=_int(opts, "write_version", 0, minimum=0),
            legacy_key=legacy_key,
        )
        return parsed if columns is None else parsed.resolve(columns)

    def resolve(self, columns: Sequence[str]) -> WriteOptions:
        """Decide what an undecided `key` option is, now that the DataFrame's `columns` are
        known: a column name is the routing column (deprecated spelling of `key_column`,
        with a DeprecationWarning), anything else is the store's access key. Then check
        that the routing column is a column."""
        options = self
        if self.legacy_key is not None:
            key = self.legacy_key
            if key in columns:
                message = (
                    f"option 'key' naming the routing column {key!r} is deprecated: use "
                    f"'key_column' ('key' is the storage access key)"
                )
                warnings.warn(message, DeprecationWarning, stacklevel=2)
                log.warning("%s", message)
                options = replace(self, key_column=key, legacy_key=None)
            else:
                storage = {**self.store.storage_options, "key": key}
                options = replace(
                    self, store=replace(self.store, storage_options=storage), legacy_key=None
                )
                if options.several_targets:
                    raise OptionError(
                        f"option 'key_column' is required with several target journals "
                        f"({self.selector or ', '.join(self.journals)}): the column whose "
                        f"value maps each row to one of them ('key' {key!r} is not a column "
                        f"of {list(columns)}, so it is taken as the storage access key)"
                    )
        if options.key_column is not None and options.key_column not in columns:
            raise OptionError(
                f"option 'key_column' {options.key_column!r} is not a column of {list(columns)}"
            )
        return options


def _write_id(value: str | None) -> str | None:
    """A valid write id (see `oncelog.transactions.validate_transaction_id`), or None."""
    if value is None:
        return None
    try:
        return validate_transaction_id(value.strip(), "write id")
    except ValueError as exc:
        raise OptionError(f"option 'write_id': {exc}") from None
