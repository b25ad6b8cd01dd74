"""StepRecord: one rank's batch at one step, as :class:`~shardio.Trace` answers it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..planning.plan import EpochPlan
from ..planning.repeats import Repeats

__all__ = ["StepRecord", "sample_marks"]


@dataclass(frozen=True)
class StepRecord:
    """One rank's batch at one step: its sample ids (global ids in a mix)."""

    epoch: int
    step: int
    segment: int
    batch_index: int
    """The batch's ``batch_index`` as the loader yields it (its index within the segment)."""
    rank: int
    world_size: int
    ids: np.ndarray
    ahead: bool = False
    """Consumed by a DataLoader worker ahead of the segment's position (see the module docs)."""
    micro_batch: int = 0
    """With ``step_batches``: the batch's place among the rank's batches of its optimizer step."""
    repeat: np.ndarray | None = None
    """Per sample, the batch's ``repeat`` flag (padding only: :mod:`shardio.planning.repeats`)."""
    passes: np.ndarray | None = None
    """In a mix, per sample, the pass of its corpus it is drawn from (the plan's ``passes``)."""


def sample_marks(
    plan: EpochPlan, repeats: Repeats, rank: int, j: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``repeat`` flags and (in a mix) the corpus passes of rank ``rank``'s ``j``-th batch of ``plan``
    (``repeats``: ``Repeats(plan)``), for its :class:`StepRecord`."""
    b = plan.rank_batches[rank, j]
    passes = None if plan.passes is None else plan.passes[plan.offsets[b] : plan.offsets[b + 1]]
    return repeats.flags(rank, j), passes
