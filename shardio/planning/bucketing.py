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

from .batches import eligible
from .options import Batching

__all__ = ["RESOLUTION", "bucket_edges", "bucket_of", "equal_duration_bins"]


def bucket_edges(durations: np.ndarray, batching: Batching, weights: np.ndarray | None = None) -> np.ndarray:
    """The bucket edges a plan uses: ``duration_bins``, or estimated from the eligible ``durations``."""
    if batching.duration_bins is not None:
        return np.asarray(batching.duration_bins, dtype=np.float64)
    keep = eligible(durations, batching)
    return equal_duration_bins(
        durations[keep], batching.num_buckets or 1, None if weights is None else weights[keep]
    )


RESOLUTION = 1 << 14
"""Bucket edges are estimated on a histogram of this many equal cells over the duration range."""


def equal_duration_bins(
    durations: np.ndarray, num_buckets: int, weights: np.ndarray | None = None
) -> np.ndarray:
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
    mass = np.cumsum(
        np.bincount(
            cells, weights=durations if weights is None else durations * weights, minlength=RESOLUTION
        )
    )
    crossing = np.searchsorted(mass, mass[-1] * np.arange(1, num_buckets) / num_buckets, side="right")
    edges = np.unique(low + np.minimum(crossing + 1, RESOLUTION) * width)
    return edges[(edges > low) & (edges <= high)]


def bucket_of(durations: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bucket number (0 .. ``len(edges)``) of each duration; ``edges`` are the buckets' lower bounds."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), durations, side="right").astype(np.int64)
