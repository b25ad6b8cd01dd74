"""The public planner's arguments (:class:`~shardio.Planner`, :func:`~shardio.plan_epoch`, the mix planner)
are checked at its boundary: a hostile seed, epoch, world size, rank, history or sample id is an OptionError
naming the argument and the value, before anything is planned or allocated; never another rank's share, a
negative count, an 8 TiB allocation or a raw TypeError from numpy. The same arguments within bounds plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_shards import memory_index

from shardio import Batching, EpochSize, OptionError, Planner, Segment, plan_epoch
from shardio.checks.states import MAX_COUNT, MAX_HISTORY, MAX_WORLD_SIZE
from shardio.planning.mix import plan_mix
from shardio.planning.mixoptions import Mix
from shardio.planning.plan import Ordering

INDEX = memory_index([5, 9, 4], seed=1)
PLANNER = Planner(INDEX, 0, Batching(batch_size=4), Ordering())
PLAN = PLANNER.plan(0, 3)

hostile = st.one_of(
    st.integers(-(2**80), 2**80),
    st.sampled_from([-1, 0, 1, 2**17, 2**17 + 1, 2**40, 2**62 - 1, 2**62, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.uint64, st.integers(0, 2**64 - 1)),
    st.just([1, 2]),
)


def integral(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def refused(name: str, call: Any) -> None:
    with pytest.raises(OptionError, match=name.replace("[", r"\[").replace("]", r"\]")):
        call()


@settings(max_examples=100, deadline=None)
@given(seed=hostile, epoch=hostile, world=hostile)
def test_hostile_seeds_epochs_and_worlds_are_option_errors_naming_them(
    seed: Any, epoch: Any, world: Any
) -> None:
    good = {
        "seed": integral(seed) and seed >= 0,
        "epoch": integral(epoch) and 0 <= epoch <= MAX_COUNT,
        "world_size": integral(world) and 1 <= world <= MAX_WORLD_SIZE,
    }
    args = {"seed": seed, "epoch": epoch, "world_size": world}
    first_bad = next((name for name, ok in good.items() if not ok), None)
    if first_bad is None:
        world = int(world)
        if world > 64:  # a real plan of 18 samples for that many ranks: its share for one rank suffices
            args["world_size"] = 64
        plan = plan_epoch(INDEX.shard_ids, INDEX.durations, 3, batching=Batching(batch_size=4), **args)
        assert plan.world_size == args["world_size"]
        return
    refused(first_bad, lambda: plan_epoch(INDEX.shard_ids, INDEX.durations, 3, **args))
    if not good["seed"]:
        refused("seed", lambda: Planner(INDEX, seed, Batching(batch_size=4), Ordering()))
    if not good["world_size"]:
        refused("world_size", lambda: PLANNER.plan(0, world))
        refused("world_size", lambda: PLANNER.batch_count(world))
    elif not good["epoch"]:
        refused("epoch", lambda: PLANNER.plan(epoch, 2))
    corpora = {"a": (INDEX.shard_ids, INDEX.durations, 3)}
    mix = Mix({"a": 1.0}, EpochSize(primary="a"))
    refused(first_bad, lambda: plan_mix(corpora, mix, batching=Batching(batch_size=4), **args))


@settings(max_examples=80, deadline=None)
@given(rank=hostile, sample=hostile)
def test_hostile_ranks_and_sample_ids_are_option_errors(rank: Any, sample: Any) -> None:
    if integral(rank) and 0 <= rank < PLAN.world_size:
        assert np.array_equal(Planner.share(PLAN, rank).batch(0), PLAN.batch(int(rank), 0))
    else:
        refused("rank", lambda: Planner.share(PLAN, rank))  # never the share of rank (rank % world)
    if integral(sample) and 0 <= sample < len(INDEX):
        assert PLANNER.corpus(sample) is None
    else:
        refused("sample_id", lambda: PLANNER.corpus(sample))


@settings(max_examples=80, deadline=None)
@given(
    history=st.one_of(
        st.lists(st.builds(Segment, hostile, hostile), max_size=3),
        st.lists(st.builds(Segment, st.integers(1, 4), st.integers(0, 3)), min_size=MAX_HISTORY + 1),
        st.sampled_from(["ab", b"ab", 5, None, [(2, 1)], [None]]),
    )
)
def test_hostile_histories_are_option_errors(history: Any) -> None:
    def ok(segment: Any) -> bool:
        return (
            integral(segment.world_size)
            and 1 <= segment.world_size <= MAX_WORLD_SIZE
            and integral(segment.consumed)
            and 0 <= segment.consumed <= MAX_COUNT
        )

    fits = isinstance(history, list) and len(history) <= MAX_HISTORY
    fits = fits and all(isinstance(s, Segment) and ok(s) for s in history)
    if not fits:
        refused("history", lambda: PLANNER.plan(0, 2, history))
        refused("history", lambda: PLANNER.batch_count(2, history))
        refused(
            "history",
            lambda: plan_epoch(
                INDEX.shard_ids, INDEX.durations, 3, seed=0, epoch=0, world_size=2, history=history
            ),
        )
        return
    try:  # within bounds: planned, or refused as a history beyond the plan (never a raw error)
        PLANNER.plan(0, 2, [Segment(min(int(s.world_size), 8), int(s.consumed)) for s in history])
    except OptionError as exc:
        assert "consumed" in str(exc)


def test_the_issues_cases() -> None:
    """share(plan, -1) was rank 2's share, batch_count(-1) was negative, world 2**40 allocated 8 TiB."""
    refused("rank", lambda: Planner.share(PLAN, -1))
    refused("world_size", lambda: PLANNER.batch_count(-1))
    refused("world_size", lambda: PLANNER.plan(0, 2**40))
    refused("seed", lambda: plan_epoch(INDEX.shard_ids, INDEX.durations, 3, seed="1", epoch=0, world_size=1))
    refused("epoch", lambda: PLANNER.plan(None, 1))
