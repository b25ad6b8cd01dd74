"""One batching pass's steps: what a sample costs, which samples fit, batches cut from an order, their costs.

Pure numpy, no I/O, no torch, no Python loop over samples. Given samples in the order a segment plays them, a
batch is ``count`` consecutive samples (``batch_size``) or grows greedily while ``count x cost(longest)``
stays within ``max_duration`` (:func:`batch_offsets`); a sample of ``d`` seconds costs ``d``, or ``d + d**2 /
Q`` with ``quadratic_duration`` (:func:`sample_cost`). Batches are moved as a whole (:func:`reorder_batches`),
shuffled within shard windows (:func:`shuffle_batches`), measured in audio and padded seconds
(:func:`batch_audio`) and costed under the cost model in use (:func:`batch_costs`).
:mod:`shardio.planning.rounds` runs the pass over a segment with them; :mod:`shardio.planning.bucketing` makes
the duration buckets batches form within.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..errors import OptionError, shown

if TYPE_CHECKING:
    from .options import Batching

__all__ = [
    "BLOCK",
    "sample_cost",
    "eligible",
    "group_starts",
    "fixed_offsets",
    "greedy_offsets",
    "batch_offsets",
    "shuffle_batches",
    "reorder_batches",
    "batch_audio",
    "padding_ratio",
    "padding_of",
    "batch_costs",
    "underfull",
]

BLOCK = 2048
"""Greedy duration batching runs in lockstep over blocks of this many samples; no batch spans two blocks."""


def sample_cost(durations: np.ndarray, quadratic: float | None) -> np.ndarray:
    """What a sample of ``d`` seconds costs in a batch: ``d``, or ``d + d**2 / quadratic``
    (attention-like)."""
    durations = np.asarray(durations, dtype=np.float64)
    return durations if quadratic is None else durations + durations * durations / quadratic


def eligible(durations: np.ndarray, batching: Batching) -> np.ndarray:
    """Which samples ``batching`` can plan: within its duration filters, and alone within ``max_duration``."""
    keep = np.ones(durations.shape[0], dtype=bool)
    if batching.min_duration is not None:
        keep &= durations >= batching.min_duration
    if batching.max_sample_duration is not None:
        keep &= durations <= batching.max_sample_duration
    if batching.max_duration is not None:
        keep &= sample_cost(durations, batching.quadratic_duration) <= batching.max_duration * (1 + 1e-9)
    return keep


def group_starts(keys: np.ndarray) -> np.ndarray:
    """``True`` where ``keys`` (a sequence in which equal keys are adjacent) starts a new group."""
    starts = np.ones(keys.shape[0], dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    return starts


def fixed_offsets(n: int, size: int, starts: np.ndarray | None = None) -> np.ndarray:
    """Offsets of batches of ``size`` consecutive samples; a batch also ends before each ``starts`` mark."""
    if starts is None or n == 0:
        return np.append(np.arange(0, n, size, dtype=np.int64), n)
    positions = np.arange(n, dtype=np.int64)
    first = np.maximum.accumulate(np.where(starts, positions, 0))
    return np.append(np.flatnonzero((positions - first) % size == 0), n).astype(np.int64)


def greedy_offsets(costs: np.ndarray, limit: float, cap: int, starts: np.ndarray | None = None) -> np.ndarray:
    """Offsets of greedy batches: a batch grows while ``count x max(cost) <= limit`` and ``count <= cap``.

    To stay vectorised the greedy pass runs over all blocks of :data:`BLOCK` samples at once, one sample
    position per step (2048 numpy steps whatever the size). ``starts`` forces a batch to start there.
    """
    n = costs.shape[0]
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    blocks = -(-n // BLOCK)

    def by_step(values: np.ndarray, fill: float | bool) -> np.ndarray:  # row s: position s of every block
        out = np.full((BLOCK, blocks), fill, dtype=values.dtype)
        whole = n // BLOCK
        out[:, :whole] = values[: whole * BLOCK].reshape(whole, BLOCK).T
        out[: n - whole * BLOCK, whole:] = values[whole * BLOCK :, None]  # the last, partial block
        return out

    columns = by_step(costs.astype(np.float64, copy=False), 0.0)
    forced = np.zeros((BLOCK, blocks), dtype=bool) if starts is None else by_step(starts.astype(bool), False)
    begins = np.zeros((BLOCK, blocks), dtype=bool)
    longest = np.zeros(blocks, dtype=np.float64)
    count = np.zeros(blocks, dtype=np.int64)
    for step in range(min(BLOCK, n)):  # a single short block needs only n steps
        sample = columns[step]
        grown = np.maximum(longest, sample)
        new = (grown * (count + 1) > limit) | (count >= cap) | forced[step] | (step == 0)
        begins[step] = new
        longest = np.where(new, sample, grown)
        count = np.where(new, 1, count + 1)
    positions = np.flatnonzero(begins.T.ravel())
    return np.append(positions[positions < n], n).astype(np.int64)


def batch_offsets(durations: np.ndarray, batching: Batching, starts: np.ndarray | None = None) -> np.ndarray:
    """Batch boundaries over samples taken in the given order: batch b is ``[offsets[b], offsets[b+1])``.

    With ``max_duration`` a batch grows greedily while ``count x cost(longest) <= max_duration`` (and
    ``count <= max_batch_size``), in lockstep over blocks of :data:`BLOCK` samples, so a batch never spans
    two blocks (:func:`greedy_offsets`). ``starts`` (optional, per position) marks
    where a new batch must start, e.g. at a bucket change.
    """
    if batching.max_duration is None:
        return fixed_offsets(durations.shape[0], batching.batch_size or 1, starts)
    costs = sample_cost(durations, batching.quadratic_duration)
    return greedy_offsets(costs, batching.max_duration * (1 + 1e-9), batching.max_batch_size or BLOCK, starts)


def shuffle_batches(windows: np.ndarray, generator: np.random.Generator | None) -> np.ndarray:
    """A batch order that keeps windows in sequence and shuffles batches within each window.

    ``windows[b]`` is batch ``b``'s window (non-decreasing). Keeping windows in sequence keeps reads local
    to a few shards at a time; shuffling within them mixes buckets (and corpora) from batch to batch.
    """
    if generator is None:
        return np.arange(windows.shape[0], dtype=np.int64)
    return np.lexsort((np.asarray(generator.random(windows.shape[0])), windows)).astype(np.int64)


def reorder_batches(
    samples: np.ndarray, offsets: np.ndarray, perm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``samples``/``offsets`` with batch ``perm[k]`` as the new batch ``k`` (``perm`` may repeat or omit)."""
    sizes = np.diff(offsets)[perm]
    new_offsets = np.zeros(perm.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=new_offsets[1:])
    shift = np.repeat(offsets[:-1][perm] - new_offsets[:-1], sizes)
    return samples[np.arange(new_offsets[-1], dtype=np.int64) + shift], new_offsets


def batch_audio(durations: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per batch: seconds of audio, and padded seconds (count x longest); ``durations`` in batched order."""
    if offsets.shape[0] < 2:
        return np.zeros(0), np.zeros(0)
    starts = offsets[:-1]
    audio = np.add.reduceat(durations, starts) if durations.shape[0] else np.zeros(0)
    longest = np.maximum.reduceat(durations, starts) if durations.shape[0] else np.zeros(0)
    return audio, longest * np.diff(offsets)


def padding_ratio(durations: np.ndarray, offsets: np.ndarray) -> float:
    """The share of padded batch seconds that is padding, not audio (0 when every batch is uniform)."""
    return padding_of(*batch_audio(durations, offsets))


def padding_of(audio: np.ndarray, padded: np.ndarray) -> float:
    """:func:`padding_ratio` from the batches' seconds of audio and padded seconds (:func:`batch_audio`)."""
    total = float(padded.sum())
    return 0.0 if total <= 0 else 1.0 - float(audio.sum()) / total


def _cost(batching: Batching, durations: np.ndarray) -> float:
    """``batching.batch_cost`` of one batch, which must be a real number (a string, None or a bool is not)."""
    assert batching.batch_cost is not None
    value = batching.batch_cost(durations)
    real = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not real and not (isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf"):
        raise OptionError(
            f"batch_cost {batching.batch_cost_name!r} returned a {type(value).__name__} ({shown(value)}) for "
            f"a batch of {durations.shape[0]} samples: it must return a finite, non-negative number"
        )
    return float(value)


def batch_costs(durations: np.ndarray, offsets: np.ndarray, batching: Batching) -> np.ndarray:
    """Each batch's cost under ``batching``'s cost model; ``durations`` in batched order."""
    if offsets.shape[0] < 2:
        return np.zeros(0)
    if batching.batch_cost is not None:
        costs = np.array(
            [_cost(batching, durations[offsets[b] : offsets[b + 1]]) for b in range(offsets.shape[0] - 1)],
            dtype=np.float64,
        )
        bad = np.flatnonzero(~np.isfinite(costs) | (costs < 0))
        if bad.shape[0]:
            raise OptionError(
                f"batch_cost {batching.batch_cost_name!r} returned {costs[bad[0]]} for a batch of "
                f"{int(offsets[bad[0] + 1] - offsets[bad[0]])} samples: it must return a finite, "
                "non-negative number"
            )
        return costs
    if batching.quadratic_duration is None:
        return batch_audio(durations, offsets)[1]
    longest = np.maximum.reduceat(sample_cost(durations, batching.quadratic_duration), offsets[:-1])
    return longest * np.diff(offsets)


def underfull(durations: np.ndarray, offsets: np.ndarray, batching: Batching) -> np.ndarray:
    """Per batch: whether one more sample as costly as its longest would still fit (``durations`` in
    batched order)."""
    sizes = np.diff(offsets)
    if batching.max_duration is None:
        return sizes < (batching.batch_size or 1)
    longest = np.maximum.reduceat(sample_cost(durations, batching.quadratic_duration), offsets[:-1])
    fits = (sizes + 1) * longest <= batching.max_duration * (1 + 1e-9)
    return fits & (sizes < (batching.max_batch_size or np.iinfo(np.int64).max))
