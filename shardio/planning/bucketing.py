"""Duration bucketing: pure, vectorised helpers the planner uses to batch similar durations together.

Padding is what a batch pays for its shortest members: a batch of ``count`` samples padded to its
longest, ``longest``, holds ``count x longest`` seconds of which only ``sum(durations)`` is audio. The
planner reduces it by sorting each shuffle window's samples by *bucket* (a duration range) and forming
batches within a bucket, then shuffling the batch order, so consecutive batches still vary in length.

Bucket edges are either given, or estimated so that each bucket holds about the same total duration
(:func:`equal_duration_bins`, as Lhotse's ``estimate_duration_buckets`` does). Everything here is numpy
only: no I/O, no torch, no Python loop over samples.
"""

from __future__ import annotations

import numpy as np

from .options import Batching, eligible, sample_cost

__all__ = ["BLOCK", "RESOLUTION", "eligible", "bucket_edges", "sample_cost", "equal_duration_bins",
           "bucket_of", "stable_order", "group_starts", "fixed_offsets", "greedy_offsets", "batch_offsets",
           "shuffle_batches", "reorder_batches", "batch_audio", "padding_ratio", "padding_of"]

BLOCK = 2048
"""Greedy duration batching runs in lockstep over blocks of this many samples; no batch spans two blocks."""


def bucket_edges(durations: np.ndarray, batching: Batching, weights: np.ndarray | None = None) -> np.ndarray:
    """The bucket edges a plan uses: ``duration_bins``, or estimated from the eligible ``durations``."""
    if batching.duration_bins is not None:
        return np.asarray(batching.duration_bins, dtype=np.float64)
    keep = eligible(durations, batching)
    return equal_duration_bins(durations[keep], batching.num_buckets or 1, None if weights is None else weights[keep])


RESOLUTION = 1 << 14
"""Bucket edges are estimated on a histogram of this many equal cells over the duration range."""


def equal_duration_bins(durations: np.ndarray, num_buckets: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Interior bucket edges (at most ``num_buckets - 1``, strictly increasing) so that each bucket holds
    about the same total duration; ``weights`` (per sample, default 1) count a sample that many times.

    One pass over a histogram of :data:`RESOLUTION` cells (no sort), so an edge is exact to within
    ``(max - min) / RESOLUTION`` seconds. A sample of duration ``d`` falls in ``bucket_of(d, edges)``.
    """
    if num_buckets <= 1 or durations.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    durations = np.asarray(durations, dtype=np.float64)
    low, high = float(durations.min()), float(durations.max())
    width = (high - low) / RESOLUTION
    if not width > 0:  # all equal, or apart by less than a float can split into RESOLUTION cells (5e-324 s)
        return np.zeros(0, dtype=np.float64)
    cells = np.minimum(((durations - low) / width).astype(np.int64), RESOLUTION - 1)
    mass = np.cumsum(np.bincount(cells, weights=durations if weights is None else durations * weights,
                                 minlength=RESOLUTION))
    crossing = np.searchsorted(mass, mass[-1] * np.arange(1, num_buckets) / num_buckets, side="right")
    edges = np.unique(low + np.minimum(crossing + 1, RESOLUTION) * width)
    return edges[(edges > low) & (edges <= high)]


def bucket_of(durations: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bucket number (0 .. ``len(edges)``) of each duration; ``edges`` are the buckets' lower bounds."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), durations, side="right").astype(np.int64)


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``argsort(keys, kind="stable")`` on the narrowest unsigned type that holds ``keys`` (non-negative):
    numpy sorts 16-bit keys by radix, several times faster than 64-bit ones."""
    top = int(keys.max(initial=0))
    narrow = np.uint16 if top < 1 << 16 else np.uint32 if top < 1 << 32 else np.int64
    return np.argsort(keys.astype(narrow, copy=False), kind="stable")


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


def reorder_batches(samples: np.ndarray, offsets: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
