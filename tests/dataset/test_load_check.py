"""load_state_dict checks a state's position against its epoch's batch count: counted by the planner where the
options allow (nothing is planned at load: the first iteration plans), else on this rank's share of the plan,
which the first iteration then plays without planning again. Either way a state past its epoch is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sample_shards import make_uneven_dataset

import shardio.planning.planner
from shardio import ShardDataset, StateError


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    make_uneven_dataset(directory, [5, 17, 2, 9], seed=3)
    return directory


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The epochs planned (each whole-epoch planning of a dataset that is not a mix), in order."""
    planned: list[int] = []
    original = shardio.planning.planner.plan_epoch

    def counting(*args: Any, **kwargs: Any) -> Any:
        planned.append(kwargs["epoch"])
        return original(*args, **kwargs)

    monkeypatch.setattr(shardio.planning.planner, "plan_epoch", counting)
    return planned


@pytest.mark.parametrize("options", [{"batch_size": 4}, {"max_duration": 1.5}], ids=["counted", "planned"])
def test_a_state_at_its_epochs_end_loads_and_one_past_it_is_refused(
    dataset_dir: Path, plans: list[int], options: dict[str, Any]
) -> None:
    ds = ShardDataset(dataset_dir, seed=4, **options)
    ds.set_epoch(2)
    batches = len(ds)
    last = ds.state_after({"epoch": 2, "batch_index": batches - 1})
    del plans[:]
    with pytest.raises(
        StateError,
        match=rf"field start: the state is at batch {batches + 1} of epoch 2, "
        rf"which has only {batches} batches per rank",
    ):
        ShardDataset(dataset_dir, seed=4, **options).load_state_dict({**last, "start": batches + 1})
    resumed = ShardDataset(dataset_dir, seed=4, **options)
    resumed.load_state_dict(last)
    assert list(resumed) == []  # the epoch is over
    middle = ShardDataset(dataset_dir, seed=4, **options)
    middle.load_state_dict({**last, "start": 1})
    assert [batch["batch_index"] for batch in middle] == list(range(1, batches))
    # each dataset plans once at most: the refused one only where its check needed the plan
    assert plans == ([2, 2, 2] if "max_duration" in options else [2, 2])


def test_a_counted_load_plans_nothing_until_the_first_batch(dataset_dir: Path, plans: list[int]) -> None:
    ds = ShardDataset(dataset_dir, batch_size=3, seed=4)
    state = ds.state_after({"epoch": 1, "batch_index": 2})
    del plans[:]
    resumed = ShardDataset(dataset_dir, batch_size=3, seed=4)
    resumed.load_state_dict(state)
    assert plans == []
    assert next(iter(resumed))["batch_index"] == 3
    assert plans == [1]
