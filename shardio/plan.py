"""The planner: pure functions from index metadata to every rank's batches for one epoch.

No I/O and no torch. Given per-sample shard ids and durations, ``seed``, ``epoch``, the world size and the
batching options, :func:`plan_epoch` decides the epoch order, the batches and which rank gets which batch.
Every rank computes the same global plan independently, so ranks agree without any communication.

The steps:

1. **Order** (:func:`epoch_order`): shards are permuted per epoch, then samples are shuffled within
   windows of ``shuffle_shards`` consecutive shards (reads stay local to a few shards at a time).
2. **Batches** (:func:`batch_offsets`): consecutive samples of that order form batches, of a fixed
   ``batch_size`` or greedily up to ``max_duration`` padded seconds (count x longest).
3. **Deal** (:func:`deal`): batch ``j * world_size + r`` goes to rank ``r``. The last partial round is
   padded by repeating batches from the start of the epoch, or dropped (``remainder``); so every rank has
   exactly the same number of batches, by construction.

An elastic resume (a different world size mid-epoch) is a new *segment*: the samples that no rank has
consumed yet are batched and dealt again over the new world (:func:`plan_epoch` with ``history``).

Randomness comes from ``numpy.random.default_rng((seed, epoch, purpose))``: a function of the tuple,
never of ``seed + epoch`` and never a mutated counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import OptionError

__all__ = ["Batching", "Ordering", "Segment", "EpochPlan", "epoch_order", "batch_offsets", "deal", "plan_epoch",
           "worker_batches", "rng"]

_SHARDS, _SAMPLES = 1, 2
_REMAINDERS = ("pad", "drop")


def rng(seed: int, epoch: int, *purpose: int) -> np.random.Generator:
    """The generator for ``purpose`` in ``epoch``: seeded by the tuple ``(seed, epoch, *purpose)``."""
    return np.random.default_rng([seed, epoch, *purpose])


@dataclass(frozen=True)
class Ordering:
    """How an epoch's samples are ordered."""

    shuffle: bool = True
    shuffle_shards: int = 16
    """Samples mix across windows of this many consecutive (permuted) shards."""

    def __post_init__(self) -> None:
        if self.shuffle_shards < 1:
            raise OptionError(f"shuffle_shards must be at least 1, not {self.shuffle_shards}")


@dataclass(frozen=True)
class Batching:
    """How samples are grouped into batches, and what happens to the last partial round of batches."""

    batch_size: int | None = None
    max_duration: float | None = None
    """Padded seconds per batch: batch size x the longest sample's duration."""
    max_batch_size: int | None = None
    remainder: str = "pad"
    """``pad``: repeat batches from the epoch start to fill the last round; ``drop``: drop that round."""

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.max_duration is not None:
            raise OptionError("give batch_size or max_duration, not both")
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.max_duration is not None and not self.max_duration > 0:
            raise OptionError(f"max_duration must be positive, not {self.max_duration}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise OptionError(f"max_batch_size must be at least 1, not {self.max_batch_size}")
        if self.remainder not in _REMAINDERS:
            raise OptionError(f"remainder must be one of {_REMAINDERS}, not {self.remainder!r}")


@dataclass(frozen=True)
class Segment:
    """A finished part of an epoch: ``consumed`` batches per rank were taken under ``world_size`` ranks."""

    world_size: int
    consumed: int


@dataclass(frozen=True)
class EpochPlan:
    """One epoch (segment) planned for all ranks. Batch ``j`` of rank ``r`` is ``batch(r, j)``."""

    samples: np.ndarray
    """Sample ids in batched order; global batch ``b`` is ``samples[offsets[b]:offsets[b + 1]]``."""
    offsets: np.ndarray
    rank_batches: np.ndarray
    """``rank_batches[r, j]``: the global batch number of rank ``r``'s ``j``-th batch."""
    excluded: int = 0
    """Samples left out because they alone exceed ``max_duration``."""
    dropped: int = 0
    """Samples in the dropped last round (``remainder='drop'``)."""
    padded: int = 0
    """Samples repeated to fill the last round (``remainder='pad'``)."""
    report: dict[str, int] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """Ranks this plan deals to."""
        return int(self.rank_batches.shape[0])

    @property
    def num_batches(self) -> int:
        """Batches per rank (the same on every rank)."""
        return int(self.rank_batches.shape[1])

    def batch(self, rank: int, j: int) -> np.ndarray:
        """The sample ids of rank ``rank``'s ``j``-th batch."""
        b = self.rank_batches[rank, j]
        return self.samples[self.offsets[b] : self.offsets[b + 1]]

    def consumed_samples(self, consumed: int) -> np.ndarray:
        """Sample ids in the first ``consumed`` batches of every rank (with repeats, if padded)."""
        taken = np.zeros(self.offsets.shape[0] - 1, dtype=bool)
        taken[self.rank_batches[:, :consumed].ravel()] = True
        return self.samples[np.repeat(taken, np.diff(self.offsets))]


def epoch_order(shard_ids: np.ndarray, num_shards: int, *, seed: int, epoch: int,
                ordering: Ordering = Ordering()) -> np.ndarray:
    """All sample ids in this epoch's order: shards permuted, samples shuffled within shard windows."""
    n = shard_ids.shape[0]
    if not ordering.shuffle:
        return np.argsort(shard_ids, kind="stable").astype(np.int64)
    position = np.empty(num_shards, dtype=np.int64)
    position[rng(seed, epoch, _SHARDS).permutation(num_shards)] = np.arange(num_shards)
    window = position[shard_ids] // ordering.shuffle_shards
    key = (window << 32) | rng(seed, epoch, _SAMPLES).integers(0, 1 << 32, n, dtype=np.int64)
    return np.argsort(key).astype(np.int64)


BLOCK = 2048
"""Greedy duration batching runs in lockstep over blocks of this many samples; no batch spans two blocks."""


def batch_offsets(durations: np.ndarray, batching: Batching) -> np.ndarray:
    """Batch boundaries over samples taken in the given order: batch b is ``[offsets[b], offsets[b+1])``.

    With ``max_duration`` a batch grows greedily while ``count x longest <= max_duration`` (and
    ``count <= max_batch_size``). To stay vectorised, the greedy pass runs over all blocks of
    :data:`BLOCK` samples at once, one sample position per step, so a batch never spans two blocks.
    """
    n = durations.shape[0]
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    if batching.max_duration is None:
        return np.append(np.arange(0, n, batching.batch_size or 1, dtype=np.int64), n)
    limit = batching.max_duration * (1 + 1e-9)
    cap = batching.max_batch_size or BLOCK
    blocks = -(-n // BLOCK)
    padded = np.zeros(blocks * BLOCK, dtype=np.float64)
    padded[:n] = durations
    columns = padded.reshape(blocks, BLOCK).T.copy()  # row s: sample s of every block
    starts = np.zeros((BLOCK, blocks), dtype=bool)
    longest = np.zeros(blocks, dtype=np.float64)
    count = np.zeros(blocks, dtype=np.int64)
    for step in range(BLOCK):
        sample = columns[step]
        grown = np.maximum(longest, sample)
        new = (grown * (count + 1) > limit) | (count >= cap) | (step == 0)
        starts[step] = new
        longest = np.where(new, sample, grown)
        count = np.where(new, 1, count + 1)
    positions = np.flatnonzero(starts.T.ravel())
    return np.append(positions[positions < n], n).astype(np.int64)


def deal(num_batches: int, world_size: int, remainder: str) -> tuple[np.ndarray, np.ndarray]:
    """Global batch numbers per rank, ``[world_size, per_rank]``, and the batch numbers left out."""
    per_rank = num_batches // world_size if remainder == "drop" else -(-num_batches // world_size)
    used = per_rank * world_size
    if used <= num_batches:
        chosen = np.arange(used, dtype=np.int64)
    else:
        chosen = np.concatenate([np.arange(num_batches), np.arange(used - num_batches) % num_batches])
    left_out = np.arange(used, num_batches, dtype=np.int64)
    return chosen.reshape(per_rank, world_size).T.copy(), left_out


def _plan_segment(order: np.ndarray, durations: np.ndarray, batching: Batching, world_size: int) -> EpochPlan:
    excluded = 0
    if batching.max_duration is not None:
        fits = durations[order] <= batching.max_duration * (1 + 1e-9)
        excluded = int(order.shape[0] - fits.sum())
        order = order[fits]
    offsets = batch_offsets(durations[order], batching)
    num_batches = offsets.shape[0] - 1
    if num_batches == 0:
        return EpochPlan(order, offsets, np.zeros((world_size, 0), np.int64), excluded=excluded)
    rank_batches, left_out = deal(num_batches, world_size, batching.remainder)
    sizes = np.diff(offsets)
    dropped = int(sizes[left_out].sum())
    padded = int(sizes[rank_batches.ravel()].sum() - sizes.sum() + dropped)
    return EpochPlan(order, offsets, rank_batches, excluded=excluded, dropped=dropped, padded=padded)


def plan_epoch(shard_ids: np.ndarray, durations: np.ndarray, num_shards: int, *, seed: int, epoch: int,
               world_size: int, batching: Batching = Batching(), ordering: Ordering = Ordering(),
               history: Sequence[Segment] = ()) -> EpochPlan:
    """Plan ``epoch`` for ``world_size`` ranks, after the finished segments in ``history``.

    With an empty history this is the epoch as planned from its start. Each segment of ``history`` says
    how many batches per rank were consumed under which world size before the world changed; the samples
    they did not consume are planned again, in epoch order, for the next segment.
    """
    if seed < 0:
        raise OptionError(f"seed must be a non-negative integer, not {seed}")
    if shard_ids.shape != durations.shape:
        raise OptionError("shard_ids and durations must have the same shape")
    order = epoch_order(shard_ids, num_shards, seed=seed, epoch=epoch, ordering=ordering)
    for segment in history:
        plan = _plan_segment(order, durations, batching, segment.world_size)
        if not 0 <= segment.consumed <= plan.num_batches:
            raise OptionError(f"a segment consumed {segment.consumed} batches of a plan with {plan.num_batches}")
        done = np.zeros(shard_ids.shape[0], dtype=bool)
        done[plan.consumed_samples(segment.consumed)] = True
        order = order[~done[order]]
    plan = _plan_segment(order, durations, batching, world_size)
    report = {"samples": int(shard_ids.shape[0]), "planned": int(plan.samples.shape[0]),
              "batches_per_rank": plan.num_batches, "excluded": plan.excluded, "dropped": plan.dropped,
              "padded": plan.padded}
    return EpochPlan(plan.samples, plan.offsets, plan.rank_batches, plan.excluded, plan.dropped, plan.padded,
                     report)


def worker_batches(num_batches: int, start: int, worker: int, num_workers: int) -> range:
    """The rank batches a DataLoader worker produces when iteration starts at batch ``start``.

    Worker ``w`` takes batches ``start + w``, ``start + w + num_workers``, ...: the DataLoader asks its
    workers in turn from worker 0, so the batches reach the trainer in plan order for any worker count.
    """
    return range(start + worker, num_batches, num_workers)


def options_of(batching: Batching, ordering: Ordering) -> dict[str, object]:
    """The options that shape a plan, as a JSON-ready dict (recorded in a state)."""
    return {**asdict(batching), **asdict(ordering)}
