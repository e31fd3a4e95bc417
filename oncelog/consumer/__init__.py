"""Exactly-once consumers: consumer groups, transactional checkpoints, recovery.

A `Consumer` reads the committed messages of a group's journals and calls a
handler in transactions; each commit writes checkpoint N+1 only if absent
(fencing out zombie instances), then appends the ACK intents of the outputs.
Group operations (`list_groups`, `group_status`, `reset_group`,
`prune_checkpoints`, `delete_group`) work on the checkpoints. See docs/consumers.md.
"""

from oncelog.consumer.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ConsumerError,
    FencedOut,
    GroupInfo,
    validate_group_name,
)
from oncelog.consumer.core import STAGES, Consumer, Finalizer, Handler, Transaction
from oncelog.consumer.groups import (
    GroupNotFound,
    GroupStatus,
    JournalLag,
    ShardStatus,
    delete_group,
    group_status,
    list_groups,
    prune_checkpoints,
    reset_group,
)
from oncelog.consumer.shards import shard_journals, shard_of

__all__ = [
    "Consumer",
    "Transaction",
    "Handler",
    "Finalizer",
    "STAGES",
    "Checkpoint",
    "CheckpointStore",
    "GroupInfo",
    "ConsumerError",
    "CheckpointError",
    "FencedOut",
    "GroupNotFound",
    "validate_group_name",
    "list_groups",
    "group_status",
    "reset_group",
    "prune_checkpoints",
    "delete_group",
    "GroupStatus",
    "ShardStatus",
    "JournalLag",
    "shard_of",
    "shard_journals",
]
