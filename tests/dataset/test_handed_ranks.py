"""A dataset built before its rank processes start (``torch.multiprocessing`` spawn or fork, as Lightning's
``ddp_spawn``/``ddp_fork`` do): every rank plays exactly its own plan, epoch after epoch.

The ranks used to share the launcher's control block (a spawned rank receives it by handle, a forked one
inherits the mapping), so one rank's iterations counted as the other's: ranks played epochs 1, 2 or 3 where
the plan said 0 or 1. A worker forked from a spawned rank also took the launcher's world (1 rank) as its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Ordering, ShardDataset, World

JOB = Path(__file__).parents[1] / "handed_ranks_job.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("handed") / "data"
    make_uneven_dataset(root, (7, 5, 9, 6), seed=1)
    return root


def planned(data: Path, rank: int, epoch: int) -> list[list[Any]]:
    dataset = ShardDataset(
        data, batch_size=2, seed=3, ordering=Ordering(shuffle_shards=2), world=World(rank, 2)
    )
    dataset.set_epoch(epoch)
    return [[epoch, list(batch["keys"])] for batch in DataLoader(dataset, batch_size=None)]


def launch(data: Path, out: Path, method: str, *epoch: str) -> list[list[list[Any]]]:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(JOB.parent.parent), str(JOB.parent), *sys.path])}
    command = [sys.executable, str(JOB), method, str(data), str(out), *epoch]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=pytest.mark.slow), "fork"])
def test_ranks_handed_one_dataset_play_their_own_plans(data: Path, tmp_path: Path, method: str) -> None:
    played = launch(data, tmp_path / "run", method)
    assert played == [planned(data, rank, 0) + planned(data, rank, 1) for rank in range(2)]


def test_ranks_handed_a_dataset_keep_the_launchers_instruction(data: Path, tmp_path: Path) -> None:
    """``set_epoch(3)`` before the ranks start: each rank's own block begins as a copy of the launcher's."""
    played = launch(data, tmp_path / "run", "fork", "3")
    assert played == [planned(data, rank, 3) + planned(data, rank, 4) for rank in range(2)]
