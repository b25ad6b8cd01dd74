"""The node cache's housekeeping: lock files go with their entries (eviction, discard, prune), stale temporary
files of dead fetches go on prune, and removing lock files never lets two processes fetch one shard at once.

Real processes (fork) share one cache directory, as DataLoader workers and ranks on a node do."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from shardio.reading.cache import ShardCache

SHARDS = 12
SIZE = 4096


def content(number: int) -> bytes:
    return hashlib.sha256(str(number).encode()).digest() * (SIZE // 32)


def digest(number: int) -> str:
    return hashlib.sha256(content(number)).hexdigest()


def _worker(directory: str, max_bytes: int, log: str, rounds: int, seed: int) -> None:
    """Fill shards in a seeded order; every fetch appends ``shard`` to ``log``, and checks no other process is
    fetching the same shard meanwhile (an ``O_EXCL`` flag file per shard)."""
    cache = ShardCache(directory, max_bytes)
    order = [(seed * 7 + 5 * k) % SHARDS for k in range(rounds)]
    for number in order:

        def fetch(out: BinaryIO, number: int = number) -> None:
            flag = os.path.join(log + ".busy", str(number))
            descriptor = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # FileExistsError: two fetchers
            try:
                with open(log, "a") as handle:
                    handle.write(f"{number}\n")
                time.sleep(0.002)
                out.write(content(number))
            finally:
                os.close(descriptor)
                os.unlink(flag)

        path = cache.fill(digest(number), SIZE, fetch, f"shard {number}")
        assert path is not None
        held = _held(directory)
        if held > max_bytes:  # entries and fetches under way, every process's: never above the bound
            with open(log + ".over", "a") as handle:
                handle.write(f"{held}\n")


def _held(directory: str) -> int:
    """Bytes of the entries and fetches under way, each file once (by inode: a fetch renamed while the
    directory is listed may be listed under both names)."""
    sizes: dict[int, int] = {}
    for entry in os.scandir(directory):
        if entry.name.endswith(".shard") or entry.name.startswith(".tmp-"):
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            sizes[info.st_ino] = max(sizes.get(info.st_ino, 0), info.st_size)
    return sum(sizes.values())


def _pruner(directory: str, max_bytes: int, seconds: float) -> None:
    cache = ShardCache(directory, max_bytes)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cache.prune()


def run_processes(
    tmp_path: Path, max_bytes: int, workers: int = 4, rounds: int = 24
) -> tuple[Path, list[int]]:
    directory = tmp_path / "cache"
    log = tmp_path / "fetches"
    (tmp_path / "fetches.busy").mkdir()
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=_worker, args=(str(directory), max_bytes, str(log), rounds, seed))
        for seed in range(workers)
    ]
    processes.append(context.Process(target=_pruner, args=(str(directory), max_bytes, 1.0)))
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * len(processes)
    return directory, [int(line) for line in log.read_text().split()]


def names(directory: Path, suffix: str) -> set[str]:
    return {name[: -len(suffix)] for name in os.listdir(directory) if name.endswith(suffix)}


def test_processes_fetch_each_shard_once_while_locks_are_pruned(tmp_path: Path) -> None:
    directory, fetched = run_processes(tmp_path, max_bytes=SHARDS * SIZE)  # room for all: no eviction
    assert sorted(fetched) == sorted(set(fetched))  # never twice, though prune removed lock files meanwhile
    cache = ShardCache(str(directory), SHARDS * SIZE)
    cache.prune()
    assert names(directory, ".lock") <= set(os.listdir(directory))  # every lock left has its entry


def test_eviction_removes_the_lock_files_of_what_it_evicts(tmp_path: Path) -> None:
    directory, fetched = run_processes(tmp_path, max_bytes=3 * SIZE)
    assert len(fetched) > SHARDS  # evicted shards were fetched again
    assert not (tmp_path / "fetches.over").exists(), (tmp_path / "fetches.over").read_text().split()
    entries = names(directory, ".shard")
    assert len(entries) <= 3
    locks = {name[: -len(".shard")] for name in names(directory, ".lock")}
    assert locks <= entries, f"lock files left for evicted entries: {sorted(locks - entries)}"
    for name in entries:
        number = next(n for n in range(SHARDS) if name.startswith(digest(n)))
        assert (directory / f"{name}.shard").read_bytes() == content(number)


def test_prune_removes_orphan_locks_and_stale_temporaries_but_not_held_locks(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 10 * SIZE)
    kept = cache.fill(digest(0), SIZE, lambda out: out.write(content(0)), "shard 0")
    assert kept is not None and not os.path.exists(kept + ".lock")  # the fetch removed its lock file
    Path(kept + ".lock").touch()  # as a killed fetch leaves it
    orphan = tmp_path / f"{digest(1)}-{SIZE}.shard.lock"
    orphan.touch()
    held = tmp_path / f"{digest(2)}-{SIZE}.shard.lock"
    stale, fresh = tmp_path / ".tmp-dead", tmp_path / ".tmp-live"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    import fcntl

    with open(held, "a+b") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a fetch in progress
        assert cache.prune() == 2
    assert not orphan.exists() and not stale.exists()
    assert held.exists() and fresh.exists() and os.path.exists(kept) and os.path.exists(kept + ".lock")
    cache.discard(digest(0), SIZE)
    assert not os.path.exists(kept) and not os.path.exists(kept + ".lock")


@pytest.mark.parametrize("missing", [True, False])
def test_prune_of_a_cache_that_is_not_there_or_empty(tmp_path: Path, missing: bool) -> None:
    directory = tmp_path / "cache"
    if not missing:
        directory.mkdir()
    assert ShardCache(str(directory), SIZE).prune() == 0


def test_the_cache_command_prunes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path))
    cache = ShardCache(str(tmp_path / "shards"), 10 * SIZE)
    for number in range(3):
        assert (
            cache.fill(digest(number), SIZE, lambda out, n=number: out.write(content(n)), "shard") is not None
        )
    orphan = tmp_path / "shards" / f"{digest(9)}-{SIZE}.shard.lock"
    orphan.touch()
    assert main(["cache"]) == 0 and orphan.exists()
    assert "3 shards" in capsys.readouterr().out
    assert main(["cache", "--prune", "--max-bytes", str(SIZE)]) == 0
    assert "1 shards" in capsys.readouterr().out
    assert not orphan.exists()
    assert list((tmp_path / "shards").glob("*.lock")) == []  # each fetch removed its own


def test_a_live_fetch_s_reservation_is_counted_and_a_dead_one_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch under way reserves its shard's bytes (a temporary file named with the size, made while it holds
    the shard's lock): another fill counts them and waits for room, then reads remotely; a reservation whose
    fetch died (its lock free) is removed by the next fill."""
    import fcntl

    from shardio.reading import cache as cache_module

    monkeypatch.setattr(cache_module, "ROOM_WAIT_S", 0.2)
    cache = ShardCache(str(tmp_path), 2 * SIZE)
    reservation = tmp_path / f".tmp-abcdefgh-{digest(0)}-{2 * SIZE}.fill"
    reservation.write_bytes(b"")
    lock = tmp_path / f"{digest(0)}-{2 * SIZE}.shard.lock"
    with open(lock, "a+b") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # shard 0's fetch is under way: its 2 * SIZE bytes are taken
        assert cache.fill(digest(1), SIZE, lambda out: out.write(content(1)), "shard 1") is None
        assert reservation.exists()
    # its fetch died (the lock is free, its file left behind): the reservation goes, the fill gets its room
    assert cache.fill(digest(1), SIZE, lambda out: out.write(content(1)), "shard 1") is not None
    assert not reservation.exists()
    assert cache.used_bytes() == SIZE
