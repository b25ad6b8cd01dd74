"""Sharing: a rank's plan and the shard table in shared memory, so spawn and forkserver DataLoader workers
receive them by handle.

A rank's share of an epoch plan (:class:`~shardio.planning.rankplan.RankPlan`) is O(N / world). A DataLoader
worker started by ``fork`` inherits it (the pages stay shared), but one started by ``spawn`` or ``forkserver``
receives the dataset pickled, and would receive a copy of every array. :func:`shared` puts the arrays in torch
shared-memory tensors (as :mod:`shardio.runtime.control` does for its block), and the result pickles as those
tensors: torch's DataLoader (``multiprocessing``'s ``ForkingPickler``) sends a shared tensor as a handle to
the same memory, so every worker of the rank maps one copy and nothing of size N / world is pickled. A plain
``pickle`` still copies the values, so the plan also survives ``copy.deepcopy`` and a pickle to disk. No files
and no locks.

A share read from the node's plan files (:class:`~shardio.runtime.nodeplan.MappedRankPlan`, with several
ranks) needs none of this: it pickles as the plan's name, and the worker reads the same files.

The index's shard table (:class:`~shardio.shards.shardtable.ShardTable`, O(shards)) travels the same way:
:func:`shared_table` copies its arrays into shared tensors once, and the table pickles as those tensors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..planning.rankplan import RankPlan
from ..shards.shardtable import ShardTable
from .nodeplan import MappedRankPlan

__all__ = ["SharedRankPlan", "shared", "shared_arrays", "shared_table"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedRankPlan(RankPlan):
    """A :class:`RankPlan` whose arrays are views of shared-memory tensors (``tensors``), pickled as those."""

    tensors: tuple[torch.Tensor | None, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.rank, *self.tensors)


def _rebuild(
    rank: int, ids: torch.Tensor, offsets: torch.Tensor, repeats: torch.Tensor | None
) -> SharedRankPlan:
    return SharedRankPlan(
        rank,
        ids.numpy(),
        offsets.numpy(),
        None if repeats is None else repeats.numpy(),
        tensors=(ids, offsets, repeats),
    )


def _tensor(array: np.ndarray) -> torch.Tensor:
    tensor = torch.empty(array.shape, dtype=torch.from_numpy(np.empty(0, array.dtype)).dtype).share_memory_()
    tensor.numpy()[...] = array
    return tensor


def shared(plan: RankPlan) -> RankPlan:
    """``plan`` with its arrays in shared memory (itself if they are already); ``plan`` unchanged, with a
    warning, if shared memory cannot be had (``/dev/shm`` full): workers then receive a copy."""
    if isinstance(plan, (SharedRankPlan, MappedRankPlan)):  # a node plan's share travels as its name
        return plan
    try:
        ids, offsets = _tensor(plan.ids), _tensor(plan.offsets)
        repeats = None if plan.repeats is None else _tensor(plan.repeats)
    except (RuntimeError, OSError) as exc:
        logger.warning(
            "the rank's plan (%d ids) stays private: no shared memory for it (%s); spawn and "
            "forkserver DataLoader workers receive a copy",
            plan.ids.shape[0],
            exc,
        )
        return plan
    return _rebuild(plan.rank, ids, offsets, repeats)


def shared_arrays(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A shared-memory tensor holding a copy of each of ``arrays`` (``RuntimeError``/``OSError`` when shared
    memory cannot be had)."""
    return {name: _tensor(array) for name, array in arrays.items()}


def shared_table(table: ShardTable) -> ShardTable:
    """``table`` with its arrays in shared memory, pickled as those tensors (itself if it is already);
    ``table`` unchanged, with a warning, if shared memory cannot be had: workers then receive a copy."""
    if table.carriers is not None:
        return table
    try:
        tensors = shared_arrays(table.arrays())
    except (RuntimeError, OSError) as exc:
        logger.warning(
            "the shard table (%d shards) stays private: no shared memory for it (%s); spawn and "
            "forkserver DataLoader workers receive a copy",
            len(table),
            exc,
        )
        return table
    return ShardTable.from_arrays(tensors)
