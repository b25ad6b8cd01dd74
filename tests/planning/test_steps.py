"""Steps (``Batching.step_batches``): an epoch is a sequence of optimizer steps that is the same on every
number of ranks dividing ``K``; only the split of a step over ranks and accumulation depends on the world;
a resume on another world at a step boundary continues the same steps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio import OptionError
from shardio.planning.bucketing import bucket_edges, bucket_of
from shardio.planning.mix import CorpusColumns, plan_mix
from shardio.planning.mixoptions import EpochSize, Mix
from shardio.planning.plan import Batching, EpochPlan, Ordering, Segment, options_of, plan_epoch
from shardio.planning.rankplan import rank_plan
from shardio.planning.steps import snake

Corpus = tuple[np.ndarray, np.ndarray, int]
WORLDS = (1, 2, 4, 8)


@st.composite
def corpora(draw: st.DrawFn) -> Corpus:
    n = draw(st.integers(1, 600))
    num_shards = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    durations = np.round(rng.gamma(2.0, draw(st.sampled_from([1.0, 4.0])), n) + 0.2, 3)
    return np.sort(rng.integers(0, num_shards, n)).astype(np.uint32), durations, num_shards


@st.composite
def batchings(draw: st.DrawFn) -> Batching:
    fixed = draw(st.booleans())
    buckets = draw(st.one_of(st.none(), st.integers(1, 8)))
    return Batching(
        batch_size=draw(st.integers(1, 7)) if fixed else None,
        max_duration=None if fixed else draw(st.sampled_from([40.0, 90.0])),
        remainder=draw(st.sampled_from(["pad", "drop"])),
        num_buckets=buckets,
        sync_buckets=draw(st.sampled_from([None, False] if buckets else [None, True])),
        max_sample_duration=draw(st.sampled_from([None, 12.0])),
        step_batches=8,
    )


def plan_of(corpus: Corpus, world_size: int, batching: Batching, **options: Any) -> EpochPlan:
    shard_ids, durations, num_shards = corpus
    return plan_epoch(
        shard_ids,
        durations,
        num_shards,
        seed=options.pop("seed", 3),
        epoch=options.pop("epoch", 1),
        world_size=world_size,
        batching=batching,
        ordering=Ordering(shuffle_shards=2),
        **options,
    )


def steps_of(plan: EpochPlan) -> list[list[tuple[int, ...]]]:
    """Each step's batches (sorted sample ids each), sorted: what the step trains on, whoever holds it."""
    a = plan.accumulation
    return [
        sorted(
            tuple(sorted(plan.batch(r, s * a + j).tolist())) for r in range(plan.world_size) for j in range(a)
        )
        for s in range(plan.num_batches // a)
    ]


@settings(max_examples=40, deadline=None)
@given(corpus=corpora(), batching=batchings())
def test_the_steps_are_the_same_on_every_world(corpus: Corpus, batching: Batching) -> None:
    plans = {w: plan_of(corpus, w, batching) for w in WORLDS}
    reference = steps_of(plans[1])
    for w, plan in plans.items():
        assert plan.accumulation == 8 // w
        assert plan.num_batches % plan.accumulation == 0  # a whole number of steps, every rank alike
        assert plan.rank_batches.shape == (w, len(reference) * 8 // w)
        assert steps_of(plan) == reference, w
    # exactly once: every eligible sample in one batch, padding only repeats whole batches
    plan = plans[2]
    eligible = np.flatnonzero(batching.eligible(corpus[1]))
    played = np.unique(plan.samples[plan.offsets[0] : plan.offsets[-1]])
    dropped_or_played = np.unique(plan.samples)
    assert np.array_equal(dropped_or_played, eligible)
    assert played.shape[0] == plan.samples.shape[0]  # every sample in one batch
    # limits respected
    for b in range(plan.offsets.shape[0] - 1):
        batch = corpus[1][plan.samples[plan.offsets[b] : plan.offsets[b + 1]]]
        if batching.batch_size is not None:
            assert batch.shape[0] <= batching.batch_size
        else:
            assert batch.shape[0] * batch.max() <= batching.max_duration * (1 + 1e-9)  # type: ignore[operator]


@settings(max_examples=30, deadline=None)
@given(corpus=corpora(), batching=batchings(), data=st.data())
def test_a_resume_on_another_world_continues_the_same_steps(
    corpus: Corpus, batching: Batching, data: st.DataObject
) -> None:
    straight = steps_of(plan_of(corpus, 2, batching))
    before, after = data.draw(st.sampled_from(WORLDS)), data.draw(st.sampled_from(WORLDS))
    step = data.draw(st.integers(0, len(straight)))
    history = (Segment(before, step * 8 // before),)
    resumed = plan_of(corpus, after, batching, history=history)
    assert steps_of(resumed) == straight[step:]
    # and again on a third world
    later = data.draw(st.integers(0, len(straight) - step))
    history = (*history, Segment(after, later * 8 // after))
    assert steps_of(plan_of(corpus, 4, batching, history=history)) == straight[step + later :]


def test_the_repeat_flags_of_a_resumed_segment_are_the_straight_runs() -> None:
    corpus = (np.zeros(100, dtype=np.uint32), np.full(100, 1.0), 1)
    batching = Batching(batch_size=6, step_batches=8)  # 17 batches: the third step pads 7
    straight = plan_of(corpus, 2, batching)

    def flags(plan: EpochPlan, first: int) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for s in range(plan.num_batches // plan.accumulation):
            step = []
            for r in range(plan.world_size):
                share = rank_plan(plan, r)
                for j in range(plan.accumulation):
                    at = s * plan.accumulation + j
                    step += [(i, f) for i, f in zip(share.batch(at).tolist(), share.repeat_flags(at))]
            out.append(tuple(sorted(step)))
        return out[first:]

    resumed = plan_of(corpus, 4, batching, history=(Segment(2, 4),))
    assert flags(resumed, 0) == flags(straight, 1)


def test_a_resume_inside_a_step_on_another_world_is_refused_naming_the_step() -> None:
    corpus = (np.zeros(300, dtype=np.uint32), np.full(300, 1.0), 1)
    batching = Batching(batch_size=4, step_batches=8)
    with pytest.raises(OptionError, match=r"micro-batch 1 of optimizer step 2 .*step_batches=8"):
        plan_of(corpus, 4, batching, history=(Segment(2, 9),))


@pytest.mark.parametrize("world_size", [3, 5, 16])
def test_a_world_that_does_not_divide_step_batches_is_refused_naming_both(world_size: int) -> None:
    corpus = (np.zeros(30, dtype=np.uint32), np.full(30, 1.0), 1)
    with pytest.raises(OptionError, match=rf"step_batches=8 .* {world_size} ranks"):
        plan_of(corpus, world_size, Batching(batch_size=2, step_batches=8))
    with pytest.raises(OptionError, match=rf"step_batches=8 .* {world_size} ranks"):
        Batching(step_batches=8).accumulation(world_size)


def test_steps_of_a_bucketed_synchronised_plan_are_of_one_bucket() -> None:
    rng = np.random.default_rng(5)
    corpus = (np.repeat(np.arange(20, dtype=np.uint32), 500), rng.gamma(2.0, 4.0, 10_000) + 0.5, 20)
    batching = Batching(max_duration=200.0, num_buckets=8, step_batches=8)
    plan = plan_of(corpus, 2, batching)
    bucket = bucket_of(corpus[1], bucket_edges(corpus[1], batching))
    mixed = 0
    for s in range(plan.num_batches // plan.accumulation):
        ids = np.concatenate(
            [plan.batch(r, s * plan.accumulation + j) for r in range(2) for j in range(plan.accumulation)]
        )
        mixed += np.unique(bucket[ids]).shape[0] > 1
    assert mixed <= 8  # only the pooled leftover steps, at most one per bucket, span neighbouring buckets
    assert plan.report["step_efficiency"] >= 0.98


def test_on_k_ranks_the_plan_is_the_one_without_steps() -> None:
    rng = np.random.default_rng(1)
    corpus = (np.repeat(np.arange(10, dtype=np.uint32), 300), rng.gamma(2.0, 4.0, 3000) + 0.5, 10)
    batching = Batching(max_duration=120.0, num_buckets=4)
    before = plan_of(corpus, 8, batching)
    after = plan_of(corpus, 8, replace(batching, step_batches=8))
    assert np.array_equal(before.samples, after.samples)
    assert np.array_equal(before.rank_batches, after.rank_batches)
    assert before.report["step_efficiency"] == after.report["step_efficiency"]


def test_step_batches_is_recorded_only_when_set() -> None:
    assert "step_batches" not in options_of(Batching(batch_size=2), Ordering())
    assert options_of(Batching(batch_size=2, step_batches=4), Ordering())["step_batches"] == 4
    with pytest.raises(OptionError, match="step_batches"):
        Batching(step_batches=0)


def test_the_snake_gives_each_rank_a_balanced_group() -> None:
    assert snake(8, 2).tolist() == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert snake(8, 8).tolist() == [[i] for i in range(8)]
    assert snake(8, 1).tolist() == [list(range(8))]


@pytest.mark.parametrize("sync", [None, False])
def test_a_mix_has_the_same_steps_on_every_world(sync: bool | None) -> None:
    rng = np.random.default_rng(2)
    corpora = {
        "a": CorpusColumns(np.repeat(np.arange(6, dtype=np.uint32), 200), rng.gamma(2.0, 3.0, 1200) + 0.3, 6),
        "b": CorpusColumns(np.repeat(np.arange(3, dtype=np.uint32), 200), rng.gamma(2.0, 5.0, 600) + 0.3, 3),
    }
    mix = Mix(weights={"a": 0.7, "b": 0.3}, epoch_size=EpochSize(primary="a"))
    batching = Batching(max_duration=60.0, num_buckets=4, sync_buckets=sync, step_batches=8)

    def plan(world_size: int, history: tuple[Segment, ...] = ()) -> EpochPlan:
        return plan_mix(
            corpora, mix, seed=4, epoch=1, world_size=world_size, batching=batching, history=history
        )

    reference = steps_of(plan(1))
    for w in WORLDS:
        assert steps_of(plan(w)) == reference
    assert steps_of(plan(1, (Segment(4, 6),))) == reference[3:]


@settings(max_examples=20, deadline=None)
@given(corpus=corpora(), batching=batchings(), data=st.data())
def test_a_quarantine_replans_the_rest_as_the_same_steps_on_every_world(
    corpus: Corpus, batching: Batching, data: st.DataObject
) -> None:
    straight = steps_of(plan_of(corpus, 1, batching))
    step = data.draw(st.integers(0, len(straight)))
    gone = np.asarray(data.draw(st.lists(st.integers(0, corpus[1].shape[0] - 1), max_size=5)), dtype=np.int64)
    found = []
    for before in WORLDS:
        for after in (1, 4):
            history = (Segment(before, step * 8 // before),)
            plan = plan_of(corpus, after, batching, history=history, exclude=[(1, gone)])
            found.append(steps_of(plan))
            left = {int(i) for s in found[-1] for batch in s for i in batch}
            assert not left & set(gone.tolist())
    assert all(steps == found[0] for steps in found)
