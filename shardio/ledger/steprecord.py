"""StepRecord: one rank's batch at one step, as :class:`~shardio.Trace` answers it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StepRecord"]


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
