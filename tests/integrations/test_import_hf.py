"""Hugging Face datasets as pack inputs: real datasets written by the ``datasets`` library (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus
from sample_shards import tar_members

from shardio import Index
from shardio.errors import InputError
from shardio.packing.corpus import detect_kind, read_corpus
from shardio.packing.engines import pack_partitioned
from shardio.packing.pack import pack

pytest.importorskip("pyarrow")


def build(paths: list[Path], root: Path) -> None:
    """Write the Hugging Face datasets the tests pack: a saved dataset, Parquet shards, paths, a bad row."""
    datasets = pytest.importorskip("datasets")
    rows = {
        "audio": [{"bytes": p.read_bytes(), "path": p.name} for p in paths],
        "sentence": [f"words {i}" for i in range(len(paths))],
        "speaker": [i % 3 for i in range(len(paths))],
        "id": [f"utt-{i:03d}" for i in range(len(paths))],
    }
    table = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())
    table.save_to_disk(str(root / "saved"))
    (root / "pq").mkdir()
    table.select(range(7)).to_parquet(str(root / "pq" / "train-00000.parquet"), batch_size=3)
    table.select(range(7, len(paths))).to_parquet(str(root / "pq" / "train-00001.parquet"), batch_size=3)
    by_path = {"audio": [str(p) for p in paths[:3]], "text": ["a", "b", "c"]}
    datasets.Dataset.from_dict(by_path).cast_column("audio", datasets.Audio()).to_parquet(
        str(root / "paths.parquet")
    )
    bad = {"audio": [{"bytes": b"RIFF....WAVEnot audio", "path": "bad.wav"}], "text": ["x"]}
    datasets.Dataset.from_dict(bad).cast_column("audio", datasets.Audio()).to_parquet(
        str(root / "bad.parquet")
    )


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("audio")
    return make_folder_corpus(root, 12, formats=("wav", "flac", "ogg"), subdirs=1, seed=9)


@pytest.fixture(scope="module")
def hf(audio: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    build(audio, root)
    return root


def check(out: Path, audio: list[Path]) -> None:
    found = tar_members(out)
    for i, path in enumerate(audio):
        ext = path.suffix[1:]
        assert found[f"utt-{i:03d}.{ext}"] == path.read_bytes()  # bytes copied as they are
        meta = json.loads(found[f"utt-{i:03d}.json"])
        assert meta["text"] == meta["sentence"] == f"words {i}" and meta["speaker"] == i % 3


def test_saved_dataset_packs_with_its_bytes_and_columns(audio: list[Path], hf: Path, tmp_path: Path) -> None:
    assert detect_kind(hf / "saved") == "hf"
    summary = pack(hf / "saved", tmp_path / "out", samples_per_shard=5, progress=False)
    assert summary.samples == len(audio)
    check(tmp_path / "out", audio)


def test_parquet_files_pack_alike_whatever_the_engine(audio: list[Path], hf: Path, tmp_path: Path) -> None:
    pack(hf / "pq", tmp_path / "plain", samples_per_shard=4, progress=False)
    check(tmp_path / "plain", audio)
    one, two = tmp_path / "one", tmp_path / "two"
    pack_partitioned(hf / "pq", one, partition_bytes=15_000, samples_per_shard=4, progress=False)
    pack_partitioned(hf / "pq", two, workers=2, partition_bytes=15_000, samples_per_shard=4, progress=False)
    check(one, audio)
    assert len(Index.load(one).shards) > 2
    assert {p.name: p.read_bytes() for p in one.iterdir()} == {p.name: p.read_bytes() for p in two.iterdir()}


def test_paths_without_bytes_name_files_and_bad_rows_are_listed(
    audio: list[Path], hf: Path, tmp_path: Path
) -> None:
    sources = list(read_corpus(hf / "paths.parquet"))
    assert [s.audio_path for s in sources] == [str(p) for p in audio[:3]] and not sources[0].member
    with pytest.raises(InputError, match=r"bad\.parquet:audio/0/audio\.wav"):
        pack(hf / "bad.parquet", tmp_path / "out", progress=False)
