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
The quotas come from :mod:`shardio.planning.quotas`, the merged occurrences from
:mod:`shardio.planning.occurrences`.
The plan's ``samples`` are *global* ids, ``offset[corpus] + local id`` with corpora in name order; a
global id recurs when its corpus repeats within the epoch, each time from another pass (the plan's
``passes``): a re-pass, a sample the epoch trains on again, never a *repeat* (which only fills the epoch's
last round or its fixed batch count, :mod:`shardio.planning.repeats`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..checks.options import integer
from ..checks.planargs import epoch_of, seed_of, world_size_of
from ..checks.states import MAX_COUNT
from ..errors import OptionError, StateError
from .mixoptions import Mix
from .occurrences import CorpusColumns, Occurrences, corpus_offsets, eligible_samples, merge_occurrences
from .options import check_options
from .order import MIX
from .plan import Batching, EpochPlan, Ordering, Segment, plan_segments, with_report
from .quotas import MAX_EPOCH_SAMPLES, check_epoch_size, mix_quotas
from .streams import Stream

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
) -> tuple[EpochPlan, Occurrences, _Args]:
    """:func:`plan_mix`'s plan over *occurrence* numbers (into the returned occurrences), before the ids are
    mapped to global ids: the re-mix (:mod:`shardio.ledger.remix`) reads stream positions from it."""
    seed, since = seed_of(seed), integer("since", since, 0, MAX_COUNT)
    epoch = epoch_of(epoch, 0 if tail is not None else since)  # from since: where the mix took effect
    world_size = world_size_of(world_size)
    check_options(batching, ordering)
    columns = {name: CorpusColumns(*value) for name, value in corpora.items()}
    eligible = eligible_samples(columns, mix, batching)
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
    occurrences = merge_occurrences(
        columns, mix, batching, ordering, eligible, positions, seed=seed, epoch=epoch
    )
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
    sizes = np.array([int(eligible[name].sum()) for name in mix.names], dtype=np.int64)
    chosen = occurrences.numbers[plan.samples]
    passes = occurrences.positions[plan.samples] // sizes[chosen]
    return with_report(
        replace(plan, samples=global_ids[plan.samples], excluded=excluded, passes=passes),
        samples=int(offsets[-1]),
        corpora=stats,
        **({"bucket_edges": occurrences.edges.round(6).tolist()} if batching.bucketed else {}),
    )
