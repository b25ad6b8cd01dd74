"""The format-2 index: columns and keys mapped read-only from one file, checked cheaply in every process
and hashed once at load; format-1 indexes still read and upgrade with the same fingerprint."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hostile import to_format1
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_servers import HTTPFileServer
from sample_shards import make_uneven_dataset

from shardio import FormatError, Index, ShardDataset
from shardio.cli import main
from shardio.shards.index import COLUMNS
from shardio.shards.indexfile import ColumnsFile, encode
from shardio.shards.keys import Keys


@pytest.fixture
def dataset(tmp_path: Path) -> Index:
    return make_uneven_dataset(tmp_path / "ds", [5, 3, 4], seed=1)


def _owner(array: np.ndarray) -> object:
    """What finally holds an array's bytes: the end of its chain of bases (a memoryview's object)."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_columns_and_keys_are_read_only_views_of_one_map(dataset: Index) -> None:
    index = Index.load(dataset.root)
    for name, column in index.columns.items():
        assert np.array_equal(column, dataset.columns[name]) and column.dtype == np.dtype(COLUMNS[name])
        assert not column.flags.writeable and not column.flags.owndata
        assert isinstance(_owner(column), mmap.mmap), name
    assert isinstance(index.keys, Keys) and isinstance(index.keys.blob, mmap.mmap)
    assert index.keys == dataset.keys == list(dataset.keys)
    assert index.key(6) == dataset.keys[6] == "s001_00001"
    assert index.lookup("s002_00003") == 11 and index.keys.index("s000_00000") == 0
    with pytest.raises(KeyError):
        index.lookup("s002_0000")  # a prefix of a key is not a key
    assert index.fingerprint == dataset.fingerprint


def test_pickled_index_refers_to_its_file(tmp_path: Path) -> None:
    big = make_uneven_dataset(tmp_path / "big", [400, 400], duration_range=(0.01, 0.02))
    index = Index.load(big.root)
    pickled = pickle.dumps(index)
    assert len(pickled) < 4000 < os.path.getsize(os.path.join(big.root, "index.columns"))
    again = pickle.loads(pickled)
    assert again.keys == index.keys and all(
        np.array_equal(again.columns[n], c) for n, c in index.columns.items()
    )
    other = make_uneven_dataset(tmp_path / "other", [400, 400], seed=5, duration_range=(0.01, 0.02))
    shutil.copyfile(os.path.join(other.root, "index.columns"), os.path.join(big.root, "index.columns"))
    unpickled = pickle.loads(
        pickled
    )  # a worker maps the file again: the header check refuses another index's
    with pytest.raises(
        FormatError, match="do not belong together"
    ):  # file, at its first use (see Unreadable)
        len(unpickled)


@pytest.mark.parametrize("damage", ["flip", "truncate", "grow"])
def test_damaged_columns_file_is_refused(dataset: Index, damage: str) -> None:
    path = Path(dataset.root, "index.columns")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[4096 + 3] ^= 0x40  # in the first column: only the full hash at load sees it
    elif damage == "truncate":
        del data[-1:]
    else:
        data += b"\0" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="do not belong together or one is damaged"):
        Index.load(dataset.root)


def test_hostile_header_counts_are_refused_without_allocating(dataset: Index) -> None:
    path = Path(dataset.root, "index.json")
    header = json.loads(path.read_text())
    for field, value in [
        ("samples", 10**15),
        ("keys_bytes", 2**62),
        ("samples", -1),
        ("keys_bytes", "12"),
        ("columns_sha256", "00" * 31),
    ]:
        path.write_text(json.dumps({**header, field: value}))
        with pytest.raises(FormatError):
            Index.load(dataset.root)


def test_format1_index_reads_and_upgrades_with_the_same_fingerprint(
    dataset: Index, capsys: pytest.CaptureFixture[str]
) -> None:
    to_format1(Path(dataset.root))
    old = Index.load(dataset.root)
    assert old.keys == dataset.keys
    assert all(np.array_equal(old.columns[n], c) for n, c in dataset.columns.items())
    state_ds = ShardDataset(dataset.root, batch_size=2)  # a state saved on the format-1 index
    batches = iter(state_ds)
    next(batches)
    state = state_ds.state_dict()
    assert main(["index", "--upgrade", dataset.root]) == 0
    assert "1 -> 2" in capsys.readouterr().out
    assert sorted(p.name for p in Path(dataset.root).glob("index.*")) == ["index.columns", "index.json"]
    new = Index.load(dataset.root)  # its kept fingerprint checks, through the fields the upgrade records
    assert new.fingerprint == old.fingerprint and new.keys == dataset.keys and new._file is not None
    assert json.loads(Path(dataset.root, "index.json").read_text())["upgraded_from"]["version"] == 1
    resumed = ShardDataset(dataset.root, batch_size=2)
    resumed.load_state_dict(state)  # a state saved on the format-1 index resumes on the upgraded one
    assert [b["keys"] for b in resumed] == [b["keys"] for b in batches]


def test_remote_index_is_fetched_once_per_node(dataset: Index, node_cache: Path) -> None:
    with HTTPFileServer(dataset.root) as server:
        first = Index.load(server.url)
        fetched = server.faults.count("index.columns", "GET")
        second = Index.load(server.url)
        assert server.faults.count("index.columns", "GET") == fetched > 0
    assert first.keys == second.keys == dataset.keys and first.root == server.url
    cached = list(node_cache.glob("index-*.columns"))
    assert cached and all(Path(first._file.path) != Path(dataset.root, "index.columns") for _ in [0])
    assert pickle.loads(pickle.dumps(first)).keys == dataset.keys


KEY = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(KEY, max_size=30))
def test_keys_blob_round_trip_and_lookup(tmp_path_factory: pytest.TempPathFactory, keys: list[str]) -> None:
    held = Keys.of(keys)
    columns = {name: np.zeros(len(keys), dtype) for name, dtype in COLUMNS.items()}
    payload, digest = encode(columns, COLUMNS, held)
    path = tmp_path_factory.mktemp("keys") / "index.columns"
    path.write_bytes(payload)
    mapped = ColumnsFile(str(path), COLUMNS, len(keys), len(held.blob), digest)
    mapped.verify()
    for view in (held, mapped.keys()):
        assert list(view) == keys and len(view) == len(keys) and view == keys
        for key in set(keys):
            assert view.find(key) == keys.index(key)
        for absent in ({k + "\x01" for k in keys} | {"\x02"}) - set(keys):
            assert view.find(absent) is None


def test_a_pickled_dataset_holds_its_ranks_plan_not_the_corpus(tmp_path: Path) -> None:
    from shardio import World

    sizes = {}
    for n in (200, 1600):
        root = make_uneven_dataset(tmp_path / f"n{n}", [n // 4] * 4, duration_range=(0.01, 0.02)).root
        dataset = ShardDataset(root, batch_size=4, world=World(rank=3, world_size=8))
        sizes[n] = len(pickle.dumps(dataset))
        again = pickle.loads(pickle.dumps(dataset))
        assert [b["keys"] for b in again] == [b["keys"] for b in dataset]
        assert [list(dataset.plan(0).batch(3, j)) for j in range(len(again))] == [
            list(again.plan(0).batch(3, j)) for j in range(len(again))
        ]
    # 1,400 more samples: about 1 KiB more of this rank's plan (ids as int32 and batch offsets); the index
    # alone would be 34 bytes a sample more, the whole plan 8 bytes a sample more
    assert sizes[1600] - sizes[200] < 1400 * 2


def test_the_full_hash_runs_once_per_file_per_node(dataset: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardio.shards import indexcache

    monkeypatch.setattr(
        indexcache, "SETTLED_S", 0.0
    )  # else a file changed in the last seconds is always hashed
    hashed = []
    original = ColumnsFile.verify
    monkeypatch.setattr(ColumnsFile, "verify", lambda self: hashed.append(1) or original(self))
    Index.load(dataset.root)
    Index.load(dataset.root)
    assert len(hashed) == 1  # the second load found the node's marker for this very file
    path = Path(dataset.root, "index.columns")
    data = bytearray(path.read_bytes())
    data[4096 + 3] ^= 0x40
    path.write_bytes(bytes(data))  # same size, same inode: its times differ
    with pytest.raises(FormatError, match="damaged"):
        Index.load(dataset.root)
    assert len(hashed) == 2


def test_prune_removes_index_files_unused_for_a_while(
    dataset: Index, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Markers and fetched columns files untouched for ``unused_for`` go (a load touches what it uses);
    temporary files of dead fetches go after ``stale``; a pruned marker only costs one more hash."""
    import os
    import time

    from shardio.shards import indexcache

    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(indexcache, "SETTLED_S", 0.0)
    Index.load(dataset.root)
    markers = list((tmp_path / "cache" / "verified").iterdir())
    assert len(markers) == 1
    old = time.time() - 3 * 86400
    os.utime(markers[0], (old, old))
    fetched, dead, fresh = (
        tmp_path / "cache" / n for n in ("index-ab.columns", ".tmp-x-index-ab.columns", "index-cd.columns")
    )
    for path in (fetched, dead, fresh):
        path.write_bytes(b"x")
    os.utime(fetched, (old, old))
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    Index.load(dataset.root)  # uses the marker: touched, so kept
    assert indexcache.prune(unused_for=86400, stale=3600) == 2
    assert markers[0].exists() and fresh.exists() and not fetched.exists() and not dead.exists()
    os.utime(markers[0], (old, old))
    assert indexcache.prune(unused_for=86400) == 1 and not markers[0].exists()
