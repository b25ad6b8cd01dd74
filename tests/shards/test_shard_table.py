"""The shard table is columnar (issue 18): it round-trips every field, keeps index files byte-identical,
refuses malformed entries by field, and a dataset pickled for spawn/forkserver workers does not
grow with the shards."""

from __future__ import annotations

import copy
import json
import multiprocessing
import pickle
import shutil
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch.multiprocessing  # noqa: F401  (registers the shared-memory reductions DataLoader uses)
from hostile import rewrite_header
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Index, ShardDataset, ShardInfo
from shardio.datasets.mixed import MixedDataset
from shardio.errors import FormatError
from shardio.planning.mixoptions import EpochSize
from shardio.runtime.sharing import shared_table
from shardio.shards.keys import Keys
from shardio.shards.shardtable import CODECS, ShardTable

SHARDS = [
    ShardInfo("a.tar", 10, "ab" * 32, 3, 1.25, "none"),
    ShardInfo("sub/\udcff\u00e9.tar.zst", 2**40, "", 0, 0.0, "zstd"),
    ShardInfo("c.tar.gz", 0, "x", 7, float("inf"), "gzip"),
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("table") / "ds"
    make_uneven_dataset(root, [4, 3, 5], compression="zstd")
    return root


def test_the_table_round_trips_every_field() -> None:
    table = ShardTable.of(SHARDS)
    assert len(table) == 3 and list(table) == SHARDS and table == SHARDS and table[-1] == SHARDS[2]
    assert table[1:] == SHARDS[1:] and [table.codec_of(i) for i in range(3)] == [s.codec for s in SHARDS]
    assert [table.bytes_of(i) for i in range(3)] == [s.bytes for s in SHARDS]
    assert table.names() == [s.name for s in SHARDS] and table.sha256_of(0) == "ab" * 32
    assert table.entries() == [s.__dict__ for s in SHARDS]
    for copied in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table), ShardTable.of(table.entries())):
        assert copied == table and copied.carriers is None
    assert ShardTable.of([]) == [] and len(ShardTable.of([])) == 0
    with pytest.raises(IndexError):
        table[3]


def test_the_shared_table_pickles_by_handle_and_by_value() -> None:
    table = ShardTable.of(SHARDS)
    shared = shared_table(table)
    assert shared == table and shared.carriers is not None and shared_table(shared) is shared
    assert pickle.loads(pickle.dumps(shared)) == table and copy.deepcopy(shared) == table
    received = ForkingPickler.loads(bytes(ForkingPickler.dumps(shared)))
    assert received == table and received.carriers is not None


def test_an_index_loads_saves_byte_identically_and_reads(dataset: Path, tmp_path: Path) -> None:
    before = {name: (dataset / name).read_bytes() for name in ("index.json", "index.columns")}
    index = Index.load(dataset)
    assert isinstance(index.shards, ShardTable) and [s.samples for s in index.shards] == [4, 3, 5]
    assert {s.codec for s in index.shards} == {"zstd"}
    fingerprint = index.fingerprint
    assert index.content_id == fingerprint  # the same header as the list of ShardInfo made
    as_list = Index(
        root=index.root,
        shards=list(index.shards),
        formats=index.formats,
        columns=index.columns,
        columns_sha256=index.columns_sha256,
        _keys=index.keys,
    )
    assert as_list.shards == index.shards and as_list.content_id == fingerprint
    copy_dir = tmp_path / "copy"
    shutil.copytree(dataset, copy_dir)
    index.save(str(copy_dir), keep_fingerprint=True)
    assert {name: (copy_dir / name).read_bytes() for name in before} == before
    index.save(str(copy_dir))
    assert index.fingerprint == fingerprint and (copy_dir / "index.json").read_bytes() == before["index.json"]
    keys = [key for batch in ShardDataset(dataset, batch_size=4, shuffle=False) for key in batch["keys"]]
    assert sorted(keys) == sorted(index.keys)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bytes", -1, "bytes must be a non-negative integer"),
        ("samples", "3", "samples must be a non-negative"),
        ("bytes", 2**63, "bytes must be below 2\\*\\*63"),
        ("name", "", "is not a file name"),
        ("name", 7, "is not a file name"),
        ("codec", 3, "codec must be a string"),
        ("codec", "lz4", "has unknown codec 'lz4'"),
        ("duration", "1.0", "duration must be a number"),
        ("sha256", None, "sha256 must be a string"),
        ("extra", 1, "a shard entry has fields"),
    ],
)
def test_malformed_shard_entries_are_format_errors_naming_the_field(
    dataset: Path, tmp_path: Path, field: str, value: object, message: str
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    rewrite_header(root, lambda header: header["shards"][1].update({field: value}))
    with pytest.raises(FormatError, match=message):
        Index.load(root)


def test_a_missing_field_or_a_wrong_count_is_a_format_error(dataset: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    rewrite_header(root, lambda header: header["shards"][0].pop("sha256"))
    with pytest.raises(FormatError, match="missing or malformed field .*a shard entry has fields"):
        Index.load(root)
    rewrite_header(
        root, lambda header: header.update(shards=json.loads((dataset / "index.json").read_text())["shards"])
    )
    rewrite_header(root, lambda header: header["shards"][2].update(samples=4))
    with pytest.raises(FormatError, match="shard shard-000002.tar.zst lists 4 samples, the columns hold 5"):
        Index.load(root)
    with pytest.raises(FormatError, match="unknown codec 'x'"):
        Index(root="r", shards=[ShardInfo("a.tar", 1, "", 0, 0.0, "x")], formats=[], columns={})


def synthetic(root: Path, one: Index, count: int) -> Index:
    """An index of ``count`` copies of ``one``'s single shard (names only; no file is read), as
    benchmarks/scale.py builds its large ones."""
    shard = one.shards[0]
    columns = {name: np.tile(np.asarray(column), count) for name, column in one.columns.items()}
    columns["shard"] = np.repeat(np.arange(count, dtype=np.uint32), shard.samples)
    blob = bytes(one.keys.blob) * count
    ends = (
        np.arange(count, dtype=np.uint64)[:, None] * np.uint64(len(one.keys.blob))
        + np.asarray(one.keys.ends)[None, :]
    ).ravel()
    shards = [
        ShardInfo(f"shard-{i:06d}.tar", shard.bytes, shard.sha256, shard.samples, shard.duration)
        for i in range(count)
    ]
    return Index(
        root=str(root), shards=shards, formats=list(one.formats), columns=columns, _keys=Keys(blob, ends)
    )


def test_a_dataset_pickled_for_workers_does_not_grow_with_the_shards(tmp_path: Path) -> None:
    one = make_uneven_dataset(tmp_path / "one", [2])
    sizes = {}
    for count in (10, 2000):
        index = synthetic(tmp_path / f"n{count}", one, count)
        Path(index.root).mkdir()
        index.save()
        dataset = ShardDataset(Index.load(index.root), batch_size=2)
        dataset.set_epoch(0)
        sizes[count] = len(ForkingPickler.dumps(dataset))
        assert dataset.index.shards.carriers is not None
    assert sizes[2000] < sizes[10] + 1024, sizes
    assert len(pickle.dumps(dataset)) > 2000 * 100  # a plain pickle: by value (the table's arrays)


def test_a_mix_pickled_for_workers_shares_every_table(tmp_path: Path) -> None:
    sources = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    make_uneven_dataset(sources["a"], [2, 2])
    make_uneven_dataset(sources["b"], [3], seed=1)
    mix = MixedDataset(sources, {"a": 1.0, "b": 1.0}, EpochSize(primary="a"), batch_size=2)
    ForkingPickler.dumps(mix)
    assert mix.index.shards.carriers is not None and all(
        p.shards.carriers is not None for p in mix.index.parts
    )
    received = pickle.loads(bytes(ForkingPickler.dumps(mix)))
    assert received.index.shards == mix.index.shards and received.index.table.name(0).endswith(
        "shard-000000.tar"
    )


def test_a_dataloader_with_forkserver_workers_reads_the_right_samples(dataset: Path) -> None:
    expected = [list(batch["keys"]) for batch in ShardDataset(dataset, batch_size=3, seed=2)]
    loader = DataLoader(
        ShardDataset(dataset, batch_size=3, seed=2),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=multiprocessing.get_context("forkserver"),
    )
    got = [list(batch["keys"]) for batch in loader]
    assert sorted(map(tuple, got)) == sorted(map(tuple, expected)) and len(got) == len(expected)
    assert CODECS[0] == "none"
