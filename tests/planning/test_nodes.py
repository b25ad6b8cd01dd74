"""Ordering(node_stable=True): properties of the node-stable plans (shardio.planning.parts, .nodes).

Every node reads the same part of the corpus every epoch (its set of samples does not change, only their
order), every sample is played exactly once per epoch across the world (padding's repeats flagged), every
rank has the same number of batches, and a changed world re-deals the parts over what is left."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.errors import OptionError
from shardio.planning.options import check_options
from shardio.planning.parts import shard_parts
from shardio.planning.plan import Batching, EpochPlan, Ordering, Segment, plan_epoch
from shardio.planning.repeats import Repeats

NODE_STABLE = Ordering(shuffle_shards=3, node_stable=True)

batchings = st.sampled_from(
    [
        Batching(batch_size=3),
        Batching(batch_size=4, remainder="drop"),
        Batching(max_duration=40.0),
        Batching(max_duration=40.0, num_buckets=3),
        Batching(max_duration=40.0, num_buckets=4, remainder="drop"),
        Batching(batch_size=2, num_buckets=2, sync_buckets=False),
        Batching(batch_size=2, sync_buckets=True),
    ]
)
worlds = st.sampled_from([(2, 2), (4, 2), (3, 3), (6, 2), (6, 3), (4, 4), (2, 1)])


def corpus(seed: int, shards: int) -> tuple[np.ndarray, np.ndarray, int]:
    generator = np.random.default_rng(seed)
    shard_ids = np.repeat(np.arange(shards, dtype=np.uint32), generator.integers(1, 40, shards))
    return shard_ids, np.round(generator.uniform(0.5, 12.0, shard_ids.shape[0]), 2), shards


def plan(
    columns: tuple[np.ndarray, np.ndarray, int],
    epoch: int,
    world: tuple[int, int],
    batching: Batching,
    history: tuple[Segment, ...] = (),
    ordering: Ordering = NODE_STABLE,
) -> EpochPlan:
    return plan_epoch(
        *columns,
        seed=5,
        epoch=epoch,
        world_size=world[0],
        batching=batching,
        ordering=ordering,
        history=history,
        nodes=world[1],
    )


def firsts(plan: EpochPlan, ranks: range, start: int = 0) -> np.ndarray:
    """The samples ``ranks`` play from batch ``start`` on that are no repeat (each once)."""
    flags = Repeats(plan)
    found = [
        plan.batch(rank, j)[~flags.flags(rank, j)] for rank in ranks for j in range(start, plan.num_batches)
    ]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def node_ranks(world: tuple[int, int], node: int) -> range:
    each = world[0] // world[1]
    return range(node * each, node * each + each)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 50), shards=st.integers(6, 24), world=worlds, batching=batchings)
def test_every_sample_once_per_epoch_and_equal_batches_per_rank(
    seed: int, shards: int, world: tuple[int, int], batching: Batching
) -> None:
    columns = corpus(seed, shards)
    samples = columns[0].shape[0]
    for epoch in (0, 1):
        epoch_plan = plan(columns, epoch, world, batching)
        assert epoch_plan.rank_batches.shape == (world[0], epoch_plan.num_batches)
        played = firsts(epoch_plan, range(world[0]))
        assert np.unique(played).shape[0] == played.shape[0]  # never twice (repeats flagged)
        everything = np.unique(epoch_plan.samples)  # planned, before the deal's padding or dropping
        assert np.array_equal(everything, np.arange(samples))
        if batching.remainder == "pad":
            assert np.array_equal(np.sort(played), np.arange(samples))  # every sample, once
        else:
            assert played.shape[0] + epoch_plan.dropped == samples


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 50), shards=st.integers(6, 24), world=worlds, batching=batchings)
def test_a_node_reads_only_its_shards_every_epoch(
    seed: int, shards: int, world: tuple[int, int], batching: Batching
) -> None:
    shard_ids, durations, count = columns = corpus(seed, shards)
    part = shard_parts(np.bincount(shard_ids, weights=durations, minlength=count), 5, world[1])
    orders = []
    for epoch in (0, 1, 3):
        epoch_plan = plan(columns, epoch, world, batching)
        for node in range(world[1]):
            ranks = node_ranks(world, node)
            read = np.concatenate(
                [epoch_plan.batch(r, j) for r in ranks for j in range(epoch_plan.num_batches)]
            )
            unflagged = firsts(epoch_plan, ranks)
            # what a node reads is its part's (a node whose part ran out may repeat another's: flagged)
            assert set(part[shard_ids[unflagged]].tolist()) <= {node}
            if read.shape[0] and batching.remainder == "pad":
                mine = np.flatnonzero(part[shard_ids] == node)
                assert set(unflagged.tolist()) == set(mine.tolist())  # the whole part, every epoch
        orders.append(epoch_plan.samples)
    if columns[0].shape[0] > 50:
        assert not np.array_equal(orders[0], orders[1])  # the same parts, in another order


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 50),
    shards=st.integers(6, 24),
    first=worlds,
    then=worlds,
    batching=batchings,
    at=st.floats(0.0, 1.0),
)
def test_another_world_plays_the_rest_exactly_once(
    seed: int,
    shards: int,
    first: tuple[int, int],
    then: tuple[int, int],
    batching: Batching,
    at: float,
) -> None:
    columns = corpus(seed, shards)
    before = plan(columns, 2, first, batching)
    consumed = int(at * before.num_batches)
    done = before.consumed_samples(consumed)
    after = plan(columns, 2, then, batching, history=(Segment(first[0], consumed, first[1]),))
    assert after.rank_batches.shape == (then[0], after.num_batches)
    rest = firsts(after, range(then[0]))
    assert np.intersect1d(rest, done).shape[0] == 0
    assert np.unique(rest).shape[0] == rest.shape[0]
    if batching.remainder == "pad":
        left = np.setdiff1d(np.arange(columns[0].shape[0]), done)
        assert np.array_equal(np.sort(rest), left)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 50), shards=st.integers(1, 24), world=st.sampled_from([(1, 1), (3, 1), (4, 1)]))
def test_one_node_is_the_global_plan(seed: int, shards: int, world: tuple[int, int]) -> None:
    columns = corpus(seed, shards)
    for batching in (Batching(batch_size=3), Batching(max_duration=40.0, num_buckets=3)):
        ours = plan(columns, 1, world, batching)
        plain = plan(columns, 1, world, batching, ordering=Ordering(shuffle_shards=3))
        assert np.array_equal(ours.samples, plain.samples)
        assert np.array_equal(ours.rank_batches, plain.rank_batches)


@settings(max_examples=60, deadline=None)
@given(
    seconds=st.lists(st.floats(0.0, 1000.0), min_size=1, max_size=60),
    nodes=st.integers(1, 8),
    seed=st.integers(0, 2**32),
)
def test_parts_hold_about_equal_audio(seconds: list[float], nodes: int, seed: int) -> None:
    values = np.array(seconds)
    if values.shape[0] < nodes:
        with pytest.raises(OptionError, match="node_stable"):
            shard_parts(values, seed, nodes)
        return
    parts = shard_parts(values, seed, nodes)
    assert np.array_equal(parts, shard_parts(values, seed, nodes))  # a function of (seed, nodes) only
    totals = np.bincount(parts, weights=values, minlength=nodes)
    assert set(parts.tolist()) == set(range(nodes))  # every node a shard
    assert totals.max() - totals.min() <= values.max() + 1e-6  # within a shard of each other


def test_synchronised_rounds_stay_one_bucket_across_nodes() -> None:
    generator = np.random.default_rng(3)
    shard_ids = np.repeat(np.arange(200, dtype=np.uint32), generator.integers(50, 200, 200))
    durations = np.clip(generator.gamma(2.0, 4.0, shard_ids.shape[0]), 0.5, 30).round(2)
    batching = Batching(max_duration=200.0, num_buckets=10)
    for world in ((8, 2), (8, 4)):
        epoch_plan = plan((shard_ids, durations, 200), 0, world, batching)
        assert epoch_plan.report["step_efficiency"] >= 0.97
        assert epoch_plan.report["nodes"] == world[1]


def test_refusals_name_the_options() -> None:
    columns = corpus(1, 8)
    with pytest.raises(OptionError, match="node_stable.*step_batches|step_batches.*node_stable"):
        plan(columns, 0, (2, 2), Batching(batch_size=2, step_batches=2))
    with pytest.raises(OptionError, match="4 ranks cannot be 3 nodes"):
        plan(columns, 0, (4, 3), Batching(batch_size=2))
    with pytest.raises(OptionError, match="node_stable"):
        plan(columns, 0, (4, 2), Batching(batch_size=2), ordering=Ordering())
    with pytest.raises(OptionError, match="12 nodes"):
        plan(corpus(1, 8), 0, (12, 12), Batching(batch_size=2))
    with pytest.raises(OptionError, match="mix"):
        check_options(Batching(batch_size=2), NODE_STABLE, mixed=True)
