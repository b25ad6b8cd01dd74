"""Remote corpora with ``Ordering(node_stable=True)`` and a decoded cache per node: a node downloads its part
of the corpus in the first epoch and no shard byte from the second on (two "nodes": ranks 0 and 1 of a
world of 2, one rank a node, each with its own cache directory, reading FLAC shards over HTTP on loopback).
Under the global shuffle the same caches miss: each epoch deals other samples to each node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardio import Ordering, Reading, ShardDataset, World
from tests.reading.test_decoded_cache import assert_identical, make_corpus
from tests.remote_servers import HTTPFileServer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("node") / "flac", "flac", count=40)  # 8 shards


def epoch(source: str | Path, number: int, rank: int, node_stable: bool, **options: Any) -> list[Any]:
    ordering = Ordering(shuffle_shards=2, node_stable=node_stable)
    dataset = ShardDataset(source, batch_size=4, seed=3, ordering=ordering, world=World(rank, 2), **options)
    dataset.set_epoch(number)
    return list(dataset)


@pytest.mark.parametrize("node_stable", [True, False])
def test_from_epoch_two_a_node_whose_cache_holds_its_part_downloads_no_shard(
    corpus: Path, tmp_path: Path, node_stable: bool
) -> None:
    with HTTPFileServer(str(corpus.parent)) as server:
        url = f"{server.url}/{corpus.name}"
        caches = [Reading(decoded_cache=str(tmp_path / f"node{rank}")) for rank in range(2)]
        for rank in range(2):  # epoch 1 on each node: its part downloaded once, into its own cache
            first = epoch(url, 0, rank, node_stable, reading=caches[rank])
            assert_identical(epoch(corpus, 0, rank, node_stable), first)
        assert server.faults.count(".tar") > 0
        for number in (1, 2):
            for rank in range(2):
                server.faults.clear()
                found = epoch(url, number, rank, node_stable, reading=caches[rank])
                assert_identical(epoch(corpus, number, rank, node_stable), found)  # the batches, bit for bit
                requests = server.faults.count(".tar")
                if node_stable:
                    assert requests == 0, f"node {rank} fetched shards in epoch {number + 1}"
                else:  # another part of the corpus every epoch: the node's cache misses
                    assert requests > 0


def test_with_the_shard_cache_a_node_fetches_its_shards_once(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with ``Reading(cache_bytes=...)``: whole shards kept on each node's disk."""
    with HTTPFileServer(str(corpus.parent)) as server:
        url = f"{server.url}/{corpus.name}"
        reading = Reading(cache_bytes=1 << 30)
        for number in range(3):
            for rank in range(2):
                monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / f"node{rank}"))
                server.faults.clear()
                found = epoch(url, number, rank, True, reading=reading)
                assert_identical(epoch(corpus, number, rank, True), found)
                fetched = server.faults.count(".tar", "GET")
                assert (fetched > 0) if number == 0 else (fetched == 0), (number, rank, fetched)
