"""Reader details: stream-codec shards read in shuffled order decompress each shard once; local shards read
without a memory map give the same batches."""

from __future__ import annotations

import gc
import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_shards import make_uneven_dataset

import shardio.storage.localshard
from shardio import ShardDataset
from shardio.packing.indexer import build_index
from shardio.reading.reader import Reader


def test_shuffled_reads_of_gzip_shards_decompress_each_shard_once(tmp_path: Path) -> None:
    plain = make_uneven_dataset(tmp_path / "plain", [6, 9, 4], seed=3)
    gz_dir = tmp_path / "gz"
    gz_dir.mkdir()
    for shard in plain.shards:
        data = (tmp_path / "plain" / shard.name).read_bytes()
        (gz_dir / (shard.name + ".gz")).write_bytes(gzip.compress(data, mtime=0))
    index = build_index(sorted(str(p) for p in gz_dir.glob("*.tar.gz")))
    assert {s.codec for s in index.shards} == {"gzip"}
    order = np.random.default_rng(0).permutation(len(index))
    reader, expected = Reader(index), Reader(plain)
    for sample in order.tolist():
        got = {ext: bytes(v) for ext, v in reader.members(sample).items()}
        assert got == {
            ext: bytes(v) for ext, v in expected.members(plain.keys.index(index.keys[sample])).items()
        }
    assert sorted(reader._streams) == [0, 1, 2]  # every shard decompressed once and kept
    small = Reader(index, stream_cache_bytes=1)
    for sample in order.tolist():
        got = {ext: bytes(v) for ext, v in small.members(sample).items()}
        assert got == {
            ext: bytes(v) for ext, v in expected.members(plain.keys.index(index.keys[sample])).items()
        }
    assert (
        not small._streams
    )  # every shard spans more than the bound: read a sample's span at a time, not kept


def _no_mmap(*args: object, **kwargs: object) -> None:
    raise OSError("this file system cannot map files")


@pytest.mark.parametrize("why", ["kernel", "file system"])
def test_reads_without_a_memory_map_give_the_same_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """Where the kernel cannot populate a map (old Linux, other systems), or a file system cannot map a file,
    ranges are read instead. A batch may hold every sample's bytes before it decodes any, so no read may reuse
    another's buffer."""
    index = make_uneven_dataset(tmp_path / "ds", [5, 7, 4], seed=4)
    mapped = list(ShardDataset(index.root, batch_size=4, seed=1))
    if why == "kernel":
        monkeypatch.setattr(shardio.storage.localshard, "CAN_MAP", False)
    else:
        monkeypatch.setattr(shardio.storage.localshard.mmap, "mmap", _no_mmap)
    dataset = ShardDataset(index.root, batch_size=4, seed=1)
    read = list(dataset)
    assert dataset._reader is not None
    assert not any(handle._mapping for handle in dataset._reader._handles.values())
    assert [b["keys"] for b in read] == [b["keys"] for b in mapped]
    for got, expected in zip(read, mapped):
        assert torch.equal(got["audio"], expected["audio"]) and got["text"] == expected["text"]


def _open_fds() -> set[int]:
    gc.collect()
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
@pytest.mark.parametrize("compression", ["none", pytest.param("zstd", marks=pytest.mark.slow)])
def test_a_dataset_dropped_without_closing_leaves_no_shard_open(tmp_path: Path, compression: str) -> None:
    """A dataset made per validation run and dropped: each once held one descriptor per shard it read,
    until the process ran out of them (EMFILE at a soft limit of 1,024 after ~50 runs of 20 shards)."""
    data = make_uneven_dataset(tmp_path / "d", [3] * 12, compression=compression)
    before = _open_fds()
    for _ in range(3):
        dataset = ShardDataset(data, batch_size=2)
        assert sum(len(batch["keys"]) for batch in dataset) == 36
        del dataset
    assert _open_fds() - before == set()
    reader = Reader(data)
    reader.members(0)
    reader.close()  # closing by hand and then collecting closes the descriptor once
    del reader
    assert _open_fds() - before == set()
