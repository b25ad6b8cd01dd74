"""The node-local shard cache: whole shards fetched once per node, shared by concurrent workers, bounded in
bytes with plan-aware eviction, damaged entries fetched again, a full disk handled."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from remote_servers import HTTPFileServer, serve_copy
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Index, Ordering, Reading, ShardDataset
from shardio.reading import remotereads
from shardio.reading.cache import ShardCache


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Index:
    return make_uneven_dataset(
        tmp_path_factory.mktemp("cache") / "ds", [6, 5, 7, 4], compression="zstd", duration_range=(0.02, 0.05)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, local: Index) -> Iterator[HTTPFileServer]:
    with serve_copy(local.root, tmp_path_factory.mktemp("cache-http")) as http:
        yield http


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    return tmp_path / "node" / "shards"


def keys_of(batches: list[dict]) -> list[list[str]]:
    return [list(batch["keys"]) for batch in batches]


def shard_gets(server: HTTPFileServer) -> int:
    return server.faults.count("shard-", "GET")


def test_two_workers_fetch_each_shard_once_then_read_locally(
    server: HTTPFileServer, local: Index, cache_dir: Path
) -> None:
    expected = keys_of(list(ShardDataset(local.root, batch_size=3, seed=2)))
    total = sum(s.bytes for s in local.shards)
    server.faults.clear()
    dataset = ShardDataset(f"{server.url}/ds", batch_size=3, seed=2, reading=Reading(cache_bytes=10 * total))
    assert keys_of(list(DataLoader(dataset, batch_size=None, num_workers=2))) == expected
    cached = sorted(cache_dir.glob("*.shard"))
    assert sorted(p.name for p in cached) == sorted(f"{s.sha256}-{s.bytes}.shard" for s in local.shards)
    fetched = shard_gets(server)
    assert fetched <= 2 * len(local.shards)  # whole shards, each once (an HTTP GET may be split in two)
    again = ShardDataset(f"{server.url}/ds", batch_size=3, seed=2, reading=Reading(cache_bytes=10 * total))
    assert keys_of(list(DataLoader(again, batch_size=None, num_workers=2))) == expected
    assert shard_gets(server) == fetched  # a warm cache: no shard bytes from the server


def test_eviction_keeps_the_cache_within_its_bytes(
    server: HTTPFileServer, local: Index, cache_dir: Path
) -> None:
    largest = max(s.bytes for s in local.shards)
    budget = 2 * largest
    expected = keys_of(list(ShardDataset(local.root, batch_size=2, ordering=Ordering(shuffle_shards=1))))
    dataset = ShardDataset(
        f"{server.url}/ds",
        batch_size=2,
        ordering=Ordering(shuffle_shards=1),
        reading=Reading(cache_bytes=budget, read_ahead=1),
    )
    assert keys_of(list(dataset)) == expected
    cache = ShardCache(str(cache_dir), budget)
    assert 0 < cache.used_bytes() <= budget


def test_eviction_prefers_least_recently_scheduled(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 300)
    names = {n: tmp_path / f"{n:064x}-100.shard" for n in range(3)}
    for n, path in names.items():
        path.write_bytes(b"x" * 100)
        os.utime(path, ns=(n * 10**9, n * 10**9))
    # an entry the plan is about to read is touched and survives; the oldest untouched one goes
    cache.touch(f"{0:064x}", 100)
    cache.evict(100)
    assert names[0].exists() and not names[1].exists() and names[2].exists()


def test_a_damaged_entry_is_fetched_again(server: HTTPFileServer, local: Index, cache_dir: Path) -> None:
    expected = keys_of(list(ShardDataset(local.root, batch_size=4, seed=5)))
    options = dict(batch_size=4, seed=5, reading=Reading(cache_bytes=1 << 30))
    assert keys_of(list(ShardDataset(f"{server.url}/ds", **options))) == expected
    entry = cache_dir / f"{local.shards[1].sha256}-{local.shards[1].bytes}.shard"
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a zstd frame: its checksum fails
    entry.write_bytes(bytes(data))
    before = shard_gets(server)
    assert keys_of(list(ShardDataset(f"{server.url}/ds", **options))) == expected
    assert shard_gets(server) > before and entry.read_bytes() != bytes(data)


def test_a_fetch_that_does_not_match_the_index_is_not_kept(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 1 << 20)
    with pytest.raises(Exception, match="changed after indexing"):
        cache.fill("0" * 64, 4, lambda out: out.write(b"abcd"), "shard x")
    assert not list(tmp_path.glob("*.shard")) and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("where", ["cache", "download"])
def test_a_full_disk_falls_back_to_remote_ranges(
    server: HTTPFileServer, local: Index, cache_dir: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The disk is full when the cache makes room, or fills half way through the download itself: either is
    the cache's to handle (read by ranges), not a ReadError out of the retries around the download."""

    def no_room(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def half_then_full(
        fs: object, path: str, out: BinaryIO, bound: int, size: int | None = None, pin: object = None
    ) -> int:
        out.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "cache":
        monkeypatch.setattr(ShardCache, "_fetch_into", no_room)
    else:
        monkeypatch.setattr(remotereads, "copy_capped", half_then_full)
    expected = keys_of(list(ShardDataset(local.root, batch_size=4)))
    dataset = ShardDataset(f"{server.url}/ds", batch_size=4, reading=Reading(cache_bytes=1 << 30))
    assert keys_of(list(dataset)) == expected
    assert not list(cache_dir.glob("*.shard")) and dataset.stats.requests > 0


def test_an_entry_evicted_between_its_fetch_and_its_open_is_fetched_again(
    server: HTTPFileServer, local: Index, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may evict a shard just filled before this reader opens it (a small cache filled by many
    readers at once): that was "the shard file is missing", the shard then broken for the epoch."""
    fill = ShardCache.fill
    evicted: list[str] = []

    def fill_then_evicted(self: ShardCache, *args: Any) -> str | None:
        path = fill(self, *args)
        if path is not None and not evicted:
            evicted.append(path)
            os.unlink(path)  # as another process's eviction would, at the worst moment
        return path

    monkeypatch.setattr(ShardCache, "fill", fill_then_evicted)
    expected = keys_of(list(ShardDataset(local.root, batch_size=4, seed=5)))
    dataset = ShardDataset(
        f"{server.url}/ds", batch_size=4, seed=5, reading=Reading(cache_bytes=1 << 30, read_ahead=0)
    )
    assert keys_of(list(dataset)) == expected
    assert evicted and os.path.exists(evicted[0])  # fetched again
