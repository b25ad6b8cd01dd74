"""The occurrences of one epoch of a mix, in merged order: each corpus's stream positions for the epoch,
interleaved in their shares, with the slices and buckets the planner batches them by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..errors import OptionError
from . import bucketing
from .mixoptions import Mix
from .order import MERGE, MIX, rng
from .plan import Batching, Ordering
from .streams import corpus_key, merge_places, stream_samples

__all__ = ["CorpusColumns", "Occurrences", "corpus_offsets", "eligible_samples", "merge_occurrences"]


class CorpusColumns(NamedTuple):
    """What the mix planner needs of one corpus: per-sample shard ids and durations, and the shard count."""

    shard_ids: np.ndarray
    durations: np.ndarray
    num_shards: int


def corpus_offsets(sizes: Sequence[int]) -> np.ndarray:
    """Global id offsets: corpus ``c`` (in name order) holds ids ``[offsets[c], offsets[c + 1])``."""
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def eligible_samples(
    corpora: Mapping[str, CorpusColumns], mix: Mix, batching: Batching
) -> dict[str, np.ndarray]:
    """Each corpus's samples within the batching's duration limits (a boolean mask); an :class:`OptionError`
    where the weights name other corpora than ``corpora``, or a corpus has no such sample."""
    if set(corpora) != set(mix.weights):
        raise OptionError(f"the weights name corpora {sorted(mix.weights)}, the mix has {sorted(corpora)}")
    eligible = {}
    for name in mix.names:
        shard_ids, durations, _ = corpora[name]
        if shard_ids.shape != durations.shape:
            raise OptionError(f"corpus {name!r}: shard_ids and durations must have the same shape")
        eligible[name] = batching.eligible(np.asarray(durations, dtype=np.float64))
        if not eligible[name].any():
            raise OptionError(f"corpus {name!r} has no sample within the batching's duration limits")
    return eligible


class Occurrences(NamedTuple):
    """One epoch's occurrences (corpus, pass, sample) in merged order, what the planner batches."""

    global_ids: np.ndarray  # per occurrence, in merged order
    durations: np.ndarray
    slices: np.ndarray
    buckets: np.ndarray
    edges: np.ndarray
    numbers: np.ndarray  # per occurrence: its corpus's number (name order)
    positions: np.ndarray  # per occurrence: its position in its corpus's stream


def merge_occurrences(
    corpora: Mapping[str, CorpusColumns],
    mix: Mix,
    batching: Batching,
    ordering: Ordering,
    eligible: Mapping[str, np.ndarray],
    positions: Mapping[str, np.ndarray],
    *,
    seed: int,
    epoch: int,
) -> Occurrences:
    """The epoch's occurrences in merged order: global ids, durations, slices and bucket keys.

    ``positions``: the stream positions each corpus plays this epoch (:mod:`shardio.planning.streams`).
    """
    names = mix.names
    offsets = corpus_offsets([corpora[name].shard_ids.shape[0] for name in names])
    streams, keys, spans = [], [], [1]
    for name in names:
        local, windows = stream_samples(corpora[name], eligible[name], ordering, seed, name, positions[name])
        streams.append(local)
        quota = local.shape[0]
        jitter = rng(seed, epoch, MIX, corpus_key(name), MERGE).random(quota) if ordering.shuffle else 0.5
        keys.append((np.arange(quota, dtype=np.float64) + jitter) / max(quota, 1))
        # A corpus within one shard window is local however often it repeats: it does not cut slices.
        if quota and corpora[name].num_shards > ordering.shuffle_shards:
            spans.append(int(windows.max() - windows.min()) + 1)
    total, count = sum(s.shape[0] for s in streams), max(spans)
    global_ids = np.empty(total, dtype=np.int64)
    slices = np.empty(total, dtype=np.int64)
    numbers = np.empty(total, dtype=np.int64)
    stream_positions = np.empty(total, dtype=np.int64)
    for c, place in enumerate(merge_places(keys)):
        global_ids[place] = offsets[c] + streams[c]
        slices[place] = np.minimum((keys[c] * count).astype(np.int64), count - 1)
        numbers[place] = c
        stream_positions[place] = positions[names[c]]
    all_durations = np.concatenate([np.asarray(corpora[name].durations, dtype=np.float64) for name in names])
    durations = all_durations[global_ids]
    buckets, edges = np.zeros(total, dtype=np.int64), np.zeros(0)
    if batching.bucketed:
        weights = np.repeat(
            [max(positions[name].shape[0], 1) / int(eligible[name].sum()) for name in names], np.diff(offsets)
        )
        edges = bucketing.bucket_edges(all_durations, batching, weights)
        buckets = bucketing.bucket_of(durations, edges)
    if mix.single_corpus_batches:
        buckets = buckets * len(names) + numbers
    return Occurrences(global_ids, durations, slices, buckets, edges, numbers, stream_positions)
