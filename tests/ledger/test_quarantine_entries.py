"""A state's quarantine entries are checked against the dataset when it loads (issue 41): an entry's ids are
what the planner leaves out and its keys what the report names, so ids that are not the samples of their keys
(a hand-edited entry) are refused; a malformed field is a StateError that says what is wrong with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_state_validation import data, valid  # noqa: F401  (fixtures: a small dataset, a valid state of it)

from shardio import ShardDataset, StateError, quarantine, quarantine_report
from shardio.cli import main


def dataset(data: str) -> ShardDataset:
    return ShardDataset(data, batch_size=2, seed=1)


@pytest.fixture(scope="module")
def keys(data: str) -> list[str]:
    return list(dataset(data).index.keys)


def with_entry(valid: dict[str, Any], names: list[str], **fields: Any) -> dict[str, Any]:
    """``valid`` moved to the start of epoch 1, with a quarantine entry (sample 3, carried) and ``fields``."""
    entry = {
        "epoch": 0,
        "segment": 0,
        "ids": [3],
        "keys": [names[3]],
        "steps": None,
        "carry": True,
        "consumed": [],
        **fields,
    }
    return {**valid, "epoch": 1, "start": 0, "extra": {"quarantine": [entry]}}


def test_an_entry_whose_ids_and_keys_disagree_is_refused(
    data: str, valid: dict[str, Any], keys: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = with_entry(valid, keys, keys=[keys[5]])  # leaves out sample 3, reports sample 5
    assert quarantine_report(edited)[0]["key"] == keys[5]
    with pytest.raises(
        StateError,
        match=r"quarantine entry 0: id 3 is the dataset's sample .* key 0 is "
        r".*: its ids and keys must name the same samples",
    ):
        dataset(data).load_state_dict(edited)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(edited))
    for command in (
        ["trace", data, "--state", str(path), "--step", "0"],
        ["quarantine", data, "--state", str(path), "--key", keys[1], "--out", str(path)],
    ):
        capsys.readouterr()
        assert main(command) == 2  # accepted before: trace answered, quarantine carried the wrong sample on
        assert "ids and keys must name the same samples" in capsys.readouterr().err
    dataset(data).load_state_dict(with_entry(valid, keys))  # the same entry, its key its id's: loads


def test_a_carried_entry_leaves_out_the_sample_the_report_names(
    data: str, valid: dict[str, Any], keys: list[str]
) -> None:
    ds = dataset(data)
    healed = quarantine(valid, ds, keys=[keys[4]], carry=True)
    later = {**healed, "epoch": 1, "start": 0, "history": []}
    loaded = dataset(data)
    loaded.load_state_dict(later)
    seen = [key for batch in loaded for key in batch["keys"]]
    assert [row["key"] for row in quarantine_report(later)] == [keys[4]]
    assert keys[4] not in seen and sorted(seen) == sorted(set(keys) - {keys[4]})


@pytest.mark.parametrize(
    "fields,problem",
    [
        ({"carry": "yes"}, "'carry' must be true or false, not 'yes'"),
        ({"carry": 1}, "'carry' must be true or false, not 1"),
        ({"epoch": -1}, "'epoch' must be an integer >= 0, not -1"),
        ({"epoch": True}, "'epoch' must be an integer >= 0, not True"),
        ({"segment": "0"}, "'segment' must be an integer >= 0, not '0'"),
        ({"ids": [3.0]}, "'ids' must be a list of integers"),
        ({"ids": [10**6], "keys": ["x"]}, "id 1000000 is outside the dataset's 12 samples"),
        ({"keys": []}, "'keys' must be a list of 1 strings, one per id"),
        ({"corpora": ["a", "b"]}, "'corpora' must be a list of 1 corpus names"),
        ({"consumed": "3"}, "'consumed' must be a list of ids"),
    ],
)
def test_a_malformed_entry_says_what_is_wrong(
    data: str, valid: dict[str, Any], keys: list[str], fields: dict[str, Any], problem: str
) -> None:
    state = with_entry(valid, keys, **fields)
    with pytest.raises(StateError) as caught:
        dataset(data).load_state_dict(state)
    assert f"quarantine entry 0: {problem}" in str(caught.value), str(caught.value)
    assert "a negative field or an id outside" not in str(caught.value)
    if "outside" not in problem:  # the report has no dataset to hold ids against
        with pytest.raises(StateError, match="quarantine entry 0: "):
            quarantine_report(state)


def test_an_entry_that_is_not_an_object_is_named(data: str, valid: dict[str, Any]) -> None:
    state = {**valid, "extra": {"quarantine": [["ids", 3]]}}
    with pytest.raises(StateError, match="quarantine entry 0 must be an object, not list"):
        dataset(data).load_state_dict(state)
