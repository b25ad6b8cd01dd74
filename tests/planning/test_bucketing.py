"""Duration bucketing in the planner: batch limits, buckets, filters, shuffled batch
order, padding, resume."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.errors import OptionError
from shardio.planning.batches import padding_ratio, sample_cost
from shardio.planning.bucketing import bucket_edges, bucket_of, equal_duration_bins
from shardio.planning.plan import Batching, Ordering, Segment, options_of, plan_epoch
from shardio.synth import duration_sample


@st.composite
def corpora(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    n = draw(st.integers(1, 300))
    num_shards = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    durations = np.round(rng.uniform(0.1, draw(st.sampled_from([2.0, 20.0, 40.0])), n), 3)
    shard_ids = np.sort(rng.integers(0, num_shards, n)).astype(np.uint32)
    return shard_ids, durations, num_shards


@st.composite
def bucketed_batchings(draw: st.DrawFn) -> Batching:
    fixed = draw(st.booleans())
    bins = draw(st.sampled_from([None, (1.0,), (0.5, 3.0, 10.0)]))
    low = draw(st.sampled_from([None, 0.3]))
    return Batching(
        batch_size=draw(st.integers(1, 9)) if fixed else None,
        max_duration=None if fixed else draw(st.sampled_from([25.0, 60.0])),
        max_batch_size=None if fixed else draw(st.sampled_from([None, 5])),
        remainder=draw(st.sampled_from(["pad", "drop"])),
        num_buckets=draw(st.integers(1, 6)) if bins is None else None,
        duration_bins=bins,
        quadratic_duration=None if fixed else draw(st.sampled_from([None, 15.0])),
        min_duration=low,
        max_sample_duration=draw(st.sampled_from([None, 18.0])),
    )


def formed_batches(plan) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    return [plan.samples[plan.offsets[b] : plan.offsets[b + 1]] for b in range(plan.offsets.shape[0] - 1)]


@settings(max_examples=60, deadline=None)
@given(corpus=corpora(), batching=bucketed_batchings(), world_size=st.integers(1, 5), epoch=st.integers(0, 3))
def test_bucketed_batches_keep_every_limit_and_every_sample(
    corpus: tuple[np.ndarray, np.ndarray, int], batching: Batching, world_size: int, epoch: int
) -> None:
    shard_ids, durations, num_shards = corpus
    plan = plan_epoch(
        shard_ids,
        durations,
        num_shards,
        seed=5,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        ordering=Ordering(shuffle_shards=2),
    )
    eligible = batching.eligible(durations)
    assert plan.excluded == int((~eligible).sum())
    assert sorted(plan.samples.tolist()) == np.flatnonzero(eligible).tolist()  # each eligible sample once
    buckets = bucket_of(durations, bucket_edges(durations, batching))
    for batch in formed_batches(plan):
        assert len(set(buckets[batch].tolist())) == 1, "a batch mixes duration buckets"
        if batching.batch_size is not None:
            assert len(batch) <= batching.batch_size
        else:
            cost = sample_cost(durations[batch], batching.quadratic_duration).max()
            assert len(batch) * cost <= batching.max_duration * (1 + 1e-9)  # type: ignore[operator]
        if batching.max_batch_size is not None:
            assert len(batch) <= batching.max_batch_size
    dealt = Counter(plan.rank_batches.ravel().tolist())
    if plan.num_batches:
        assert plan.rank_batches.shape == (world_size, plan.num_batches)
        formed = len(formed_batches(plan))
        if batching.remainder == "pad":  # every formed batch is dealt; the last round repeats from the start
            assert set(dealt) == set(range(formed))
        else:  # the last partial round is dropped
            assert set(dealt) == set(range(world_size * plan.num_batches))
            assert plan.dropped == int(plan.offsets[-1] - plan.offsets[world_size * plan.num_batches])


@settings(max_examples=40, deadline=None)
@given(
    corpus=corpora(),
    buckets=st.integers(1, 5),
    first=st.integers(1, 4),
    second=st.integers(1, 4),
    fraction=st.floats(0, 1),
)
def test_elastic_resume_with_buckets_consumes_every_sample_once(
    corpus: tuple[np.ndarray, np.ndarray, int], buckets: int, first: int, second: int, fraction: float
) -> None:
    shard_ids, durations, num_shards = corpus
    batching = Batching(max_duration=30.0, num_buckets=buckets, remainder="drop", max_sample_duration=25.0)
    options = dict(seed=1, epoch=2, batching=batching, ordering=Ordering(shuffle_shards=3))
    before = plan_epoch(shard_ids, durations, num_shards, world_size=first, **options)  # type: ignore[arg-type]
    consumed = int(fraction * before.num_batches)
    after = plan_epoch(
        shard_ids,
        durations,
        num_shards,
        world_size=second,  # type: ignore[arg-type]
        history=[Segment(first, consumed)],
        **options,
    )
    seen = Counter(before.consumed_samples(consumed).tolist()) + Counter(after.samples.tolist())
    assert seen == Counter(np.flatnonzero(batching.eligible(durations)).tolist())


def test_batch_order_is_shuffled_within_windows_and_per_epoch() -> None:
    durations = np.random.default_rng(0).uniform(1, 20, 2000)
    shard_ids = np.zeros(2000, dtype=np.uint32)  # one window: the whole epoch
    edges = bucket_edges(durations, Batching(batch_size=8, num_buckets=4))

    def bucket_sequence(epoch: int) -> list[int]:
        plan = plan_epoch(
            shard_ids,
            durations,
            1,
            seed=3,
            epoch=epoch,
            world_size=1,
            batching=Batching(batch_size=8, num_buckets=4),
        )
        return bucket_of(durations[plan.samples[plan.offsets[:-1]]], edges).tolist()

    first = bucket_sequence(0)
    assert first != sorted(first), "batches still come bucket after bucket"
    assert first == bucket_sequence(0) and first != bucket_sequence(1)
    assert Counter(first) == Counter(bucket_sequence(1))


def test_bucketing_cuts_padding_on_librispeech_like_durations() -> None:
    durations = duration_sample(20_000, seed=1)
    shard_ids = (np.arange(20_000) // 500).astype(np.uint32)
    reports = {
        buckets: plan_epoch(
            shard_ids,
            durations,
            40,
            seed=0,
            epoch=0,
            world_size=4,
            batching=Batching(max_duration=300.0, num_buckets=buckets),
        ).report
        for buckets in (None, 20)
    }
    assert reports[None]["padding_ratio"] > 0.25
    assert reports[20]["padding_ratio"] < 0.35 * reports[None]["padding_ratio"]
    assert json.loads(json.dumps(reports[20])) == reports[20]


@pytest.mark.parametrize(
    "durations",
    [
        np.random.default_rng(0).lognormal(2.5, 0.3, 50_000),
        np.random.default_rng(1).uniform(1, 5, 50_000),
        np.random.default_rng(2).exponential(3.0, 50_000) + 0.2,
    ],
)
def test_estimated_buckets_hold_equal_total_duration(durations: np.ndarray) -> None:
    edges = equal_duration_bins(durations, 8)
    assert len(edges) == 7 and np.all(np.diff(edges) > 0)
    shares = np.bincount(bucket_of(durations, edges), weights=durations) / durations.sum()
    assert np.abs(shares - 1 / 8).max() < 0.02


def test_quadratic_cost_makes_long_batches_smaller() -> None:
    durations = np.full(400, 20.0)
    plain = plan_epoch(
        np.zeros(400, np.uint32),
        durations,
        1,
        seed=0,
        epoch=0,
        world_size=1,
        batching=Batching(max_duration=200.0),
    )
    quadratic = plan_epoch(
        np.zeros(400, np.uint32),
        durations,
        1,
        seed=0,
        epoch=0,
        world_size=1,
        batching=Batching(max_duration=200.0, quadratic_duration=20.0),
    )
    assert set(np.diff(plain.offsets).tolist()) == {10}  # 10 x 20 s
    assert set(np.diff(quadratic.offsets).tolist()) == {5}  # 5 x (20 + 400/20) s


def test_padding_ratio_counts_padding_only() -> None:
    assert padding_ratio(np.array([1.0, 1.0, 2.0, 4.0]), np.array([0, 2, 4])) == pytest.approx(1 - 8 / 10)
    assert padding_ratio(np.zeros(0), np.zeros(1, np.int64)) == 0.0


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(num_buckets=0), "num_buckets"),
        (dict(num_buckets=3, duration_bins=(1.0,)), "not both"),
        (dict(duration_bins=(2.0, 1.0)), "duration_bins"),
        (dict(duration_bins=(-1.0,)), "duration_bins"),
        (dict(quadratic_duration=10.0, batch_size=4), "max_duration"),
        (dict(quadratic_duration=0.0, max_duration=10.0), "quadratic_duration"),
        (dict(min_duration=-1.0), "min_duration"),
        (dict(min_duration=5.0, max_sample_duration=2.0), "max_sample_duration"),
    ],
)
def test_bad_bucketing_options_are_option_errors(options: dict[str, object], words: str) -> None:
    with pytest.raises(OptionError, match=words):
        Batching(**options)  # type: ignore[arg-type]


def test_options_survive_the_json_round_trip_of_a_state() -> None:
    options = options_of(
        Batching(
            max_duration=60.0,
            duration_bins=[2, 5.5],
            quadratic_duration=30.0,
            min_duration=0.5,
            max_sample_duration=30.0,
        ),
        Ordering(),
    )
    assert json.loads(json.dumps(options)) == options
    assert options["duration_bins"] == [2.0, 5.5] and options["min_duration"] == 0.5
