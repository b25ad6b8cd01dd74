"""One process of a node plans an epoch; the node's other processes that need it wait for it
and map its plan file."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

import shardio.planning.planner
from shardio import ShardDataset, World
from shardio.planning.plan import EpochPlan
from shardio.runtime import planfiles
from shardio.runtime.nodeplan import MappedRankPlan
from shardio.storage.locks import FileLock

REPO = Path(__file__).resolve().parents[2]
WORLD = World(rank=1, world_size=3)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    return make_uneven_dataset(tmp_path / "ds", [13, 4, 9, 6], duration_range=(0.01, 0.02)).root


def count_plans(log: Path) -> None:
    """Make every process (forks inherit it) append ``pid epoch`` to ``log`` whenever it plans an epoch."""
    original = shardio.planning.planner.plan_epoch

    def counted(*args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as file:
            file.write(f"{os.getpid()} {kwargs['epoch']}\n")
        return original(*args, **kwargs)

    shardio.planning.planner.plan_epoch = counted  # type: ignore[assignment]


def planned(log: Path) -> list[tuple[int, int]]:
    """``(pid, epoch)`` of every planning recorded in ``log``."""
    if not log.exists():
        return []
    return [(int(pid), int(epoch)) for pid, epoch in (line.split() for line in log.read_text().splitlines())]


def epochs_on_disk(cache: Path) -> list[int]:
    """The epochs whose node plans are under ``cache``'s ``plans/`` (and nothing else is there)."""
    names = os.listdir(cache / "plans")
    matches = [re.fullmatch(r"[0-9a-f]{12}-e([0-9]{6})-[0-9a-f]{32}", name) for name in names]
    assert all(matches), names
    return sorted(int(match.group(1)) for match in matches if match)


def small_plan(samples: int, sizes: list[int]) -> EpochPlan:
    """A one-rank plan of ids ``0 .. samples - 1`` in batches of ``sizes``."""
    return EpochPlan(
        np.arange(samples), np.concatenate([[0], np.cumsum(sizes)]), np.arange(len(sizes))[None, :]
    )


def played(root: str, epochs: int, workers: int, persistent: bool = False) -> list[list[list[str]]]:
    """The keys of ``epochs`` epochs played without ``set_epoch`` (each iteration plays the next epoch)."""
    dataset = ShardDataset(root, batch_size=3, world=WORLD)
    if workers == 0:
        return [[list(batch["keys"]) for batch in dataset] for _ in range(epochs)]
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        persistent_workers=persistent,
        multiprocessing_context="fork",
    )
    return [[list(batch["keys"]) for batch in loader] for _ in range(epochs)]


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_one_process_of_the_rank_plans_each_epoch(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, persistent: bool
) -> None:
    expected = played(root, 3, 0)
    shutil.rmtree(tmp_path / "cache" / "plans")  # the plans of that run (world 3: node plans)
    log = tmp_path / "planned"
    monkeypatch.setattr(
        shardio.planning.planner, "plan_epoch", shardio.planning.planner.plan_epoch
    )  # restored afterwards
    count_plans(log)
    assert played(root, 3, workers, persistent) == expected
    plannings = planned(log)
    assert sorted(epoch for _, epoch in plannings) == [0, 1, 2]  # once per epoch, not once per worker
    assert os.getpid() not in {pid for pid, _ in plannings}  # by a worker: the training process never planned
    assert epochs_on_disk(tmp_path / "cache") == [1, 2]  # epoch 2's writer removed epoch 0's


def contend(log: str, barrier: Any, results: Any) -> None:
    """One of two processes that need plan ``contended`` at once: record how it got it."""
    plan = small_plan(12, [5, 7])

    def make() -> EpochPlan:
        with open(log, "a") as file:
            file.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # long enough for the other to find no file and wait on the lock
        return plan

    barrier.wait()
    got = planfiles.obtain("contended", 0, 12, make)
    results.put((os.getpid(), isinstance(got, MappedRankPlan), got.ids.tolist(), got.offsets.tolist()))


def test_of_two_processes_contending_one_plans_the_other_maps(root: str, tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    processes = [
        context.Process(target=contend, args=(str(tmp_path / "planned"), barrier, results)) for _ in range(2)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=30) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    planners = (tmp_path / "planned").read_text().split()
    assert len(planners) == 1
    assert all(read for _, read, _, _ in outcomes)  # the planner too reads what it wrote
    assert all(ids == list(range(12)) and offsets == [0, 5, 12] for _, _, ids, offsets in outcomes)
    assert os.listdir(tmp_path / "cache" / "plans") == ["contended"]  # the lock file went with its release


def hold(paths: list[str], ready: Any, stop: Any) -> None:
    """Hold the planning locks of ``paths`` until ``stop`` is set (or this process is killed)."""
    locks = [FileLock(path) for path in paths]
    assert all(lock.acquire(5) for lock in locks)
    ready.set()
    stop.wait(60)
    for lock in locks:
        lock.release()


def test_a_killed_holder_does_not_block_the_next(root: str, tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    ready, stop = context.Event(), context.Event()
    os.makedirs(tmp_path / "cache" / "plans")
    lock_file = str(tmp_path / "cache" / "plans" / "killed.lock")
    holder = context.Process(target=hold, args=([lock_file], ready, stop))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
    holder.join(30)
    assert os.path.exists(lock_file)  # left behind, unlocked by the kernel
    begun = time.monotonic()
    got = planfiles.obtain("killed", 0, 4, lambda: small_plan(4, [4]))
    assert time.monotonic() - begun < 2 and got.ids.tolist() == [0, 1, 2, 3]
    assert os.listdir(tmp_path / "cache" / "plans") == ["killed"]


def test_past_the_deadline_a_worker_plans_by_itself(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = played(root, 2, 0)
    monkeypatch.setattr(planfiles, "name", lambda job, epoch, history: f"epoch-{epoch}")
    monkeypatch.setattr(planfiles, "WAIT_S", 0.3)
    directory = tmp_path / "cache" / "plans"
    os.makedirs(directory, exist_ok=True)
    context = multiprocessing.get_context("fork")
    ready, stop = context.Event(), context.Event()
    holder = context.Process(
        target=hold, args=([str(directory / f"epoch-{e}.lock") for e in (0, 1)], ready, stop)
    )
    holder.start()
    try:
        assert ready.wait(30)
        log = tmp_path / "planned"
        monkeypatch.setattr(shardio.planning.planner, "plan_epoch", shardio.planning.planner.plan_epoch)
        count_plans(log)
        assert played(root, 2, 2) == expected
        assert sorted(epoch for _, epoch in planned(log)) == [0, 0, 1, 1]  # each worker, past the deadline
    finally:
        stop.set()
        holder.join(30)


def test_a_waiter_polls_a_millisecond_apart_then_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "epoch.lock")
    holder = FileLock(path)
    assert holder.acquire(1.0)
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 8:
            holder.release()

    monkeypatch.setattr(time, "sleep", pause)
    waiter = FileLock(path)
    assert waiter.acquire(600.0) and waiter.waited
    waiter.release()
    assert pauses == [0.001, 0.002, 0.004, 0.008, 0.016, 0.03, 0.03, 0.03]


def unwritable_run(root: str, log: str) -> None:
    """Play 2 epochs on 2 fork workers and 0 workers; print both, and the plannings (run in a subprocess)."""
    count_plans(Path(log))
    with_workers = played(root, 2, 2)
    counted = planned(Path(log))
    print(json.dumps({"workers": with_workers, "planned": counted, "alone": played(root, 2, 0)}))


@pytest.mark.parametrize("unwritable", ["read-only", pytest.param("a file", marks=pytest.mark.slow)])
def test_an_unwritable_cache_leaves_each_worker_to_plan(root: str, tmp_path: Path, unwritable: str) -> None:
    cache = tmp_path / "unwritable"
    prefix: list[str] = []
    if unwritable == "read-only":
        cache.mkdir(mode=0o555)
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("running as root without setpriv: permissions cannot be tested")
            prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    else:
        cache.write_text("not a directory")
    env = {
        **os.environ,
        "SHARDIO_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]),
    }
    code = f"import test_plan_lock; test_plan_lock.unwritable_run({root!r}, {str(tmp_path / 'planned')!r})"
    result = subprocess.run(
        [*prefix, sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["workers"] == outcome["alone"]
    assert sorted(epoch for _, epoch in outcome["planned"]) == [0, 0, 1, 1]  # each worker by itself
    # once per process: each worker, and the training process playing the world-3 epochs alone
    assert result.stderr.count("this process plans each epoch by itself") == 5
    if unwritable == "read-only":
        assert os.listdir(cache) == []


def test_the_cache_command_prunes_day_old_plans_and_locks(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    directory = tmp_path / "cache" / "plans"
    old, new = (planfiles.name({"job": job}, 0, []) for job in ("old", "new"))
    for name in (old, new):
        assert planfiles.save(name, small_plan(4, [4]), 4) is not None
        (directory / f"{name}.lock").touch()
    (directory / ".tmp-dead1234").mkdir()
    day_ago = time.time() - planfiles.STALE_S - 60
    for name in (old, f"{old}.lock", ".tmp-dead1234"):
        os.utime(directory / name, (day_ago, day_ago))
    assert main(["cache", "--prune"]) == 0
    assert "pruned 3 files" in capsys.readouterr().out
    assert sorted(os.listdir(directory)) == sorted([new, f"{new}.lock"])


def test_pruning_plans_removes_only_what_shardio_wrote(root: str, tmp_path: Path) -> None:
    """Day-old entries of ``plans/`` shardio did not write (another name, a link, a plan directory holding
    a file of someone else's) stay: a file we did not write is never deleted."""
    directory = tmp_path / "cache" / "plans"
    ours, planted = (planfiles.name({"job": job}, 0, []) for job in ("ours", "planted"))
    for name in (ours, planted):
        assert planfiles.save(name, small_plan(4, [4]), 4) is not None
    (directory / planted / "notes.txt").write_text("mine")
    (directory / "notes.shard").write_text("mine")
    (directory / ".tmp-not-mkdtemps").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_text("mine")
    (directory / f"{ours}.lock").symlink_to(tmp_path / "elsewhere" / "keep")
    day_ago = time.time() - planfiles.STALE_S - 60
    for entry in directory.iterdir():
        os.utime(entry, (day_ago, day_ago), follow_symlinks=False)
    assert planfiles.prune() == 1  # ours
    assert sorted(os.listdir(directory)) == sorted(
        [planted, "notes.shard", ".tmp-not-mkdtemps", f"{ours}.lock"]
    )
    assert os.listdir(directory / planted) == ["notes.txt"]  # its plan files went, the planted one stayed
    assert (tmp_path / "elsewhere" / "keep").read_text() == "mine"


def test_writing_plans_prunes_day_old_entries_at_most_every_ten_minutes(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "cache" / "plans"
    clock = [1000.0]
    monkeypatch.setattr(planfiles.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(planfiles, "_pruned_at", None)
    day_ago = time.time() - planfiles.STALE_S - 60

    def stale(name: str) -> None:
        (directory / name).mkdir(parents=True)
        os.utime(directory / name, (day_ago, day_ago))

    killed1, killed2, a, b, c = (planfiles.name({"job": job}, 0, []) for job in ("k1", "k2", "a", "b", "c"))
    stale(killed1)
    assert planfiles.save(a, small_plan(4, [4]), 4) is not None
    assert sorted(os.listdir(directory)) == [a]  # the process's first plan looked
    stale(killed2)
    clock[0] += planfiles.PRUNE_EVERY_S - 1
    assert planfiles.save(b, small_plan(4, [4]), 4) is not None
    assert sorted(os.listdir(directory)) == sorted([a, b, killed2])  # not again so soon
    clock[0] += 1
    assert planfiles.save(c, small_plan(4, [4]), 4) is not None
    assert sorted(os.listdir(directory)) == sorted([a, b, c])
