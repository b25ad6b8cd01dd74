"""Node parts: with ``Ordering(node_stable=True)``, which shards each node reads, and a node's epoch order.

The shards are dealt once to ``nodes`` parts of about equal audio (:func:`shard_parts`): in a random order
drawn from ``(seed, nodes)`` only, longest first, each to the part with the least audio so far. The parts
never depend on the epoch, so a node reads the same shards every epoch and a node-local cache holds them.
Each epoch orders a part as the global order orders the corpus (:mod:`shardio.planning.order`): the
shards' permutation of ``(seed, epoch)`` restricted to the part, cut into windows of ``shuffle_shards`` or
more of the part's shards (as many as fit, at least one, so that no short window at a part's end mixes
less), samples shuffled within a window (:func:`part_order`).

Pure numpy; no I/O, no torch.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import OptionError
from .options import Ordering
from .order import PARTS, SAMPLES, SHARDS, rng
from .stablesort import stable_order

__all__ = ["shard_parts", "index_parts", "part_order"]


def shard_parts(shard_seconds: np.ndarray, seed: int, nodes: int) -> np.ndarray:
    """Each shard's part, ``0`` to ``nodes - 1`` (int64), from each shard's seconds of audio.

    Raises:
        OptionError: fewer shards than nodes (a node would read nothing).
    """
    count = int(shard_seconds.shape[0])
    if nodes == 1:
        return np.zeros(count, dtype=np.int64)
    if count < nodes:
        raise OptionError(
            f"Ordering(node_stable=True) deals the dataset's {count} shards to {nodes} nodes: every node "
            "needs a shard of its own; pack the dataset into more shards, or leave node_stable off"
        )
    shuffled = rng(seed, 0, PARTS, nodes).permutation(count)  # epoch 0 for every epoch: parts stay put
    longest_first = shuffled[np.argsort(-shard_seconds[shuffled], kind="stable")]
    parts = np.empty(count, dtype=np.int64)
    heap = [(0.0, part) for part in range(nodes)]
    seconds = shard_seconds.tolist()
    for shard in longest_first.tolist():
        total, part = heap[0]
        parts[shard] = part
        heapq.heapreplace(heap, (total + seconds[shard], part))
    return parts


def index_parts(
    shard_ids: np.ndarray, durations: np.ndarray, num_shards: int, seed: int, nodes: int
) -> np.ndarray:
    """Each shard's part (:func:`shard_parts`), over ``nodes`` parts of about equal audio, from the index's
    columns."""
    seconds = np.bincount(shard_ids, weights=durations, minlength=num_shards)
    return shard_parts(seconds, seed, nodes)


def part_order(
    ids: np.ndarray,
    shard_ids: np.ndarray,
    shard_part: np.ndarray,
    nodes: int,
    ordering: Ordering,
    key: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ids`` (distinct sample ids) in the epoch's node order, part after part: ``(order, windows,
    starts)``. ``shard_part`` is each shard's part (of ``nodes``); ``key`` is ``(seed, epoch)``.
    ``windows[id]`` (int64, per id of the index) is a sample's window, which does not decrease along a part's
    order; part ``p`` is ``order[starts[p]:starts[p + 1]]``."""
    num_shards = int(shard_part.shape[0])
    if ordering.shuffle:
        position = np.empty(num_shards, dtype=np.int64)
        position[rng(*key, SHARDS).permutation(num_shards)] = np.arange(num_shards)
    else:
        position = np.arange(num_shards, dtype=np.int64)
    # each shard's place among its part's shards, in the epoch's shard order
    by_part = np.lexsort((position, shard_part))
    first = np.searchsorted(shard_part[by_part], np.arange(nodes))
    local = np.empty(num_shards, dtype=np.int64)
    local[by_part] = np.arange(num_shards) - np.repeat(first, np.diff(np.append(first, num_shards)))
    # a part's windows of `shuffle_shards` or more of its shards each (as many as fit, at least one): no
    # window of a few shards at a part's end, whose batches would mix less
    sizes = np.bincount(shard_part, minlength=nodes)
    count = np.maximum(sizes // ordering.shuffle_shards, 1)
    stride = num_shards // ordering.shuffle_shards + 1
    shard_window = shard_part * stride + local * count[shard_part] // np.maximum(sizes[shard_part], 1)
    windows = shard_window[shard_ids]
    if ordering.shuffle:
        ties = np.asarray(rng(*key, SAMPLES).integers(0, 1 << 32, shard_ids.shape[0], dtype=np.int64))[ids]
    else:  # index order within a window: by shard, then id
        ties = local[shard_ids[ids]]
    order = ids[stable_order(windows[ids], ties)]
    starts = np.searchsorted(shard_part[shard_ids[order]], np.arange(nodes + 1)).astype(np.int64)
    return order, windows, starts
