"""The read-side rules in one place: Gazette's sequencer, in Python, in C, and split.

A reader turns read-uncommitted messages into read-committed ones by these rules: a
message at or below its producer's last acknowledged clock is a duplicate; an ACK_TXN
commits its producer's pending CONTINUE_TXN messages up to its own clock; an ACK at or
below the last ACK rolls the open transaction back (as an OUTSIDE_TXN after pending
messages does); a committed transaction no longer held in memory is replayed from the
journal. Which module holds which statement of them:

- `oncelog.sequencing.kernel`: the rules in Python. `decide_outcome` (the decision,
  once) and `SequencingKernel` (ring, producer table, offsets, stepping, replays,
  checkpoints).
- `oncelog.sequencing.native`: the C kernel's binding (`oncelog._speedups.Kernel`): its
  outcomes checked against the kernel's, its results converted to the kernel's types.
- `oncelog.sequencing.plan`: the rules over a journal cut into splits (facts, resolution,
  `SplitCommitter`), decided through `decide_outcome`; pure Python.
- `oncelog.sequencing.bulkcommit`: the split rules a whole Arrow batch at a time, where
  every producer's clocks grow (needs pyarrow).
- `oncelog.sequencing.errors`: `Diverged`, `NotBulk`.

Public names keep their homes: `oncelog.sequencer` (`Sequencer`, built on either
kernel, with `QueueOutcome`, `ProducerState` and the rest re-exported) and
`oncelog.spark.plan` (the planner's names re-exported). The C extension is loaded by
`oncelog._native`, below framing, which decodes with it too.

Layering: this package imports only from below (identity, message types, errors,
`oncelog._native`); nothing below imports it, and it never imports PySpark. Importing
the package imports none of its modules: `oncelog.sequencing.plan` loads without
pyarrow, `bulkcommit` only with it.
"""
