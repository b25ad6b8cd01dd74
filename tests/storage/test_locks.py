"""The one lock primitive (shardio.storage.locks) that the dataset-directory, plan and shard-cache locks stand
on: a wait for a lock another process holds is logged once, naming the lock file and its holder; a refusal
names the holder; the lock file goes with its release."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio.errors import OutputError
from shardio.planning.plan import EpochPlan
from shardio.runtime import planfiles
from shardio.storage import locks
from shardio.storage.dirlock import DirectoryLock
from shardio.storage.locks import FileLock


def hold(path: str, ready: Any, stop: Any) -> None:
    """Hold the lock of ``path`` until ``stop`` is set (run in another process)."""
    lock = FileLock(path)
    assert lock.acquire(5)
    ready.set()
    stop.wait(60)
    lock.release()


def hold_directory(directory: str, ready: Any, stop: Any) -> None:
    lock = DirectoryLock(directory)
    ready.set()
    stop.wait(60)
    lock.release()


class Holder:
    """Another process holding a lock (``target(path, ready, stop)``) while the ``with`` block runs."""

    def __init__(self, target: Any, path: str) -> None:
        context = multiprocessing.get_context("fork")
        self.ready, self.stop = context.Event(), context.Event()
        self.process = context.Process(target=target, args=(path, self.ready, self.stop))

    def __enter__(self) -> int:
        self.process.start()
        assert self.ready.wait(30)
        assert self.process.pid is not None
        return self.process.pid

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.process.join(30)


def waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("waiting for")]


def test_a_wait_for_a_lock_another_process_holds_is_logged_once_naming_the_file_and_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(locks, "QUIET_S", 0.1)
    path = str(tmp_path / "busy.lock")
    with Holder(hold, path) as pid, caplog.at_level(logging.INFO, logger="shardio.storage.locks"):
        waiter = FileLock(path, what="the busy thing")
        begun = time.monotonic()
        assert not waiter.acquire(0.8) and waiter.waited
        assert time.monotonic() - begun < 5
    [line] = waits(caplog)
    assert (
        line == f"waiting for the busy thing: {path} is held by pid {pid} on host "
        f"{socket.gethostname()[:64]} since " + line.rsplit(" since ", 1)[1]
    )
    assert waiter.acquire(5)  # the holder released it
    waiter.release()


def test_a_short_wait_is_not_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "brief.lock")
    with Holder(hold, path), caplog.at_level(logging.INFO, logger="shardio.storage.locks"):
        assert not FileLock(path).acquire(0.2)
    assert waits(caplog) == []


def test_a_plan_lock_held_by_another_process_says_so_while_the_rank_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41 item 8: every rank waited up to WAIT_S (600 s) on a held plan lock without a word."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(locks, "QUIET_S", 0.1)
    monkeypatch.setattr(planfiles, "WAIT_S", 0.6)
    os.makedirs(tmp_path / "cache" / "plans")
    lock_file = planfiles.path("held") + ".lock"
    plan = EpochPlan(np.arange(4), np.array([0, 4]), np.arange(1)[None, :])
    with Holder(hold, lock_file) as pid, caplog.at_level(logging.WARNING):
        got = planfiles.obtain("held", 0, 4, lambda: plan)  # past the deadline: planned here
    assert got.ids.tolist() == [0, 1, 2, 3]
    [line] = waits(caplog)
    assert f"{lock_file} is held by pid {pid} on host" in line and "planning the epoch" in line


def test_the_dataset_directory_lock_refuses_naming_the_other_writer(tmp_path: Path) -> None:
    with Holder(hold_directory, str(tmp_path)) as pid:
        with pytest.raises(OutputError, match=f"being written by another shardio run \\(pid {pid} on host "):
            DirectoryLock(str(tmp_path))
    DirectoryLock(str(tmp_path)).release()  # free again once the holder released it
    assert os.listdir(tmp_path) == []


def test_a_held_lock_file_records_its_holder_and_goes_with_its_release(tmp_path: Path) -> None:
    path = str(tmp_path / "mine.lock")
    lock = FileLock(path)
    assert lock.acquire(0) and lock.held
    record = json.loads(Path(path).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    lock.release()
    lock.release()  # idempotent
    assert not os.path.exists(path) and not lock.held
    assert not locks.remove_if_free(path)


def test_remove_if_free_leaves_a_held_lock_file(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    with Holder(hold, path):
        assert not locks.remove_if_free(path) and os.path.exists(path)
    Path(path).touch()  # left by a killed holder
    assert locks.remove_if_free(path) and not os.path.exists(path)
