"""Exactly-once consumers: consumer groups, transactional checkpoints, recovery.

A `Consumer` reads the committed messages of a group's journals and calls a
handler in transactions; each commit writes checkpoint N+1 only if absent and
claims it (no checkpoint above it, so a number freed by pruning fences out zombie
instances too), then appends the ACK intents of the outputs.
Group operations (`list_groups`, `group_status`, `reset_group`,
`prune_checkpoints`, `delete_group`) work on the checkpoints. The state is JSON in the
checkpoint, or `SQLiteState()`: deltas and snapshots written before the checkpoint claim
that references them. See docs/consumers.md.
"""

from oncelog.consumer._trimmed import CheckpointTrimmed
from oncelog.consumer.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ConsumerError,
    FencedOut,
    GroupInfo,
    validate_group_name,
)
from oncelog.consumer.core import (
    OPTIONAL_STAGES,
    STAGES,
    BatchHandler,
    Consumer,
    Finalizer,
    Handler,
    Transaction,
)
from oncelog.consumer.errors import InvalidGroupName
from oncelog.consumer.groups import (
    GroupNotFound,
    GroupStatus,
    JournalLag,
    NotAMessageBoundary,
    ShardStatus,
    delete_group,
    group_status,
    list_groups,
    prune_checkpoints,
    reset_group,
)
from oncelog.consumer.metrics import ConsumerMetrics
from oncelog.consumer.shards import shard_journals, shard_of
from oncelog.consumer.sink import SinkWriter, SQLiteSink
from oncelog.consumer.state import KV, SQLiteState, StateObjectMissing

__all__ = [
    "Consumer",
    "Transaction",
    "Handler",
    "BatchHandler",
    "Finalizer",
    "STAGES",
    "OPTIONAL_STAGES",
    "Checkpoint",
    "CheckpointStore",
    "GroupInfo",
    "ConsumerError",
    "CheckpointError",
    "FencedOut",
    "GroupNotFound",
    "CheckpointTrimmed",
    "NotAMessageBoundary",
    "InvalidGroupName",
    "validate_group_name",
    "list_groups",
    "group_status",
    "reset_group",
    "prune_checkpoints",
    "delete_group",
    "GroupStatus",
    "ShardStatus",
    "JournalLag",
    "SQLiteState",
    "ConsumerMetrics",
    "SQLiteSink",
    "SinkWriter",
    "KV",
    "StateObjectMissing",
    "shard_of",
    "shard_journals",
]
