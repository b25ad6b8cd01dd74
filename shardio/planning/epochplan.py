"""EpochPlan: one epoch (segment) planned for all ranks, and Segment: a finished part of an epoch.

Values only: :mod:`shardio.planning.plan` makes them (and re-exports both names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Segment", "EpochPlan"]


@dataclass(frozen=True)
class Segment:
    """A finished part of an epoch, before the world size changed.

    Args:
        world_size: The ranks that took its batches.
        consumed: Batches per rank they took.
        nodes: The nodes those ranks were on, with `Ordering(node_stable=True)` (1 otherwise): each node's
            part of the corpus depends on it.
    """

    world_size: int
    consumed: int
    nodes: int = 1


@dataclass(frozen=True)
class EpochPlan:
    """One epoch (segment) planned for all ranks (by `plan_epoch`). Batch `j` of rank `r` is `batch(r, j)`.

    Args:
        samples: Sample ids in batched order; global batch `b` is `samples[offsets[b]:offsets[b + 1]]`.
        offsets: Where each global batch starts in `samples` (one more entry than batches).
        rank_batches: `rank_batches[r, j]`: the global batch number of rank `r`'s `j`-th batch.
        excluded: Samples left out: alone above `max_duration`, or outside the duration filters.
        dropped: Samples in the dropped last round (`remainder="drop"`).
        padded: Samples repeated to fill the last round (`remainder="pad"`).
        report: What the plan did, for logs: counts, `padding_ratio`, `step_efficiency`, ...
        accumulation: Batches per rank per optimizer step (`Batching.step_batches / world_size`; 1 without
            steps): rank batch `s * accumulation + a` is micro-batch `a` of step `s`.
        earlier: With steps, the global batches of the segment's steps played before it (a resume on another
            world continues the same steps): their samples count as seen for the repeat flags.
        passes: A mix's: per entry of `samples`, its corpus's pass (:mod:`shardio.planning.mix`;
            `None` elsewhere). A sample twice in an epoch under two passes is two samples, not a repeat.
    """

    samples: np.ndarray
    offsets: np.ndarray
    rank_batches: np.ndarray
    excluded: int = 0
    dropped: int = 0
    padded: int = 0
    report: dict[str, Any] = field(default_factory=dict)
    accumulation: int = 1
    earlier: np.ndarray | None = None
    passes: np.ndarray | None = None

    @property
    def world_size(self) -> int:
        """Ranks this plan deals to."""
        return int(self.rank_batches.shape[0])

    @property
    def num_batches(self) -> int:
        """Batches per rank (the same on every rank)."""
        return int(self.rank_batches.shape[1])

    def batch(self, rank: int, j: int) -> np.ndarray:
        """The sample ids (a view of `samples`) of a rank's batch.

        Args:
            rank: The rank.
            j: The batch's number among the rank's, from 0.
        """
        b = self.rank_batches[rank, j]
        return self.samples[self.offsets[b] : self.offsets[b + 1]]

    def consumed_samples(self, consumed: int) -> np.ndarray:
        """Sample ids in the first batches of every rank, each once (padding's repeats collapse).

        Args:
            consumed: Batches per rank.
        """
        taken = np.zeros(self.offsets.shape[0] - 1, dtype=bool)
        taken[self.rank_batches[:, :consumed].ravel()] = True
        return self.samples[np.repeat(taken, np.diff(self.offsets))]
