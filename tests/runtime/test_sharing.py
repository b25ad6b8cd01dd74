"""A rank's plan reaches spawn and forkserver DataLoader workers through shared memory, or mapped from the
node plan's files, never pickled by value."""

from __future__ import annotations

import multiprocessing
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader, get_worker_info

from shardio import ShardDataset, World
from shardio.planning.rankplan import RankPlan
from shardio.runtime.nodeplan import MappedRankPlan
from shardio.runtime.sharing import SharedRankPlan, shared


def test_a_dataset_pickled_for_workers_does_not_grow_with_the_plan(tmp_path: Path) -> None:
    sizes = {}
    for n in (200, 3200):
        root = make_uneven_dataset(tmp_path / f"n{n}", [n // 4] * 4, duration_range=(0.01, 0.02)).root
        dataset = ShardDataset(root, batch_size=2, world=World(rank=1, world_size=2))
        dataset.set_epoch(0)
        sizes[n] = len(ForkingPickler.dumps(dataset))  # as a DataLoader sends it to a spawn/forkserver worker
    # 3,000 more samples: this rank's share is 1,500 ids (6 KB) and 750 offsets (6 KB) more, sent by handle
    assert abs(sizes[3200] - sizes[200]) < 200


def test_a_shared_plan_is_the_same_plan_by_handle_or_by_value() -> None:
    plan = RankPlan(3, np.arange(10, dtype=np.int32), np.array([0, 4, 10]), np.arange(10) % 3 == 0)
    for copy in (
        shared(plan),
        pickle.loads(pickle.dumps(shared(plan))),
        ForkingPickler.loads(ForkingPickler.dumps(shared(plan))),
    ):
        assert isinstance(copy, SharedRankPlan) and copy.rank == 3
        assert [copy.batch(j).tolist() for j in range(2)] == [plan.batch(j).tolist() for j in range(2)]
        assert [copy.repeat_flags(j).tolist() for j in range(2)] == [
            plan.repeat_flags(j).tolist() for j in range(2)
        ]
    assert shared(shared(plan)).tensors[0] is not None and shared(plan).tensors[0].is_shared()


def _check_shared(worker: int) -> None:
    """The worker's share is in shared memory (one rank alone plans in memory), or mapped from the node plan's
    files (with several ranks): never a copy of the ids."""
    info = get_worker_info()
    assert info is not None
    shares = list(info.dataset._epochs.shares.values())  # type: ignore[union-attr]
    if info.dataset.ranks().world_size > 1:  # type: ignore[union-attr]
        received = len(shares) == 1 and isinstance(shares[0], MappedRankPlan)
    else:
        received = (
            len(shares) == 1 and isinstance(shares[0], SharedRankPlan) and shares[0].tensors[0].is_shared()
        )
    if not received:
        raise RuntimeError(f"worker {worker} received its rank's plan by value: {shares!r:.200}")


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("context", ["forkserver"])
def test_forkserver_workers_play_the_shared_plan(tmp_path: Path, context: str, world_size: int) -> None:
    root = make_uneven_dataset(tmp_path / "ds", [30, 7, 19], duration_range=(0.01, 0.02)).root
    world = World(rank=world_size - 1, world_size=world_size)
    expected = [list(b["keys"]) for b in ShardDataset(root, batch_size=3, world=world)]
    ctx: Any = multiprocessing.get_context(context)
    ctx.set_forkserver_preload(["torch", "shardio.datasets.dataset"])
    dataset = ShardDataset(root, batch_size=3, world=world)
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=ctx, worker_init_fn=_check_shared
    )
    assert [list(b["keys"]) for b in loader] == expected


def test_without_shared_memory_the_plan_stays_private(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import shardio.runtime.sharing

    def no_space(array: np.ndarray) -> Any:
        raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")

    monkeypatch.setattr(shardio.runtime.sharing, "_tensor", no_space)
    plan = RankPlan(0, np.arange(6, dtype=np.int32), np.array([0, 2, 6]))
    with caplog.at_level("WARNING", logger="shardio.runtime.sharing"):
        assert shared(plan) is plan
    assert "stays private" in caplog.text and "6 ids" in caplog.text
    assert pickle.loads(ForkingPickler.dumps(plan)).batch(1).tolist() == [2, 3, 4, 5]  # a copy, by value
