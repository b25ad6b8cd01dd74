"""Repeats: which samples of an epoch plan are planned repeats, for exact metrics summed over ranks.

With ``remainder="pad"`` the last round of batches is filled by repeating batches from the start of the epoch,
so that every rank has the same number of batches; an epoch of a fixed number of batches (a mix's ``limit``)
repeats batches too. Summed over ranks, a metric would count those samples twice. Every occurrence of a
sample but its first is a repeat, where occurrences are ordered by round (batch ``j`` of every rank), then
rank, then position in the batch: so the first occurrence always lies in a batch some rank trains on.

In a mix, a sample of a corpus that repeats within the epoch recurs under another pass of its corpus (the
plan's ``passes``): a *re-pass* is a sample trained on again, not a repeat; only an occurrence (sample, pass)
met again is one. A mix's batches carry no re-pass flag in ``repeat``, so masking ``repeat`` out of a loss
drops only the padding.

Pure numpy on the plan, no I/O: every rank and worker computes the same flags independently.
"""

from __future__ import annotations

import numpy as np

from .plan import EpochPlan

__all__ = ["Repeats"]


def occurrence_ids(plan: EpochPlan) -> np.ndarray:
    """Per entry of ``plan.samples``, a number that only the same occurrence shares: the sample id, or in a
    mix the pair (sample id, pass) numbered densely."""
    if plan.passes is None or plan.samples.shape[0] == 0:
        return plan.samples
    passes = plan.passes.astype(np.int64) - int(plan.passes.min())
    span = int(passes.max()) + 1
    if int(plan.samples.max()) < np.iinfo(np.int64).max // span:  # one int64 key per pair
        keys = plan.samples.astype(np.int64) * span + passes
        return np.unique(keys, return_inverse=True)[1].reshape(-1).astype(np.int64)
    pairs = np.stack([plan.samples.astype(np.int64), passes], axis=1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


class Repeats:
    """The repeat flags of one plan: ``flags(rank, j)`` is a bool per sample of ``plan.batch(rank, j)``."""

    def __init__(self, plan: EpochPlan) -> None:
        self.plan = plan
        slots = plan.rank_batches.T.ravel()  # round-major: round j, then rank
        # with steps, the batches of the segment's earlier steps come first: seen before this segment
        before = 0 if plan.earlier is None else int(plan.earlier.shape[0])
        if before:
            slots = np.concatenate([plan.earlier, slots])
        first_slot = np.zeros(slots.shape[0], dtype=bool)
        first_slot[np.unique(slots, return_index=True)[1]] = True
        self._first_slot = first_slot[before:].reshape(plan.num_batches, plan.world_size).T
        self._sample_flags: np.ndarray | None = None
        self._slot_starts: np.ndarray | None = None
        occurrences = occurrence_ids(plan)
        samples = occurrences[plan.offsets[0] : plan.offsets[-1]]
        if samples.shape[0] and np.bincount(samples).max() > 1:  # a sample in two different batches
            sizes = np.diff(plan.offsets)[slots]
            starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            within = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(starts[:-1], sizes)
            taken = occurrences[np.repeat(plan.offsets[slots], sizes) + within]
            flags = np.ones(taken.shape[0], dtype=bool)
            flags[np.unique(taken, return_index=True)[1]] = False
            self._slot_starts = starts[before:] - starts[before]
            self._sample_flags = flags[int(starts[before]) :]

    def flags(self, rank: int, j: int) -> np.ndarray:
        """True for each sample of rank ``rank``'s ``j``-th batch that an earlier occurrence counts."""
        plan = self.plan
        size = int(plan.offsets[plan.rank_batches[rank, j] + 1] - plan.offsets[plan.rank_batches[rank, j]])
        if self._sample_flags is None or self._slot_starts is None:
            return np.full(size, not self._first_slot[rank, j])
        start = int(self._slot_starts[j * plan.world_size + rank])
        return self._sample_flags[start : start + size].copy()

    def rank_flags(self, rank: int) -> np.ndarray | None:
        """The flags of all of rank ``rank``'s batches, one after the other; None when none is a repeat."""
        plan = self.plan
        if self._sample_flags is None or self._slot_starts is None:
            if self._first_slot[rank].all():
                return None
            sizes = np.diff(plan.offsets)[plan.rank_batches[rank]]
            return np.repeat(~self._first_slot[rank], sizes)
        flags = (
            np.concatenate([self.flags(rank, j) for j in range(plan.num_batches)])
            if plan.num_batches
            else np.zeros(0, dtype=bool)
        )
        return flags if flags.any() else None
