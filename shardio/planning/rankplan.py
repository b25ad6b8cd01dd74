"""RankPlan: one rank's share of an epoch plan, O(N / world) in memory, to keep and to ship to workers.

An :class:`~shardio.planning.plan.EpochPlan` holds every rank's batches (O(N)). A training process and its
DataLoader workers need only their rank's: :func:`rank_plan` cuts them out (pure numpy), with sample ids
as ``int32`` where they fit. The dataset keeps this and drops the whole plan, so a worker that receives
the dataset by pickling (forkserver, spawn) or inherits it by ``fork`` holds 1/world of the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks.planargs import rank_of
from .plan import EpochPlan
from .repeats import Repeats

__all__ = ["RankPlan", "rank_plan"]


@dataclass(frozen=True)
class RankPlan:
    """Rank ``rank``'s batches of one epoch (segment): batch ``j`` is ``ids[offsets[j]:offsets[j + 1]]``."""

    rank: int
    ids: np.ndarray
    offsets: np.ndarray
    repeats: np.ndarray | None = None
    """Per id, whether it is a planned repeat (:mod:`shardio.planning.repeats`); None when none is."""

    @property
    def num_batches(self) -> int:
        """Batches this rank yields (the same on every rank)."""
        return int(self.offsets.shape[0] - 1)

    def batch(self, j: int) -> np.ndarray:
        """The sample ids (``int64``) of this rank's ``j``-th batch."""
        return self.ids[self.offsets[j] : self.offsets[j + 1]].astype(np.int64)

    def repeat_flags(self, j: int) -> np.ndarray:
        """Per sample of batch ``j``, whether it is a planned repeat (counted by an earlier batch)."""
        if self.repeats is None:
            return np.zeros(int(self.offsets[j + 1] - self.offsets[j]), dtype=bool)
        return self.repeats[self.offsets[j] : self.offsets[j + 1]]


def rank_plan(plan: EpochPlan, rank: int, repeats: Repeats | None = None) -> RankPlan:
    """Rank ``rank``'s part of ``plan``: the same batches, in the same order, as ``plan.batch(rank, j)``.

    ``repeats`` is ``Repeats(plan)`` when the caller cuts out several ranks (it is O(N) to make); a rank
    that is not one of the plan's is an :class:`~shardio.errors.OptionError` (never another rank's share)."""
    batches = plan.rank_batches[rank_of(rank, plan.world_size)]
    starts, ends = plan.offsets[batches], plan.offsets[batches + 1]
    sizes = (ends - starts).astype(np.int64)
    offsets = np.zeros(batches.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # positions in plan.samples of every id of every batch, batch after batch, without a Python loop
    positions = np.repeat(starts - offsets[:-1], sizes) + np.arange(int(offsets[-1]), dtype=np.int64)
    ids = plan.samples[positions]
    small = ids.size == 0 or int(ids.max()) < np.iinfo(np.int32).max
    return RankPlan(
        rank,
        ids.astype(np.int32) if small else ids.astype(np.int64),
        offsets,
        (Repeats(plan) if repeats is None else repeats).rank_flags(rank),
    )
