"""Sharing: a rank's plan in shared memory, so spawn and forkserver DataLoader workers receive it by handle.

A rank's share of an epoch plan (:class:`~shardio.planning.rankplan.RankPlan`) is O(N / world). A DataLoader
worker started by ``fork`` inherits it (the pages stay shared), but one started by ``spawn`` or ``forkserver``
receives the dataset pickled, and would receive a copy of every array. :func:`shared` puts the arrays in torch
shared-memory tensors (as :mod:`shardio.workers.control` does for its block), and the result pickles as those tensors:
torch's DataLoader (``multiprocessing``'s ``ForkingPickler``) sends a shared tensor as a handle to the same memory,
so every worker of the rank maps one copy and nothing of size N / world is pickled. A plain ``pickle`` still
copies the values, so the plan also survives ``copy.deepcopy`` and a pickle to disk. No files and no locks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..planning.rankplan import RankPlan

__all__ = ["SharedRankPlan", "shared"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharedRankPlan(RankPlan):
    """A :class:`RankPlan` whose arrays are views of shared-memory tensors (``tensors``), pickled as those."""

    tensors: tuple[torch.Tensor | None, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.rank, *self.tensors)


def _rebuild(rank: int, ids: torch.Tensor, offsets: torch.Tensor, repeats: torch.Tensor | None) -> SharedRankPlan:
    return SharedRankPlan(rank, ids.numpy(), offsets.numpy(), None if repeats is None else repeats.numpy(),
                          tensors=(ids, offsets, repeats))


def _tensor(array: np.ndarray) -> torch.Tensor:
    tensor = torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype).share_memory_()
    tensor.numpy()[...] = array
    return tensor


def shared(plan: RankPlan) -> RankPlan:
    """``plan`` with its arrays in shared memory (itself if they are already); ``plan`` unchanged, with a
    warning, if shared memory cannot be had (``/dev/shm`` full): workers then receive a copy."""
    if isinstance(plan, SharedRankPlan):
        return plan
    try:
        ids, offsets = _tensor(plan.ids), _tensor(plan.offsets)
        repeats = None if plan.repeats is None else _tensor(plan.repeats)
    except (RuntimeError, OSError) as exc:
        logger.warning("the rank's plan (%d ids) stays private: no shared memory for it (%s); spawn and "
                       "forkserver DataLoader workers receive a copy", plan.ids.shape[0], exc)
        return plan
    return _rebuild(plan.rank, ids, offsets, repeats)
