"""States saved before the typed state (:class:`~shardio.planning.surgery.Surgery`) read, trace and resume as
they did: ``tests/data/states_0c9fd4a.json`` holds states saved by shardio at commit 0c9fd4a (a plain
mid-epoch state, a quarantine with carry, a mid-epoch re-mix, a quarantine after it) and the keys its
``Trace`` showed for every batch of the state's epoch and the next. The datasets are made again here, byte for
byte, from their seeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sample_shards import make_uneven_dataset

from shardio import EpochSize, LoaderState, ShardDataset, Trace, World
from shardio.datasets.mixed import MixedDataset
from shardio.planning.surgery import Quarantine, Surgery

SAVED = json.loads((Path(__file__).parents[1] / "data" / "states_0c9fd4a.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ShardDataset]:
    root = tmp_path_factory.mktemp("saved")
    make_uneven_dataset(root / "one", [9, 30, 2, 17, 11], seed=4, duration_range=(0.05, 0.3))
    make_uneven_dataset(root / "big", [20, 14, 9], seed=1, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "tiny", [3], seed=3, duration_range=(0.2, 0.3))
    one = ShardDataset(root / "one", batch_size=3, seed=5, world=World(0, 2))
    sources = {"big": str(root / "big"), "tiny": str(root / "tiny")}
    new = MixedDataset(
        sources, {"big": 0.5, "tiny": 0.5}, EpochSize(batches=12), batch_size=2, seed=3, world=World(0, 2)
    )
    return {"one": one, "new": new}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_a_state_saved_before_the_typed_state_traces_as_it_did(
    datasets: dict[str, ShardDataset], name: str
) -> None:
    case: dict[str, Any] = SAVED[name]
    state = case["state"]
    dataset = datasets[case["dataset"]]
    trace = Trace(dataset, state)
    epochs = (state["epoch"], state["epoch"] + 1)
    assert [trace.row(record)["keys"] for epoch in epochs for record in trace.epoch(epoch)] == case["keys"]
    loaded = LoaderState.from_dict(state)
    assert loaded.surgery.to_extra() == state["extra"]  # the JSON form is unchanged: no conversion
    dataset.load_state_dict(state)
    assert dataset.state_dict()["extra"] == state["extra"]


def test_a_saved_states_extra_reads_as_typed_values() -> None:
    surgery = LoaderState.from_dict(SAVED["requarantined"]["state"]).surgery
    assert surgery.streams is not None and set(surgery.streams.streams) == {"big", "tiny"}
    carried = [entry for entry in surgery.quarantines if entry.carry]
    assert carried and all(isinstance(entry, Quarantine) and entry.keys for entry in carried)
    assert isinstance(surgery, Surgery) and not surgery.other
    assert LoaderState.from_dict(SAVED["plain"]["state"]).surgery == Surgery()
