"""The demo end to end: synthetic corpus -> pack -> read back, on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardio.cli.demo import CORPUS_DIR, DATASET_DIR, _read_back, run_demo
from shardio.errors import OptionError
from shardio.reading.reader import Reader
from shardio.shards.index import Index


def test_demo_packs_and_reads_back(tmp_path: Path) -> None:
    summary = run_demo(tmp_path, num_files=12)
    dataset = tmp_path / DATASET_DIR
    assert summary["files"] == 12 and summary["read_back_samples"] == 12
    assert summary["shards"] == 1 and summary["read_back_batches"] >= 2
    assert summary["resumed_at_batch"] == summary["read_back_batches"] // 2
    assert summary["dataset_dir"] == str(dataset) and summary["corpus_dir"] == str(tmp_path / CORPUS_DIR)
    assert summary["bytes"] == sum(p.stat().st_size for p in dataset.glob("shard-*.tar.zst"))
    json.dumps(summary)  # plain values only
    index = Index.load(dataset)
    assert len(index) == 12
    assert abs(summary["hours"] - index.total_duration / 3600) < 1e-9
    assert sorted(index.keys) == sorted(f"spk{n % 4:02d}/spk{n % 4:02d}_{n:04d}" for n in range(12))
    reader = Reader(index)
    members = reader.members(0)
    reader.close()
    key = index.keys[0]
    transcript = (tmp_path / CORPUS_DIR / f"{key}.txt").read_text(encoding="utf-8")
    assert json.loads(bytes(members["json"]))["text"] == transcript


def test_demo_runs_again_in_the_same_place(tmp_path: Path) -> None:
    run_demo(tmp_path, num_files=8)
    (tmp_path / DATASET_DIR / "notes.txt").write_text("mine")
    summary = run_demo(tmp_path, num_files=5)
    assert summary["files"] == 5 and summary["read_back_samples"] == 5
    assert len(Index.load(tmp_path / DATASET_DIR)) == 5
    assert len(list((tmp_path / CORPUS_DIR).rglob("*.wav"))) == 5
    assert (tmp_path / DATASET_DIR / "notes.txt").read_text() == "mine"  # only the demo's own files go


def test_read_back_uses_workers_and_resumes(tmp_path: Path) -> None:
    run_demo(tmp_path, num_files=3)
    read = _read_back(tmp_path / DATASET_DIR, workers=2)
    assert read["samples"] == read["distinct_samples"] == 3


@pytest.mark.parametrize("kwargs", [{"num_files": 0}, {"workers": -1}])
def test_demo_bad_options(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(OptionError):
        run_demo(tmp_path, **kwargs)
