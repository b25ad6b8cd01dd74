"""What a mix's epoch still holds at a checkpoint: each corpus's stream positions not consumed yet.

The mid-epoch re-mix (:mod:`shardio.ledger.remix`) needs them exactly. The loader's plan of the current
segment (after the epoch's elastic history and quarantines, as :func:`~shardio.planning.mix.plan_occurrences`
plans it) holds every occurrence the epoch has not consumed in earlier segments; those of its first
``position`` batches on every rank are consumed (padding's repeats collapse); the others remain.
"""

from __future__ import annotations

import numpy as np

from ..planning.planner import Planner
from ..state import LoaderState

__all__ = ["remaining_positions"]


def remaining_positions(planner: Planner, state: LoaderState) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per corpus of ``planner``'s mix (the mix ``state`` was saved from), the stream positions of the state's
    epoch not consumed at its position (sorted), and how many positions the epoch took of it in all."""
    names = [name for name, _ in planner.corpora]
    plan, occurrences = planner.occurrences(state.epoch, state.world_size, state.history, state.surgery)
    left = np.zeros(occurrences.global_ids.shape[0], dtype=bool)
    left[plan.samples] = True
    left[plan.consumed_samples(state.position)] = False
    remaining, sizes = {}, {}
    for number, name in enumerate(names):
        own = occurrences.numbers == number
        remaining[name] = np.sort(occurrences.positions[left & own])
        sizes[name] = int(own.sum())
    return remaining, sizes
