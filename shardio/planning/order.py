"""The epoch's order: randomness as a function of ``(seed, epoch, purpose, ...)``, and the shard-window
shuffle.

Shards are permuted per epoch, then samples are shuffled within windows of ``shuffle_shards`` consecutive
shards, so reads stay local to a few shards at a time. Every random choice of the planner draws from
:func:`rng` with one of the purposes below; they are part of every plan's identity (a saved state resumes
onto the same batches only while they stay as they are), so they never change and never repeat.
"""

from __future__ import annotations

import numpy as np

from .options import Ordering
from .stablesort import stable_order

__all__ = [
    "SHARDS",
    "SAMPLES",
    "BATCHES",
    "MIX",
    "MERGE",
    "PARTS",
    "NODES",
    "rng",
    "window_order",
    "narrow_window_order",
    "epoch_order",
]

SHARDS = 1
"""The shards' permutation."""
SAMPLES = 2
"""The samples' shuffle within their window."""
BATCHES = 3
"""The batches' shuffle within a bucketed window."""
MIX = 11
"""A mix's planning (:mod:`shardio.planning.mix`): each corpus's passes."""
MERGE = 12
"""A mix's merge of its corpora's draws."""
PARTS = 13
"""The nodes' parts of the corpus (``Ordering(node_stable=True)``), drawn at epoch 0 for every epoch."""
NODES = 14
"""A node-stable segment's batches: each node's batch shuffle, and the order of the aligned steps."""


def rng(seed: int, epoch: int, *purpose: int) -> np.random.Generator:
    """The generator for ``purpose`` in ``epoch``: seeded by the tuple ``(seed, epoch, *purpose)``."""
    return np.random.default_rng([seed, epoch, *purpose])


def window_order(
    shard_ids: np.ndarray, num_shards: int, ordering: Ordering, key: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The sample order for RNG ``key`` (``(seed, epoch)`` or longer), and every sample's shard window.

    Shards are permuted, samples shuffled within windows of ``shuffle_shards`` consecutive shards;
    ``windows[id]`` is sample ``id``'s window number (int64), which does not decrease along the order.
    """
    order, windows = narrow_window_order(shard_ids, num_shards, ordering, key)
    return order, windows.astype(np.int64)


def narrow_window_order(
    shard_ids: np.ndarray, num_shards: int, ordering: Ordering, key: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`window_order` with the windows in the narrowest integer type (4 bytes a sample, not 8)."""
    n = shard_ids.shape[0]
    narrow = np.int32 if num_shards < 1 << 31 else np.int64
    if not ordering.shuffle:
        return stable_order(shard_ids), (shard_ids // ordering.shuffle_shards).astype(narrow)
    if num_shards <= ordering.shuffle_shards:  # one window, whatever the shards' permutation: not drawn
        window = np.zeros(n, dtype=narrow)
    else:
        position = np.empty(num_shards, dtype=np.int64)
        position[rng(*key, SHARDS).permutation(num_shards)] = np.arange(num_shards)
        window = (position // ordering.shuffle_shards).astype(narrow)[shard_ids]
    return stable_order(
        window, np.asarray(rng(*key, SAMPLES).integers(0, 1 << 32, n, dtype=np.int64))
    ), window


def epoch_order(
    shard_ids: np.ndarray, num_shards: int, *, seed: int, epoch: int, ordering: Ordering = Ordering()
) -> np.ndarray:
    """All sample ids in this epoch's order: shards permuted, samples shuffled within shard windows."""
    return narrow_window_order(shard_ids, num_shards, ordering, (seed, epoch))[0]
