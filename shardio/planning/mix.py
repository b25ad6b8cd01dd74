"""Multi-corpus mixing: several indexes, weighted, planned on metadata and resumable as one dataset.

**Streams.** Each corpus is an endless stream of *passes*; pass ``p`` is one shuffled order of all its
eligible samples (shards permuted, samples shuffled within shard windows), seeded by
``(seed, p, corpus)`` and by nothing else. Every epoch takes the next ``quota`` samples of each stream:
epoch ``e`` holds stream positions ``[e * quota, (e + 1) * quota)`` (after a re-mix, the next ones from where
the stream stood: :mod:`shardio.planning.streams`). A small corpus therefore repeats
(several passes in one epoch) and a large one is spread over epochs, and in both cases every sample is
taken exactly once per pass of its corpus, pass after pass, across epoch boundaries.

**Epoch size** (:class:`~shardio.planning.mixoptions.EpochSize`), and the quotas that follow from it and the
weights: ``primary`` (one pass over that corpus: its quota is its size), ``hours`` (that much audio in all),
or ``batches`` (exactly that many global batches, before the deal to ranks; quotas are sized on calibration
plans with a 2-5% margin: the samples planned beyond the last batch are skipped, ``report["skipped"]``, so a
pass may miss a few; a rare shortfall is filled by repeating batches, ``report["repeated"]``). Weights are
shares of audio (``weight_by="duration"``) or of samples.

**Plan.** The corpora's epoch slices are merged: position ``i`` of a corpus with quota ``q`` gets the
key ``(i + u) / q`` (``u`` uniform), so every stretch of the epoch holds each corpus in its share. The
merged epoch is cut into as many *slices* as the busiest corpus has shard windows; within a slice samples
are bucketed and batched (optionally per corpus: ``single_corpus_batches``) and the batch order shuffled.
Each occurrence (corpus, pass, sample) gets its own id in the planner, so the deal, the remainder and
the elastic re-plan of :func:`shardio.planning.plan.plan_segments` apply unchanged: after a world-size change
every occurrence not yet consumed is consumed exactly once; no pass of any corpus loses or repeats a sample.
The plan's ``samples`` are *global* ids, ``offset[corpus] + local id`` with corpora in name order; a
global id repeats when its corpus repeats within the epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..errors import OptionError, StateError
from . import bucketing
from .mixoptions import Mix
from .order import MERGE, MIX, rng
from .plan import Batching, EpochPlan, Ordering, Segment, plan_segments, with_report
from .streams import Stream, corpus_key, merge_places, stream_samples

__all__ = [
    "CorpusColumns",
    "check_epoch_size",
    "plan_mix",
    "plan_occurrences",
    "mix_quotas",
    "corpus_offsets",
    "MAX_EPOCH_SAMPLES",
    "MAX_TAIL_EPOCHS",
    "tail_limit",
]

logger = logging.getLogger(__name__)

_NO_RANGES = np.zeros((0, 2), dtype=np.int64)


class CorpusColumns(NamedTuple):
    """What the mix planner needs of one corpus: per-sample shard ids and durations, and the shard count."""

    shard_ids: np.ndarray
    durations: np.ndarray
    num_shards: int


def corpus_offsets(sizes: Sequence[int]) -> np.ndarray:
    """Global id offsets: corpus ``c`` (in name order) holds ids ``[offsets[c], offsets[c + 1])``."""
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def _check(corpora: Mapping[str, CorpusColumns], mix: Mix, batching: Batching) -> dict[str, np.ndarray]:
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


def _rates(
    corpora: Mapping[str, CorpusColumns], mix: Mix, eligible: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Samples of each corpus per second of epoch audio."""
    means = {name: float(corpora[name].durations[eligible[name]].mean()) for name in mix.names}
    if mix.weight_by == "duration":
        return {name: w / max(means[name], 1e-9) for name, w in mix.weights.items()}
    per_sample = sum(w * means[name] for name, w in mix.weights.items())
    return {name: w / max(per_sample, 1e-9) for name, w in mix.weights.items()}


def mix_quotas(
    corpora: Mapping[str, CorpusColumns | tuple[np.ndarray, np.ndarray, int]],
    mix: Mix,
    batching: Batching = Batching(),
    *,
    seed: int = 0,
    ordering: Ordering = Ordering(),
) -> dict[str, int]:
    """Samples each corpus contributes to every epoch (the same for every epoch)."""
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = _check(columns, mix, batching)
    rates = _rates(columns, mix, eligible)
    size = mix.epoch_size
    if size.primary is not None:
        if not rates[size.primary] > 0:  # a weight so small that its samples per second underflow to 0
            raise OptionError(
                f"EpochSize primary {size.primary!r} has a weight ({mix.weights[size.primary]:.3g}) too "
                "small to plan one pass over it: give it a larger weight, or another epoch_size"
            )
        seconds = float(eligible[size.primary].sum()) / rates[size.primary]
    elif size.hours is not None:
        seconds = size.hours * 3600.0
    else:
        assert size.batches is not None
        per_batch = (
            batching.max_duration
            if batching.max_duration is not None
            else (batching.batch_size or 1) / sum(rates.values())
        )
        # At least `batches` batches (none holds more than this); then shrink toward a 2-5% margin by a few
        # secant steps on calibration plans of epoch 0 (partial batches make the count not proportional).
        seconds = best = size.batches * per_batch
        target, aim = 1.02 * (size.batches + 1), 1.05 * (size.batches + 1)
        for _ in range(4):
            trial = _occurrences(
                columns,
                mix,
                batching,
                ordering,
                eligible,
                {n: np.arange(q) for n, q in _quotas(rates, seconds).items()},
                seed=seed,
                epoch=0,
            )
            found = (
                plan_segments(
                    np.arange(trial.global_ids.shape[0]),
                    trial.durations,
                    seed=seed,
                    epoch=0,
                    world_size=1,
                    batching=batching,
                    windows=trial.slices,
                    buckets=trial.buckets,
                    shuffle=ordering.shuffle,
                    purpose=(MIX,),
                ).offsets.shape[0]
                - 1
            )
            if found >= target:
                best = min(best, seconds)
            seconds *= aim / max(found, 1)
        seconds = best
    return _quotas(rates, seconds)


def check_epoch_size(corpora: Mapping[str, CorpusColumns], mix: Mix, batching: Batching) -> None:
    """An :class:`OptionError` where ``mix``'s epoch cannot be planned over ``corpora``: a corpus without an
    eligible sample, a primary whose weight is too small for a pass, or an epoch of more than
    :data:`MAX_EPOCH_SAMPLES` samples (for ``batches``: at the planner's first estimate).
    Cheap: no plan is made."""
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = _check(columns, mix, batching)
    rates = _rates(columns, mix, eligible)
    size = mix.epoch_size
    if size.primary is not None:
        if not rates[size.primary] > 0:
            raise OptionError(
                f"EpochSize primary {size.primary!r} has a weight ({mix.weights[size.primary]:.3g}) too "
                "small to plan one pass over it: give it a larger weight, or another epoch_size"
            )
        _quotas(rates, float(eligible[size.primary].sum()) / rates[size.primary])
    elif size.hours is not None:
        _quotas(rates, size.hours * 3600.0)
    elif size.batches is not None:
        per_batch = (
            batching.max_duration
            if batching.max_duration is not None
            else (batching.batch_size or 1) / sum(rates.values())
        )
        _quotas(rates, size.batches * per_batch)


MAX_EPOCH_SAMPLES = 1 << 30
"""The most samples one epoch of a mix may draw (a plan holds a few arrays of that length)."""

MAX_TAIL_EPOCHS = 8
"""The most epochs of a mix that the rest of an epoch re-mixed mid-way (a state's ``tail``) may hold: it is
planned like one epoch of the mix that plays it, so the mix (the user's options), not the state's few bytes
of ranges, sizes that plan. New weights or corpora change an epoch's sample count (test mixes: up to ~3x), so
the bound leaves room; a mid-epoch re-mix into a mix with much smaller epochs is refused (re-mix at the
epoch's end)."""


def tail_limit(quotas: Mapping[str, int]) -> int:
    """The most stream positions a rest of epoch may hold in a mix whose epoch draws ``quotas``: at most
    :data:`MAX_TAIL_EPOCHS` of its epochs and no more than one epoch of any mix (with one position of rounding
    per corpus)."""
    return min(MAX_TAIL_EPOCHS * sum(quotas.values()), MAX_EPOCH_SAMPLES) + len(quotas)


def _quotas(rates: Mapping[str, float], seconds: float) -> dict[str, int]:
    drawn = sum(rate * seconds for rate in rates.values())
    if not drawn <= MAX_EPOCH_SAMPLES:
        raise OptionError(
            f"the mix's epoch_size makes an epoch of about {drawn:.3g} samples, more than shardio plans "
            f"in one epoch ({MAX_EPOCH_SAMPLES}): give a smaller epoch_size"
        )
    return {name: max(1, int(round(rate * seconds))) for name, rate in rates.items()}


class _Epoch(NamedTuple):
    global_ids: np.ndarray  # per occurrence, in merged order
    durations: np.ndarray
    slices: np.ndarray
    buckets: np.ndarray
    edges: np.ndarray
    numbers: np.ndarray  # per occurrence: its corpus's number (name order)
    positions: np.ndarray  # per occurrence: its position in its corpus's stream


def _occurrences(
    corpora: Mapping[str, CorpusColumns],
    mix: Mix,
    batching: Batching,
    ordering: Ordering,
    eligible: Mapping[str, np.ndarray],
    positions: Mapping[str, np.ndarray],
    *,
    seed: int,
    epoch: int,
) -> _Epoch:
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
    return _Epoch(global_ids, durations, slices, buckets, edges, numbers, stream_positions)


class _Args(NamedTuple):
    columns: dict[str, CorpusColumns]
    eligible: dict[str, np.ndarray]
    quotas: dict[str, int]


def plan_occurrences(
    corpora: Mapping[str, CorpusColumns | tuple[np.ndarray, np.ndarray, int]],
    mix: Mix,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    batching: Batching = Batching(),
    ordering: Ordering = Ordering(),
    history: Sequence[Segment] = (),
    exclude: Sequence[tuple[int, np.ndarray]] = (),
    cursors: Mapping[str, int] | None = None,
    since: int = 0,
    pending: Mapping[str, np.ndarray] | None = None,
    tail: Mapping[str, np.ndarray] | None = None,
) -> tuple[EpochPlan, _Epoch, _Args]:
    """:func:`plan_mix`'s plan over *occurrence* numbers (into the returned occurrences), before the ids are
    mapped to global ids: the re-mix (:mod:`shardio.ledger.remix`) reads stream positions from it."""
    if seed < 0 or since < 0 or (epoch < since and tail is None):
        raise OptionError(
            f"seed and epoch must be non-negative integers (epoch at least {since}, where the "
            f"mix took effect), not {seed} and {epoch}"
        )
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = _check(columns, mix, batching)
    quotas = mix_quotas(columns, mix, batching, seed=seed, ordering=ordering)
    if tail is not None:  # the rest of an epoch re-mixed mid-way: exactly these positions, no epoch size
        ranges = {
            name: Stream(0, np.asarray(tail.get(name, _NO_RANGES), dtype=np.int64).reshape(-1, 2))
            for name in mix.names
        }
        total, most = sum(r.held for r in ranges.values()), MAX_TAIL_EPOCHS * sum(quotas.values())
        if total > tail_limit(quotas):  # checked before any position is expanded
            raise StateError(
                f"malformed loader state: extra.remix.tail holds {total} stream positions for "
                f"the rest of epoch {epoch}, more than this mix plays in {MAX_TAIL_EPOCHS} epochs "
                f"({most}) or any mix in one ({MAX_EPOCH_SAMPLES})"
            )
        positions = {name: r.take(0, r.held) for name, r in ranges.items()}  # the ranges' positions, in order
        quotas, limit = {name: int(found.shape[0]) for name, found in positions.items()}, None
    else:
        positions = {}
        for name, quota in quotas.items():
            held = np.asarray((pending or {}).get(name, _NO_RANGES), dtype=np.int64).reshape(-1, 2)
            stream = Stream((cursors or {}).get(name, 0), held)
            try:
                positions[name] = stream.take((epoch - since) * quota, quota)
            except OptionError as exc:
                raise OptionError(
                    f"epoch {epoch} of corpus {name!r} (its stream at {stream.cursor} from "
                    f"epoch {since}, {quota} positions an epoch): {exc}"
                ) from None
        limit = mix.epoch_size.batches
    occurrences = _occurrences(columns, mix, batching, ordering, eligible, positions, seed=seed, epoch=epoch)
    global_ids = occurrences.global_ids
    exclude = [(at, np.flatnonzero(np.isin(global_ids, ids))) for at, ids in exclude]
    plan = plan_segments(
        np.arange(global_ids.shape[0]),
        occurrences.durations,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        history=history,
        windows=occurrences.slices,
        buckets=occurrences.buckets,
        shuffle=ordering.shuffle,
        purpose=(MIX,),
        limit=limit,
        exclude=exclude,
    )
    return plan, occurrences, _Args(columns, eligible, quotas)


def plan_mix(
    corpora: Mapping[str, CorpusColumns | tuple[np.ndarray, np.ndarray, int]],
    mix: Mix,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    batching: Batching = Batching(),
    ordering: Ordering = Ordering(),
    history: Sequence[Segment] = (),
    exclude: Sequence[tuple[int, np.ndarray]] = (),
    cursors: Mapping[str, int] | None = None,
    since: int = 0,
    pending: Mapping[str, np.ndarray] | None = None,
    tail: Mapping[str, np.ndarray] | None = None,
) -> EpochPlan:
    """Plan ``epoch`` of the mix for ``world_size`` ranks, after the finished segments in ``history``.

    Returns the same :class:`EpochPlan` shape as :func:`shardio.planning.plan.plan_epoch`, over global ids
    (see the module docs); ``report["corpora"]`` gives each corpus's samples, seconds and share in this plan.
    ``exclude``: ``(segment number, global ids)`` pairs: every occurrence of those ids is left out from that
    segment on. ``cursors``, ``pending`` and ``since``: each corpus's stream at epoch ``since`` (a re-mix,
    :mod:`shardio.planning.streams`; ``pending`` as ranges, ``(k, 2)`` arrays of ``[start, stop)``);
    ``tail``: this epoch plays exactly these stream positions of each corpus instead (the rest of an epoch
    re-mixed mid-way; ranges as ``pending``), a :class:`StateError` where they are more than
    :data:`MAX_TAIL_EPOCHS` epochs of this mix.
    """
    plan, occurrences, (columns, eligible, quotas) = plan_occurrences(
        corpora,
        mix,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        ordering=ordering,
        history=history,
        exclude=exclude,
        cursors=cursors,
        since=since,
        pending=pending,
        tail=tail,
    )
    global_ids, durations = occurrences.global_ids, occurrences.durations
    offsets = corpus_offsets([columns[name].shard_ids.shape[0] for name in mix.names])
    number = np.searchsorted(offsets, global_ids[plan.samples], side="right") - 1
    seconds = np.bincount(number, weights=durations[plan.samples], minlength=len(mix.names))
    counts = np.bincount(number, minlength=len(mix.names))
    share = seconds if mix.weight_by == "duration" else counts
    stats = {
        name: {
            "samples": int(counts[c]),
            "seconds": round(float(seconds[c]), 3),
            "quota": quotas[name],
            "share": round(float(share[c] / max(share.sum(), 1e-9)), 6),
            "weight": mix.weights[name],
            "passes": round(quotas[name] / int(eligible[name].sum()), 6),
        }
        for c, name in enumerate(mix.names)
    }
    excluded = sum(int((~keep).sum()) for keep in eligible.values())
    return with_report(
        replace(plan, samples=global_ids[plan.samples], excluded=excluded),
        samples=int(offsets[-1]),
        corpora=stats,
        **({"bucket_edges": occurrences.edges.round(6).tolist()} if batching.bucketed else {}),
    )
