"""Reader details: stream-codec shards read in shuffled order decompress each shard once."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from datasets import make_uneven_dataset

from shardio.indexer import build_index
from shardio.reader import Reader


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
        assert got == {ext: bytes(v) for ext, v in expected.members(plain.keys.index(index.keys[sample])).items()}
    assert sorted(reader._streams) == [0, 1, 2]  # every shard decompressed once and kept
    small = Reader(index, stream_cache_bytes=1)
    for sample in order.tolist():
        small.members(sample)
    assert len(small._streams) == 1  # the byte bound keeps only the latest shard
