"""Worker faults surface in the training process within seconds, never as a hang.

torch 2.13's DataLoader re-raises a worker's exception in the main process (same type where it can be
rebuilt from a message: ShardioError subclasses are; a transform's own exceptions take the same path). A
worker that dies (SIGKILL) is reported as ``RuntimeError: DataLoader worker (pid(s) X) exited unexpectedly``
raised from ``RuntimeError: DataLoader worker (pid X) is killed by signal: Killed.`` (its SIGCHLD handler
interrupts the main process's wait), or by its liveness check every 5 s.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader, get_worker_info

from shardio import Decoding, FormatError, Index, ShardDataset

pytestmark = pytest.mark.timeout(60)

SURFACES_WITHIN = 15.0  # seconds; torch checks dead workers every 5 s at worst
KILLED = r"DataLoader worker \(pid\(?s?\)? [\d, ]+\) (is killed by signal: Killed|exited unexpectedly)"


@pytest.fixture(autouse=True)
def _shut_down_abandoned_loaders() -> Iterator[None]:
    """Collect each test's loaders when it ends, in its own timing. A loader that the garbage collector ends
    (one a caught exception's frames hold) takes 5 s per live worker in torch 2.13: the collector closes the
    loader's queues before its ``__del__`` tells the workers to stop, so they never hear it and are joined
    until the timeout. Tests that catch a loader's exception clear its frames, which ends the loader first."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Index:
    """4 shards of 4 short samples, read in batches of 2: 8 batches over two workers."""
    return make_uneven_dataset(
        tmp_path_factory.mktemp("workers") / "ds", [4, 4, 4, 4], duration_range=(0.02, 0.05)
    )


class KillAt:
    """A transform that kills its own worker process (SIGKILL) on one sample key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        if sample["key"] == self.key and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return sample


def drain(loader: DataLoader) -> int:
    count = 0
    for _ in loader:
        count += 1
    return count


def key_of_batch(index: Index, dataset: ShardDataset, batch: int) -> str:
    """The first key of planned batch ``batch`` (batch ``2k`` is worker 0's ``k``-th)."""
    return index.keys[int(dataset.plan().batch(0, batch)[0])]


def test_exception_in_a_worker_is_raised_in_the_training_process_with_its_type(tmp_path: Path) -> None:
    local = make_uneven_dataset(tmp_path / "ds", [4, 4], duration_range=(0.02, 0.05))
    with open(local.shard_path(1), "r+b") as handle:  # break the tar header of sample 5 (same size)
        handle.seek(int(local.columns["frame_offset"][5]) + 1)
        handle.write(b"\xff")
    dataset = ShardDataset(local.root, batch_size=2)
    started = time.monotonic()
    with pytest.raises(FormatError, match="Caught FormatError in DataLoader worker process") as caught:
        drain(DataLoader(dataset, batch_size=None, num_workers=2))
    assert time.monotonic() - started < SURFACES_WITHIN
    assert "tar header checksum mismatch" in str(caught.value)
    assert f"key {local.keys[5]!r}" in str(caught.value) and local.shard_path(1) in str(caught.value)
    traceback.clear_frames(caught.tb)


def test_worker_killed_inside_a_transform(index: Index) -> None:
    probe = ShardDataset(index.root, batch_size=2)
    dataset = ShardDataset(
        index.root, batch_size=2, decoding=Decoding(transform=KillAt(key_of_batch(index, probe, 2)))
    )
    started = time.monotonic()
    delivered = 0
    with pytest.raises(RuntimeError, match=KILLED):
        for _ in DataLoader(dataset, batch_size=None, num_workers=2):
            delivered += 1
    assert delivered < len(dataset)
    assert time.monotonic() - started < SURFACES_WITHIN


def record_pid(worker: int) -> None:
    with open(os.environ["SHARDIO_TEST_PIDS"], "a") as out:
        out.write(f"{os.getpid()}\n")


class Slow:
    """A transform that takes a little while, so that the loader is mid-epoch when the test kills a worker."""

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        time.sleep(0.05)
        return sample


def test_worker_killed_from_outside(index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("SHARDIO_TEST_PIDS", str(pids))
    dataset = ShardDataset(index.root, batch_size=2, decoding=Decoding(transform=Slow()))
    iterator = iter(DataLoader(dataset, batch_size=None, num_workers=2, worker_init_fn=record_pid))
    next(iterator)
    victim = int(pids.read_text().split()[0])
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=KILLED):
        for _ in range(len(dataset)):
            next(iterator)
    assert time.monotonic() - started < SURFACES_WITHIN
