"""What a mix's epoch still holds at a checkpoint: each corpus's stream positions not consumed yet.

The mid-epoch re-mix (:mod:`shardio.ledger.remix`) needs them exactly. The loader's plan of the current
segment (after the epoch's elastic history and quarantines, as :func:`~shardio.planning.mix.plan_occurrences`
plans it) holds every occurrence the epoch has not consumed in earlier segments; those of its first
``position`` batches on every rank are consumed (padding's repeats collapse); the others remain.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..planning.mix import plan_occurrences
from ..state import LoaderState
from ..planning.exclusions import exclusions
from ..planning.mixstreams import mix_args

if TYPE_CHECKING:
    from ..datasets.mixed import MixedDataset

__all__ = ["remaining_positions"]


def remaining_positions(dataset: MixedDataset, state: LoaderState) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per corpus of ``dataset`` (the mix ``state`` was saved from), the stream positions of the state's
    epoch not consumed at its position (sorted), and how many positions the epoch took of it in all."""
    batching = dataset.batching if dataset.batched else replace(dataset.batching, batch_size=1)
    names = dataset.index.names
    plan, occurrences, _ = plan_occurrences(
        dataset.index.columns_of(), dataset.mix, seed=dataset.seed, epoch=state.epoch,
        world_size=state.world_size, batching=batching, ordering=dataset.ordering, history=state.history,
        exclude=exclusions(state.extra, state.epoch), **mix_args(state.extra, state.epoch, names))
    left = np.zeros(occurrences.global_ids.shape[0], dtype=bool)
    left[plan.samples] = True
    left[plan.consumed_samples(state.position)] = False
    remaining, sizes = {}, {}
    for number, name in enumerate(names):
        own = occurrences.numbers == number
        remaining[name] = np.sort(occurrences.positions[left & own])
        sizes[name] = int(own.sum())
    return remaining, sizes
