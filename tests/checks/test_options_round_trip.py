"""Every option set a dataset accepts saves states that load: ``state_dict()`` -> JSON -> ``load_state_dict``
in a dataset made with the same options. Numbers of every kind a user may hold (numpy floats and integers,
``Fraction``, integers near and beyond int64) are normalised to what a state records (float, int) or refused
when the options are made, never at the first ``state_dict`` ("not JSON serializable") nor when the state
loads (an integer beyond int64)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import Batching, EpochSize, Index, MixedDataset, OptionError, Ordering, ShardDataset, World
from shardio.planning.mixoptions import Mix


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Index:
    root = tmp_path_factory.mktemp("options") / "data"
    make_uneven_dataset(root, [5, 7, 3], seed=1, duration_range=(0.5, 2.0))
    return Index.load(str(root))


def numbers(low: float, high: float) -> st.SearchStrategy[Any]:
    """The same kind of value as every number type a user may hold."""
    return st.floats(low, high).flatmap(
        lambda x: st.sampled_from(
            [x, np.float64(x), np.float32(x), np.float16(x), Fraction(x).limit_denominator(1000), int(x)]
        )
    )


def integers(low: int) -> st.SearchStrategy[Any]:
    edges = [2**31, 2**62, 2**63 - 1, 2**63, 2**64, 2**100]
    return st.one_of(
        st.integers(low, 12).flatmap(lambda n: st.sampled_from([n, np.int64(n), np.uint16(n), np.int32(n)])),
        st.sampled_from(edges + [np.uint64(2**63), np.uint64(2**64 - 1), np.int64(2**63 - 1)]),
    )


options = st.fixed_dictionaries(
    {
        "size": st.one_of(
            st.fixed_dictionaries({"batch_size": integers(1)}),
            st.fixed_dictionaries(
                {"max_duration": numbers(2.5, 30.0), "max_batch_size": st.one_of(st.none(), integers(1))}
            ),
        ),
        "extra": st.fixed_dictionaries(
            {},
            optional={
                "min_duration": numbers(0.0, 0.6),
                "max_sample_duration": numbers(1.9, 5.0),
                "num_buckets": integers(1),
                "duration_bins": st.lists(numbers(0.6, 1.9), min_size=1, max_size=3),
            },
        ),
        "shuffle_shards": integers(1),
        "seed": integers(0),
        "node_stable": st.booleans(),
        "world": st.sampled_from([(1, 1), (3, 1), (4, 2)]),  # (ranks, ranks per node)
    }
)


def made(case: dict[str, Any]) -> tuple[Batching, Ordering] | None:
    extra = dict(case["extra"])
    if "num_buckets" in extra and "duration_bins" in extra:
        del extra["duration_bins"]
    if "quadratic_duration" in extra and "max_duration" not in case["size"]:
        del extra["quadratic_duration"]
    try:
        ordering = Ordering(shuffle_shards=case["shuffle_shards"], node_stable=case["node_stable"])
        return Batching(**case["size"], **extra), ordering
    except OptionError:
        return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=options)
def test_every_accepted_option_set_round_trips_through_json(index: Index, case: dict[str, Any]) -> None:
    groups = made(case)
    if groups is None:
        return
    batching, ordering = groups
    world = World(case["world"][0] - 1, case["world"][0], ranks_per_node=case["world"][1])
    try:
        dataset = ShardDataset(index, batching=batching, ordering=ordering, seed=case["seed"], world=world)
    except OptionError:
        return  # e.g. no sample within the duration filters
    state = json.loads(json.dumps(dataset.state_dict()))
    again = ShardDataset(index, batching=batching, ordering=ordering, seed=case["seed"], world=world)
    again.load_state_dict(state)
    assert again.state_dict() == state


@pytest.mark.parametrize(
    "make",
    [
        lambda: Batching(max_duration=np.float32(8.0)),
        lambda: Batching(max_duration=np.float16(8.0), min_duration=np.float32(0.1)),
        lambda: Batching(max_duration=Fraction(17, 2), quadratic_duration=np.float64(30)),
        lambda: Batching(max_duration=8.0, max_sample_duration=Fraction(5, 2)),
        lambda: Batching(batch_size=np.int64(4)),
    ],
)
def test_the_issues_numbers_are_plain_floats_and_ints(index: Index, make: Any) -> None:
    batching = make()
    for name in ("max_duration", "min_duration", "max_sample_duration", "quadratic_duration"):
        value = getattr(batching, name)
        assert value is None or type(value) is float
    dataset = ShardDataset(index, batching=batching)
    ShardDataset(index, batching=batching).load_state_dict(json.loads(json.dumps(dataset.state_dict())))


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: Batching(batch_size=2**63), "batch_size"),
        (lambda: Batching(max_duration=9.0, max_batch_size=2**64), "max_batch_size"),
        (lambda: Ordering(shuffle_shards=np.uint64(2**63)), "shuffle_shards"),
        (lambda: EpochSize(batches=2**63), "batches"),
        (lambda: Mix({1: 1.0}, EpochSize(hours=1.0)), "names"),
    ],
)
def test_integers_a_state_cannot_hold_are_refused_when_made(make: Any, name: str) -> None:
    with pytest.raises(OptionError, match=name):
        make()


def test_a_mix_of_numpy_numbers_round_trips(index: Index, tmp_path: Path) -> None:
    mix = MixedDataset(
        {"a": index, "b": index},
        {"a": np.float32(0.7), "b": Fraction(3, 10)},
        EpochSize(hours=np.float32(0.01)),
        batch_size=np.int64(3),
    )
    state = json.loads(json.dumps(mix.state_dict()))
    MixedDataset(
        {"a": index, "b": index},
        {"a": np.float32(0.7), "b": Fraction(3, 10)},
        EpochSize(hours=np.float32(0.01)),
        batch_size=np.int64(3),
    ).load_state_dict(state)
