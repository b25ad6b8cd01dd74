"""The planner at its edges: tiny corpora and huge worlds, filters that leave out everything, ties and zeros,
many elastic segments, quarantine-like exclusions, and mixes of 1-sample corpora with tiny weights.

Each property checks the planner's promises: every rank the same number of batches; every eligible sample
exactly once per epoch, across every elastic segment (``pad`` repeats only what it reports, ``drop`` leaves
out only its reported last round); ``max_duration`` (and ``max_batch_size``) kept; the same plan for the same
inputs; well under a second for a tiny input. Found by this file's properties: a mix's stream scanned every
position once per pass (quadratic in the passes of a small corpus), a primary corpus of a weight that
underflows and a world of no ranks raised ZeroDivisionError (or planned nothing) instead of an OptionError.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_checks import assert_rest_consumes_each_once

import shardio.planning.streams as streams
from shardio.errors import OptionError
from shardio.planning.mix import CorpusColumns, mix_quotas, plan_mix
from shardio.planning.mixoptions import EpochSize, Mix
from shardio.planning.options import Batching, Ordering, sample_cost
from shardio.planning.order import MIX, window_order
from shardio.planning.plan import EpochPlan, Segment, plan_epoch

EDGES = settings(
    max_examples=100, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
TOLERANCE = 1 + 1e-9
SECONDS = 1.0
"""The most one plan of a tiny input may take (a hang or a quadratic blow-up fails)."""

Corpus = tuple[np.ndarray, np.ndarray, int]


@st.composite
def corpora(draw: st.DrawFn) -> Corpus:
    """0 to 40 samples in 1-5 shards: durations of a few values (ties, zeros) or any in 0-40 s."""
    n = draw(st.integers(0, 6) | st.integers(0, 40))
    values = st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 2.0, 3.0, 30.0]) | st.floats(0.0, 40.0)
    durations = np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)
    shards = draw(st.integers(1, 5))
    shard_ids = np.sort(
        np.array(draw(st.lists(st.integers(0, shards - 1), min_size=n, max_size=n)), dtype=np.int64)
    )
    return shard_ids.astype(np.uint32), durations, shards


@st.composite
def batchings(draw: st.DrawFn, durations: np.ndarray) -> Batching:
    """Any batching, with edges (filters, bins, max_duration) often equal to a sample's duration."""
    values = sorted(set(durations.tolist())) or [1.0]
    edge = st.sampled_from(values) | st.floats(0.0, 40.0)
    low, high = draw(st.none() | edge), draw(st.none() | edge)
    if low is not None and high is not None and low > high:
        low, high = high, low
    bucketing = draw(st.sampled_from(["none", "number", "bins"]))
    bins = None
    if bucketing == "bins":
        positive = [v for v in values if v > 0] + [1.0]
        bins = tuple(
            sorted(
                set(draw(st.lists(st.sampled_from(positive) | st.floats(0.01, 40.0), min_size=1, max_size=4)))
            )
        )
    options: dict[str, Any] = dict(
        remainder=draw(st.sampled_from(["pad", "drop"])),
        duration_bins=bins,
        num_buckets=draw(st.integers(1, 60)) if bucketing == "number" else None,
        sync_buckets=draw(st.sampled_from([None, True, False])),
        min_duration=low,
        max_sample_duration=high,
    )
    kind = draw(st.sampled_from(["fixed", "duration", "single"]))
    if kind == "fixed":
        return Batching(batch_size=draw(st.integers(1, 4)), **options)
    if kind == "single":
        return Batching(**options)
    return Batching(
        max_duration=draw(st.sampled_from([1e-3, 0.5, 1.0, 3.0, 60.0]) | st.floats(1e-3, 100.0)),
        max_batch_size=draw(st.none() | st.integers(1, 3)),
        quadratic_duration=draw(st.none() | st.sampled_from([0.5, 15.0])),
        **options,
    )


WORLDS = st.sampled_from([1, 2, 3, 8, 1000]) | st.integers(1, 12)


def timed_plan(
    corpus: Corpus, world_size: int, batching: Batching, ordering: Ordering, **options: Any
) -> EpochPlan:
    """``plan_epoch`` of ``corpus`` (seed 5, epoch 2 unless given), twice: it must be
    quick and deterministic."""
    options.setdefault("seed", 5)
    options.setdefault("epoch", 2)
    shard_ids, durations, shards = corpus
    began = time.perf_counter()
    plan = plan_epoch(
        shard_ids, durations, shards, world_size=world_size, batching=batching, ordering=ordering, **options
    )
    assert time.perf_counter() - began < SECONDS, "a tiny plan took too long"
    again = plan_epoch(
        shard_ids, durations, shards, world_size=world_size, batching=batching, ordering=ordering, **options
    )
    for name in ("samples", "offsets", "rank_batches"):
        assert np.array_equal(getattr(plan, name), getattr(again, name)), f"{name} is not deterministic"
    assert plan.report == again.report
    assert plan.rank_batches.shape == (world_size, plan.num_batches), "ranks differ in batch count"
    check_batches(plan, durations, batching)
    return plan


def check_batches(plan: EpochPlan, durations: np.ndarray, batching: Batching) -> None:
    """No empty batch; each within ``batch_size``, or ``max_duration`` (count x costliest)
    and ``max_batch_size``."""
    sizes = np.diff(plan.offsets)
    assert (sizes > 0).all(), "an empty batch"
    if batching.max_duration is None:
        assert (sizes <= (batching.batch_size or 1)).all()
        return
    costs = sample_cost(durations, batching.quadratic_duration)
    for start, end in zip(plan.offsets[:-1].tolist(), plan.offsets[1:].tolist()):
        assert (end - start) * costs[plan.samples[start:end]].max() <= batching.max_duration * TOLERANCE
        assert end - start <= (batching.max_batch_size or end - start)


def taken_by(plan: EpochPlan, size: int, batches: int) -> np.ndarray:
    """How often each id occurs in the first ``batches`` batches of every rank."""
    parts = [plan.batch(r, j).astype(np.int64) for r in range(plan.world_size) for j in range(batches)]
    return np.bincount(np.concatenate([np.zeros(0, np.int64), *parts]), minlength=size)


def play(
    data: st.DataObject,
    corpus: Corpus,
    batching: Batching,
    ordering: Ordering,
    worlds: list[int],
    exclude: tuple[tuple[int, np.ndarray], ...] = (),
) -> tuple[np.ndarray, int, EpochPlan]:
    """Play an epoch over a segment per world size (each consuming 0, all or some of its batches; the last all
    of them): every id's count over the epoch, the repeats consumed in finished
    segments, and the last plan."""
    n = corpus[1].shape[0]
    counts, repeats, history = np.zeros(n, np.int64), 0, ()
    for number, world_size in enumerate(worlds):
        plan = timed_plan(corpus, world_size, batching, ordering, history=history, exclude=exclude)
        gone = np.zeros(n, dtype=bool)
        for at, ids in exclude:
            gone[ids] |= at <= number
        assert not gone[plan.samples].any(), "an excluded sample was planned"
        last = number == len(worlds) - 1
        consumed = (
            plan.num_batches
            if last
            else data.draw(
                st.sampled_from([0, plan.num_batches]) | st.integers(0, plan.num_batches),
                label=f"consumed {number}",
            )
        )
        taken = taken_by(plan, n, consumed)
        assert not (counts.astype(bool) & taken.astype(bool)).any(), "a consumed sample was planned again"
        if not last:
            again = int(taken.sum() - (taken > 0).sum())
            assert again == 0 or consumed == plan.num_batches, "repeats before the last round"
            repeats += again
            history += (Segment(world_size, consumed),)
        counts += taken
    return counts, repeats, plan


def check_once(counts: np.ndarray, keep: np.ndarray, repeats: int, final: EpochPlan, remainder: str) -> None:
    """Every kept sample once, but for the last plan's reported remainder and the
    finished segments' repeats."""
    kept = counts[keep]
    if remainder == "drop":
        assert repeats == 0 and counts.max(initial=0) <= 1, "drop repeated a sample"
        assert int((kept == 0).sum()) == final.dropped, "a sample was lost beyond the dropped round"
    else:
        assert kept.min(initial=1) >= 1, "pad lost a sample"
        assert int(np.maximum(counts - 1, 0).sum()) == repeats + final.padded, "unreported repeats"


@EDGES
@given(
    data=st.data(),
    corpus=corpora(),
    worlds=st.lists(WORLDS, min_size=1, max_size=33),
    shuffle=st.booleans(),
    shuffle_shards=st.integers(1, 3),
)
def test_elastic_epochs_at_the_edges_consume_every_sample_once(
    data: st.DataObject, corpus: Corpus, worlds: list[int], shuffle: bool, shuffle_shards: int
) -> None:
    """Up to 32 finished segments (the most a state keeps), worlds of 1-12 and 1000
    ranks over 0-40 samples."""
    batching = data.draw(batchings(corpus[1]), label="batching")
    counts, repeats, final = play(data, corpus, batching, Ordering(shuffle, shuffle_shards), worlds)
    eligible = batching.eligible(corpus[1])
    assert not counts[~eligible].any(), "a filtered-out sample was planned"
    assert final.excluded == int((~eligible).sum())
    check_once(counts, eligible, repeats, final, batching.remainder)


@EDGES
@given(data=st.data(), corpus=corpora(), worlds=st.lists(WORLDS, min_size=1, max_size=6))
def test_exclusions_of_everything_or_all_but_one_keep_the_rest_exactly_once(
    data: st.DataObject, corpus: Corpus, worlds: list[int]
) -> None:
    """``exclude`` (a quarantine at resume) of all samples, all but one, a few or
    none, from any segment on."""
    batching = data.draw(batchings(corpus[1]), label="batching")
    n = corpus[1].shape[0]
    exclude = []
    for _ in range(data.draw(st.integers(0, 3), label="exclusions")):
        at = data.draw(st.integers(0, len(worlds)), label="from segment")
        form = data.draw(st.sampled_from(["all", "all but one", "some", "none"]), label="form")
        ids = np.arange(n)
        if form == "all but one" and n:
            ids = np.delete(ids, data.draw(st.integers(0, n - 1), label="kept"))
        elif form in ("some", "none"):
            ids = np.unique(
                np.array(
                    data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=4 * (form == "some")))
                    if n
                    else [],
                    dtype=np.int64,
                )
            )
        exclude.append((at, ids))
    counts, repeats, final = play(data, corpus, batching, Ordering(shuffle_shards=2), worlds, tuple(exclude))
    quarantined = np.zeros(n, dtype=bool)
    for at, ids in exclude:
        quarantined[ids] |= at < len(worlds)
    check_once(counts, batching.eligible(corpus[1]) & ~quarantined, repeats, final, batching.remainder)


def test_more_ranks_than_samples_pads_every_rank_or_drops_the_round() -> None:
    corpus = (np.zeros(3, np.uint32), np.array([1.0, 1.0, 1.0]), 1)
    padded = timed_plan(corpus, 1000, Batching(max_duration=1.0, num_buckets=7), Ordering())
    assert padded.num_batches == 1 and padded.padded == 997
    counts = taken_by(padded, 3, 1)
    assert counts.min() >= 1 and counts.sum() == 1000  # each sample, then repeats for the other 997 ranks
    dropped = timed_plan(
        corpus, 1000, Batching(max_duration=1.0, num_buckets=7, remainder="drop"), Ordering()
    )
    assert dropped.num_batches == 0 and dropped.dropped == 3


def test_durations_apart_by_less_than_a_float_can_split_make_one_bucket() -> None:
    """18 zeros and one 5e-324 s (found by the property above): the histogram's cell width rounded to 0,
    and the bucket edges divided by it (a ValueError from numpy's bincount). They are one bucket."""
    durations = np.array([0.0] * 18 + [5e-324])
    plan = plan_epoch(
        np.zeros(19, np.uint32),
        durations,
        1,
        seed=0,
        epoch=0,
        world_size=1,
        batching=Batching(num_buckets=2),
        ordering=Ordering(shuffle=False),
    )
    assert sorted(plan.samples.tolist()) == list(range(19))


@pytest.mark.parametrize(
    "world_size, history", [(0, ()), (-2, ()), (2, (Segment(0, 0),)), (2, (Segment(-1, 0),))]
)
def test_a_world_without_ranks_is_an_option_error(world_size: int, history: tuple[Segment, ...]) -> None:
    """It was a ZeroDivisionError or a ValueError, or with no samples a plan for no rank."""
    for n in (3, 0):
        with pytest.raises(OptionError, match=r"world_size must be an integer from 1 to \d+, not -?\d"):
            plan_epoch(
                np.zeros(n, np.uint32),
                np.ones(n),
                1,
                seed=0,
                epoch=0,
                world_size=world_size,
                batching=Batching(batch_size=1),
                history=history,
            )


# -- mixes -----------------------------------------------------------------------------------------------


@st.composite
def mix_corpora(draw: st.DrawFn) -> dict[str, CorpusColumns]:
    """1-3 corpora of 1-20 samples, often of a single sample."""
    found = {}
    for number in range(draw(st.integers(1, 3))):
        n = draw(st.sampled_from([1, 1, 2, 5, 20]))
        shards = draw(st.integers(1, 4))
        shard_ids = np.sort(np.array(draw(st.lists(st.integers(0, shards - 1), min_size=n, max_size=n))))
        durations = draw(
            st.lists(
                st.sampled_from([0.5, 1.0, 1.0, 3.0, 7.0]) | st.floats(0.1, 20.0), min_size=n, max_size=n
            )
        )
        found[f"c{number}"] = CorpusColumns(shard_ids.astype(np.uint32), np.array(durations), shards)
    return found


@EDGES
@given(data=st.data(), corpora=mix_corpora(), seed=st.integers(0, 1000), epoch=st.integers(0, 3))
def test_mixes_of_tiny_corpora_and_weights_draw_their_quotas_and_resume_exactly_once(
    data: st.DataObject, corpora: dict[str, CorpusColumns], seed: int, epoch: int
) -> None:
    names = sorted(corpora)
    weights = {
        name: data.draw(st.sampled_from([1e-9, 1e-3, 0.5, 1.0]) | st.floats(1e-6, 1.0), label=name)
        for name in names
    }
    size = data.draw(
        st.sampled_from(names).map(lambda name: EpochSize(primary=name))
        | st.sampled_from([1e-6, 1e-3, 0.01]).map(lambda hours: EpochSize(hours=hours))
        | st.integers(1, 12).map(lambda batches: EpochSize(batches=batches)),
        label="epoch size",
    )
    mix = Mix(
        weights,
        size,
        weight_by=data.draw(st.sampled_from(["duration", "samples"]), label="weight_by"),
        single_corpus_batches=data.draw(st.booleans(), label="single corpus"),
    )
    options: dict[str, Any] = dict(
        remainder=data.draw(st.sampled_from(["pad", "drop"]), label="remainder"),
        num_buckets=data.draw(st.sampled_from([None, 1, 3, 50]), label="buckets"),
        sync_buckets=data.draw(st.sampled_from([None, True, False]), label="sync"),
    )
    batching = (
        Batching(batch_size=data.draw(st.integers(1, 3)), **options)
        if data.draw(st.booleans())
        else Batching(
            max_duration=data.draw(st.sampled_from([0.3, 2.0, 10.0])),
            **options,
            max_batch_size=data.draw(st.sampled_from([None, 1])),
        )
    )
    ordering = Ordering(shuffle=data.draw(st.booleans()), shuffle_shards=data.draw(st.integers(1, 2)))
    first, second = data.draw(st.sampled_from([1, 2, 3, 1000])), data.draw(st.sampled_from([1, 2, 5, 1000]))
    try:
        quotas = mix_quotas(corpora, mix, batching, seed=seed, ordering=ordering)
    except OptionError as error:  # a corpus without an eligible sample, or an epoch beyond what shardio plans
        assert any(words in str(error) for words in ("no sample within", "epoch_size", "weight")), error
        return
    if sum(quotas.values()) > 3000:  # a big epoch of tiny corpora: correct, but not quick enough for here
        return
    began = time.perf_counter()
    common: dict[str, Any] = dict(seed=seed, epoch=epoch, batching=batching, ordering=ordering)
    full = plan_mix(corpora, mix, world_size=first, **common)
    assert time.perf_counter() - began < SECONDS
    assert full.rank_batches.shape == (first, full.num_batches)
    durations = np.concatenate([corpora[name].durations for name in names])
    check_batches(full, durations, batching)
    if size.batches is not None:
        assert full.offsets.shape[0] - 1 == size.batches
    else:
        assert {name: full.report["corpora"][name]["samples"] for name in names} == quotas
    consumed = data.draw(
        st.sampled_from([0, full.num_batches]) | st.integers(0, full.num_batches), label="consumed"
    )
    rest = plan_mix(corpora, mix, world_size=second, history=[Segment(first, consumed)], **common)
    assert rest.rank_batches.shape == (second, rest.num_batches)
    assert_rest_consumes_each_once(full, rest, consumed)


def test_a_primary_corpus_whose_weight_underflows_is_an_option_error() -> None:
    """Its samples per second round to 0: one pass over it was a ZeroDivisionError."""
    corpora = {
        name: CorpusColumns(np.zeros(3, np.uint32), np.full(3, seconds), 1)
        for name, seconds in (("long", 30.0), ("short", 1.0))
    }
    with pytest.raises(OptionError, match="EpochSize primary 'long' has a weight"):
        mix_quotas(corpora, Mix({"long": 5e-324, "short": 1.0}, EpochSize(primary="long")))


def reference_stream_samples(
    columns: CorpusColumns, keep: np.ndarray, ordering: Ordering, seed: int, name: str, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``stream_samples`` as the definition reads: each pass's order, looked up for each of its positions."""
    size, width = int(keep.sum()), -(-columns.num_shards // ordering.shuffle_shards)
    local, windows = np.empty(positions.shape[0], np.int64), np.empty(positions.shape[0], np.int64)
    for i, position in enumerate(positions.tolist()):
        p = position // size
        order, window = window_order(
            columns.shard_ids, columns.num_shards, ordering, (seed, p, MIX, streams.corpus_key(name))
        )
        local[i] = order[keep[order]][position - p * size]
        windows[i] = p * width + window[local[i]]
    return local, windows


@settings(max_examples=60, deadline=None, database=None)
@given(
    data=st.data(),
    n=st.integers(1, 12),
    shards=st.integers(1, 4),
    seed=st.integers(0, 99),
    ordering=st.builds(Ordering, shuffle=st.booleans(), shuffle_shards=st.integers(1, 3)),
)
def test_stream_samples_match_their_definition_for_any_positions(
    data: st.DataObject, n: int, shards: int, seed: int, ordering: Ordering
) -> None:
    """Positions in any order (a re-mix's pending ones come first), several passes,
    some samples ineligible."""
    shard_ids = np.sort(np.array(data.draw(st.lists(st.integers(0, shards - 1), min_size=n, max_size=n))))
    columns = CorpusColumns(shard_ids.astype(np.uint32), np.ones(n), shards)
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    keep[data.draw(st.integers(0, n - 1))] = True
    positions = np.array(data.draw(st.lists(st.integers(0, 5 * n), max_size=30)), dtype=np.int64)
    got = streams.stream_samples(columns, keep, ordering, seed, "x", positions)
    expected = reference_stream_samples(columns, keep, ordering, seed, "x", positions)
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


def test_a_stream_of_many_passes_is_not_scanned_once_per_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-sample corpus in an epoch of 100 000 draws: as many passes. Each pass's positions used to be found
    by scanning all positions (10**10 steps here, about 12 s); found by one sort, the loop takes well under 1
    s. The pass orders themselves are replaced by a cheap stand-in, so only the lookup is timed."""

    def identity(
        shard_ids: np.ndarray, num_shards: int, ordering: Ordering, key: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(shard_ids.shape[0], dtype=np.int64), np.zeros(shard_ids.shape[0], dtype=np.int64)

    monkeypatch.setattr(streams, "window_order", identity)
    positions = np.arange(100_000, dtype=np.int64)
    began = time.perf_counter()
    local, windows = streams.stream_samples(
        CorpusColumns(np.zeros(1, np.uint32), np.ones(1), 1),
        np.ones(1, bool),
        Ordering(),
        0,
        "tiny",
        positions,
    )
    assert time.perf_counter() - began < 4.0
    assert not local.any() and np.array_equal(windows, positions)
