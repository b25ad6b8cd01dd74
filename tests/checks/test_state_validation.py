"""A loader state is a contract: every malformed field is a StateError naming it (issue 12, defect 4).

Exact types and ranges: no lenient coercion (``0.9``, ``"1"``, ``True`` are not epochs), history segments
``[world_size >= 1, consumed >= 0]`` that fit the epoch's plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio import ShardDataset, StateError
from shardio.state import LoaderState

INT_FIELDS = ("epoch", "seed", "world_size", "start", "yielded", "worker", "num_workers")
NOT_INTS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.integers().map(str),
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sample_shards import make_uneven_dataset

    directory = tmp_path_factory.mktemp("states") / "data"
    make_uneven_dataset(directory, (4, 6, 2), seed=2)
    return str(directory)


@pytest.fixture(scope="module")
def valid(data: str) -> dict[str, Any]:
    ds = ShardDataset(data, batch_size=2, seed=1)
    return json.loads(json.dumps(ds.state_after({"epoch": 0, "batch_index": 1})))


def refused(data: str, state: dict[str, Any], field: str) -> None:
    with pytest.raises(StateError, match=rf"field {field}(?![\w\[])"):
        ShardDataset(data, batch_size=2, seed=1).load_state_dict(state)


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(INT_FIELDS), value=NOT_INTS)
def test_an_integer_field_of_another_type_is_refused(
    data: str, valid: dict[str, Any], field: str, value: Any
) -> None:
    refused(data, {**valid, field: value}, field)


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from(INT_FIELDS), value=st.integers(max_value=-1))
def test_a_negative_field_is_refused(data: str, valid: dict[str, Any], field: str, value: int) -> None:
    refused(data, {**valid, field: value}, field)


@pytest.mark.parametrize(
    "field,value",
    [
        ("epoch", 0.9),
        ("epoch", "1"),
        ("epoch", True),
        ("start", "3"),
        ("world_size", 0),
        ("num_workers", 0),
        ("worker", 1),
        ("index", 5),
        ("options", [1]),
        ("extra", "x"),
        ("history", "[]"),
        ("history", None),
    ],
)
def test_the_reported_coercions_are_refused(data: str, valid: dict[str, Any], field: str, value: Any) -> None:
    refused(data, {**valid, field: value}, field)


@pytest.mark.parametrize(
    "segment",
    [
        [0, 5],
        [-2, 5],
        [2, -5],
        [2],
        [2, 1, 1],
        [4, 1, 3],
        [2, 1, 4],
        [2, 1, 2, 1],
        [True, 1],
        [2, 1.0],
        "ab",
        None,
    ],
)
def test_a_malformed_history_segment_is_refused(data: str, valid: dict[str, Any], segment: Any) -> None:
    refused(data, {**valid, "history": [[1, 1], segment]}, r"history\[1\]")


@pytest.mark.parametrize("consumed", [10**9, 7])
def test_a_history_segment_beyond_its_plan_is_refused(
    data: str, valid: dict[str, Any], consumed: int
) -> None:
    refused(data, {**valid, "history": [[2, consumed]]}, "history")


def test_a_missing_field_is_named(data: str, valid: dict[str, Any]) -> None:
    for field in ("epoch", "history", "options", "num_workers"):
        refused(data, {k: v for k, v in valid.items() if k != field}, field)


def test_a_position_beyond_the_epoch_is_refused(data: str, valid: dict[str, Any]) -> None:
    refused(data, {**valid, "start": 10**6}, "start")


def test_a_valid_state_round_trips(valid: dict[str, Any], tmp_path: Path) -> None:
    assert LoaderState.from_dict(valid).to_dict() == valid
    for version in (True, 1.0, "1", 2):
        with pytest.raises(StateError, match="version"):
            LoaderState.from_dict({**valid, "version": version})


@pytest.mark.parametrize("value", [0, -1, 3, True, 2.0, "2", None, 2**70])
def test_a_malformed_nodes_field_is_refused(data: str, valid: dict[str, Any], value: Any) -> None:
    # world_size 4: 3 nodes do not divide it, and the rest are no node counts
    refused(data, {**valid, "world_size": 4, "nodes": value}, "nodes")


def test_nodes_without_node_stable_are_refused(data: str, valid: dict[str, Any]) -> None:
    with pytest.raises(StateError, match="node_stable"):
        ShardDataset(data, batch_size=2, seed=1).load_state_dict({**valid, "world_size": 4, "nodes": 2})
    with pytest.raises(StateError, match="node_stable"):
        state = {**valid, "history": [[4, 1, 2]]}
        ShardDataset(data, batch_size=2, seed=1).load_state_dict(state)
