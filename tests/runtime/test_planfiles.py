"""Persistent DataLoader workers map the training process's plan of each later epoch
instead of planning it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from test_plan_lock import epochs_on_disk
from torch.utils.data import DataLoader, get_worker_info

import shardio.planning.planner
from shardio import Index, ShardDataset, World
from shardio.planning.plan import EpochPlan


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    return make_uneven_dataset(tmp_path / "ds", [13, 4, 9, 6], duration_range=(0.01, 0.02)).root


def epoch_keys(root: str, epoch: int) -> list[list[str]]:
    dataset = ShardDataset(root, batch_size=3, world=World(rank=1, world_size=3))
    dataset.set_epoch(epoch)
    return [list(batch["keys"]) for batch in dataset]


def persistent_run(root: str, epochs: int) -> list[list[list[str]]]:
    dataset = ShardDataset(root, batch_size=3, world=World(rank=1, world_size=3))
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    played = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        played.append([list(batch["keys"]) for batch in loader])
    return played


def test_persistent_workers_map_each_epochs_plan(
    root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    expected = [epoch_keys(root, epoch) for epoch in range(3)]
    shutil.rmtree(tmp_path / "cache" / "plans")  # the plans of those runs (world 3: node plans)
    original = shardio.planning.planner.plan_epoch

    def in_the_training_process_only(*args: Any, **kwargs: Any) -> Any:
        if get_worker_info() is not None:
            raise RuntimeError("a DataLoader worker planned a whole epoch")
        return original(*args, **kwargs)

    monkeypatch.setattr(
        shardio.planning.planner, "plan_epoch", in_the_training_process_only
    )  # forked workers inherit it
    assert persistent_run(root, 3) == expected
    assert epochs_on_disk(tmp_path / "cache") == [1, 2]  # epoch 2's writer removed epoch 0's


@pytest.mark.parametrize("damage", ["truncated", "ids beyond the index", "starts of another shape"])
def test_a_damaged_plan_file_is_planned_again_in_the_worker(
    root: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: str
) -> None:
    expected = [epoch_keys(root, epoch) for epoch in range(2)]
    shutil.rmtree(tmp_path / "cache" / "plans")
    save = shardio.runtime.planfiles.save

    def damaged(name: str, plan: EpochPlan, samples: int) -> str | None:
        path = save(name, plan, samples)
        assert path is not None
        ids = os.path.join(path, "ids.npy")
        if damage == "truncated":
            os.truncate(ids, os.path.getsize(ids) - 3)
        elif damage == "ids beyond the index":
            np.save(ids, np.load(ids) + 10_000)
        else:
            np.save(os.path.join(path, "starts.npy"), np.load(os.path.join(path, "starts.npy"))[:-1])
        return path

    monkeypatch.setattr(shardio.runtime.planfiles, "save", damaged)
    assert persistent_run(root, 2) == expected


def test_a_full_disk_leaves_the_workers_to_plan(
    root: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import errno

    expected = [epoch_keys(root, epoch) for epoch in range(2)]
    shutil.rmtree(tmp_path / "cache" / "plans")

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shardio.runtime.nodeplan.np, "save", full)
    with caplog.at_level("WARNING", logger="shardio.runtime.planfiles"):
        assert persistent_run(root, 2) == expected
    assert "each process plans the epoch by itself" in caplog.text
    assert os.listdir(tmp_path / "cache" / "plans") == []  # no partial plan left behind


def test_a_fingerprint_copied_from_another_dataset_never_maps_its_plans(root: str, tmp_path: Path) -> None:
    """Node plan files are keyed by the index's content, not by the fingerprint index.json states: a dataset
    that states another's fingerprint (copied by hand, or by a hostile dataset) used to map that dataset's
    plans and yield 32 of its 40 samples, silently."""
    other = make_uneven_dataset(tmp_path / "other", [19, 21], seed=5, duration_range=(0.01, 0.02))
    stated = Index.load(root).fingerprint

    def stating() -> Index:  # index.json refuses a copied fingerprint at load (test_index_fingerprint.py):
        index = Index.load(other.root)  # here the loaded index states it all the same, defence in depth
        index.fingerprint = stated
        return index

    for rank in range(2):  # the first dataset's plans, on disk for world 2
        list(ShardDataset(root, batch_size=2, world=World(rank, 2)))
    keys = [
        key
        for rank in range(2)
        for batch in ShardDataset(stating(), batch_size=2, world=World(rank, 2))
        for key in batch["keys"]
    ]
    assert sorted(set(keys)) == sorted(Index.load(other.root).keys) and len(keys) == 40
