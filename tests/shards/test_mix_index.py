"""A mix's index chains its corpora's mapped columns (no concatenated copy), and pickles by reference."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import Index
from shardio.datasets.mixed import MixedDataset, MixIndex
from shardio.planning.mixoptions import EpochSize
from shardio.shards.chained import ChainedColumn
from shardio.shards.index import COLUMNS


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixindex")
    for seed, (name, sizes) in enumerate({"big": [9, 7, 5], "mid": [4], "tiny": [2, 1]}.items()):
        make_uneven_dataset(root / name, sizes, seed=seed, duration_range=(0.01, 0.03))
    return {name: str(root / name) for name in ("big", "mid", "tiny")}


def concatenated(indexes: dict[str, Index]) -> dict[str, np.ndarray]:
    """The columns as the mix numbers them: shards and formats renumbered, in corpus-name order."""
    formats: list[str] = []
    shards = 0
    parts = []
    for name in sorted(indexes):
        index = indexes[name]
        table = np.array(
            [
                formats.index(f) if f in formats else formats.append(f) or len(formats) - 1
                for f in index.formats
            ],
            dtype=np.uint8,
        )
        part = {column: np.asarray(values) for column, values in index.columns.items()}
        part["shard"] = (part["shard"] + shards).astype(np.uint32)
        part["format"] = table[part["format"]]
        shards += len(index.shards)
        parts.append(part)
    return {column: np.concatenate([part[column] for part in parts]) for column in COLUMNS}


def test_a_mix_index_reads_the_corpora_columns_in_place(sources: dict[str, str]) -> None:
    indexes = {name: Index.load(root) for name, root in sources.items()}
    mix = MixIndex.combine(indexes)
    expected = concatenated(indexes)
    assert len(mix) == 28 and list(mix.keys) == [k for n in sorted(indexes) for k in indexes[n].keys]
    for column, values in expected.items():
        chained = mix.columns[column]
        assert isinstance(chained, ChainedColumn) and chained.dtype == values.dtype
        assert [
            np.shares_memory(part, indexes[name].columns[column])  # views of the mapped files, not copies
            for part, name in zip(chained.parts, sorted(indexes))
        ] == [True] * 3
        assert np.array_equal(np.asarray(chained), values) and np.array_equal(
            chained[np.arange(27, -1, -3)], values[27::-3]
        )
        assert [chained[i] for i in range(28)] == values.tolist() and chained[-1] == values[-1]
    assert np.array_equal(mix.durations, np.concatenate([indexes[n].durations for n in sorted(indexes)]))
    assert np.array_equal(mix.columns["shard"] == 3, expected["shard"] == 3)
    with pytest.raises(IndexError):
        mix.columns["shard"][28]


def test_a_pickled_mix_carries_its_corpora_by_reference(sources: dict[str, str], tmp_path: Path) -> None:
    small = MixIndex.combine({name: Index.load(root) for name, root in sources.items()})
    big_root = make_uneven_dataset(tmp_path / "bigger", [400, 400], duration_range=(0.01, 0.02)).root
    bigger = MixIndex.combine(
        {**{name: Index.load(root) for name, root in sources.items()}, "big": Index.load(big_root)}
    )
    # 779 more samples: 34 bytes a sample more if the columns travelled (the shard table grows by one entry)
    assert len(pickle.dumps(bigger)) - len(pickle.dumps(small)) < 2000
    again = pickle.loads(pickle.dumps(bigger))
    assert all(np.array_equal(np.asarray(again.columns[c]), np.asarray(bigger.columns[c])) for c in COLUMNS)
    assert list(again.keys) == list(bigger.keys)


def test_a_mixed_dataset_plays_the_same_batches_after_a_pickle(sources: dict[str, str]) -> None:
    dataset = MixedDataset(
        sources, {"big": 0.5, "mid": 0.3, "tiny": 0.2}, EpochSize(primary="big"), batch_size=3, seed=2
    )
    again = pickle.loads(pickle.dumps(dataset))
    assert [(b["keys"], b["corpus"]) for b in again] == [(b["keys"], b["corpus"]) for b in dataset]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=4), data=st.data())
def test_a_chained_column_indexes_as_its_concatenation(sizes: list[int], data: st.DataObject) -> None:
    parts = [np.arange(10 * c, 10 * c + n, dtype=np.uint32) for c, n in enumerate(sizes)]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    shifts = [100 * c for c in range(len(sizes))]
    column = ChainedColumn(parts, offsets, np.uint32, shifts=shifts)
    whole = np.concatenate([p + s for p, s in zip(parts, shifts)]).astype(np.uint32)
    total = int(offsets[-1])
    ids = np.array(
        data.draw(st.lists(st.integers(-total, total - 1), max_size=12) if total else st.just([])),
        dtype=np.int64,
    )
    assert np.array_equal(column[ids], whole[ids]) and column[ids].dtype == np.uint32
    assert [column[int(i)] for i in ids] == whole[ids].tolist()
    assert np.array_equal(np.asarray(column), whole) and len(column) == total
