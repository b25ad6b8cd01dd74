"""Lhotse corpora as pack inputs: CutSet manifests and Shar directories written by the ``lhotse`` package."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus
from sample_shards import tar_members

from shardio import Index
from shardio.packing.corpus import detect_kind
from shardio.packing.engines import pack_partitioned
from shardio.packing.pack import pack

BUILD = """
import json, sys
from lhotse import CutSet, Recording, SupervisionSegment

paths, root = json.loads(sys.argv[1]), sys.argv[2]
cuts = []
for i, path in enumerate(paths):
    recording = Recording.from_file(path)
    cut = recording.to_cut()
    cut.supervisions = [SupervisionSegment(id=f"{recording.id}-s", recording_id=recording.id, start=0,
                                           duration=recording.duration, text=f"words {i}",
                                           speaker=f"spk{i % 2}")]
    cuts.append(cut)
cuts.append(cuts[0].truncate(offset=0.05, duration=0.1).with_id("part"))
cutset = CutSet.from_cuts(cuts)
cutset.to_file(f"{root}/cuts.jsonl.gz")
cutset.to_shar(f"{root}/shar", fields={"recording": "flac"}, shard_size=3)
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    audio = make_folder_corpus(tmp_path_factory.mktemp("audio"), 7, subdirs=1, sample_rate=8000, seed=4)
    root = tmp_path_factory.mktemp("lhotse")
    (root / "shar").mkdir()
    result = subprocess.run(
        [sys.executable, "-c", BUILD, json.dumps([str(p) for p in audio]), str(root)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "No module named 'lhotse'" in result.stderr:
        pytest.skip("the lhotse package is not installed")
    assert result.returncode == 0, result.stderr[-2000:]
    return audio, root


def test_cutset_whole_cuts_keep_their_bytes_and_a_part_is_cut(
    corpus: tuple[list[Path], Path], tmp_path: Path
) -> None:
    audio, root = corpus
    assert detect_kind(root / "cuts.jsonl.gz") == "lhotse"
    pack(root / "cuts.jsonl.gz", tmp_path / "out", progress=False)
    found = tar_members(tmp_path / "out")
    for i, path in enumerate(audio):
        assert found[f"{path.stem}.wav"] == path.read_bytes()
        meta = json.loads(found[f"{path.stem}.json"])
        assert meta["text"] == f"words {i}" and meta["speaker"] == f"spk{i % 2}"
    index = Index.load(tmp_path / "out")
    part = index.keys.index("part")
    assert int(index.columns["num_frames"][part]) == 800 and "part.flac" in found  # 0.1 s at 8 kHz
    assert json.loads(found["part.json"])["offset"] == 0.05


def test_shar_members_are_copied_and_partitions_agree(
    corpus: tuple[list[Path], Path], tmp_path: Path
) -> None:
    audio, root = corpus
    assert detect_kind(root / "shar") == "lhotse"
    stored = {}
    for tar in sorted((root / "shar").glob("recording.*.tar")):
        with tarfile.open(tar) as archive:
            for info in archive:
                handle = archive.extractfile(info)
                if handle is not None and info.name.endswith(".flac"):
                    stored[info.name] = handle.read()
    one, two = tmp_path / "one", tmp_path / "two"
    summary = pack_partitioned(root / "shar", one, partition_bytes=8_000, samples_per_shard=2, progress=False)
    pack_partitioned(
        root / "shar", two, workers=2, partition_bytes=8_000, samples_per_shard=2, progress=False
    )
    assert summary.samples == len(audio) + 1
    found = tar_members(one)
    assert {name: found[name] for name in stored} == stored
    assert json.loads(found[f"{audio[3].stem}.json"])["text"] == "words 3"
    assert {p.name: p.read_bytes() for p in one.iterdir()} == {p.name: p.read_bytes() for p in two.iterdir()}
