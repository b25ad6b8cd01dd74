"""The planner's batch count without planning (``Planner.batch_count``): where it answers, every plan of any
epoch has exactly that many batches per rank; where only the plan tells, it answers ``None``. A resume checks
a state's position against it, so a wrong count would refuse a valid state or accept one beyond its epoch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_shards import memory_index

from shardio.planning.options import Batching, Ordering
from shardio.planning.plan import Segment
from shardio.planning.planner import Planner
from shardio.planning.surgery import Quarantine, Surgery


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    seed=st.integers(0, 100),
    batch_size=st.one_of(st.none(), st.integers(1, 12)),
    world_size=st.integers(1, 9),
    steps=st.booleans(),
    remainder=st.sampled_from(["pad", "drop"]),
    shuffle=st.booleans(),
    shuffle_shards=st.integers(1, 4),
    epoch=st.integers(0, 5),
)
def test_the_counted_batches_are_every_plans(
    sizes: list[int],
    seed: int,
    batch_size: int | None,
    world_size: int,
    steps: bool,
    remainder: str,
    shuffle: bool,
    shuffle_shards: int,
    epoch: int,
) -> None:
    planner = Planner(
        memory_index(sizes, seed),
        seed,
        Batching(batch_size=batch_size, remainder=remainder, step_batches=world_size * 2 if steps else None),
        Ordering(shuffle=shuffle, shuffle_shards=shuffle_shards),
    )
    counted = planner.batch_count(world_size)
    assert counted is not None
    assert counted == planner.plan(epoch, world_size).num_batches


@pytest.mark.parametrize(
    "batching",
    [
        Batching(max_duration=4.0),
        Batching(batch_size=3, num_buckets=2),
        Batching(batch_size=3, sync_buckets=True),
        Batching(batch_size=3, min_duration=0.5),
        Batching(batch_size=3, max_sample_duration=2.0),
    ],
)
def test_options_that_shape_the_count_leave_it_to_the_plan(batching: Batching) -> None:
    assert Planner(memory_index([7, 9], 1), 1, batching, Ordering()).batch_count(2) is None


def test_a_history_or_a_quarantine_leaves_the_count_to_the_plan() -> None:
    planner = Planner(memory_index([7, 9], 1), 1, Batching(batch_size=3), Ordering())
    assert planner.batch_count(2, (Segment(3, 1),)) is None
    quarantined = Surgery(quarantines=(Quarantine(epoch=0, segment=0, ids=(2,)),))
    assert planner.batch_count(2, (), quarantined) is None
