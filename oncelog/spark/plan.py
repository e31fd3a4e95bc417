"""The two-phase split plan, re-exported: it lives in `oncelog.sequencing.plan`.

The plan states the Sequencer's rules over a journal cut into splits; being pure Python
(no Spark, no pyarrow), it lives with the other statements of those rules in
`oncelog.sequencing`. This module keeps the names importable from where they were.
"""

from __future__ import annotations

from oncelog.sequencing.plan import (
    NIL_PRODUCER,
    Diverged,
    JournalPlan,
    ProducerFacts,
    Split,
    SplitCommitter,
    SplitFacts,
    SplitPlan,
    commit_split,
    gather_facts,
    plan_splits,
    resolve,
)

__all__ = [
    "NIL_PRODUCER",
    "Split",
    "plan_splits",
    "ProducerFacts",
    "SplitFacts",
    "gather_facts",
    "SplitPlan",
    "JournalPlan",
    "resolve",
    "SplitCommitter",
    "Diverged",
    "commit_split",
]
