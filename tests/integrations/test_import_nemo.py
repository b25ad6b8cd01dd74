"""NeMo tarred audio datasets as pack inputs: manifest entries joined with their tar members,
``-sub`` repeats too."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus
from sample_shards import tar_members

from shardio.errors import InputError
from shardio.packing.corpus import detect_kind
from shardio.packing.pack import pack


def write_tarred(root: Path, audio: list[Path]) -> Path:
    """A tarred dataset laid out as NeMo's convert_to_tarred_audio_dataset writes it: two shards, the last
    file listed twice in shard 1 (stored once, the repeat named ``-sub1`` in the manifest)."""
    entries = []
    halves = [audio[: len(audio) // 2], audio[len(audio) // 2 :]]
    for shard, files in enumerate(halves):
        with tarfile.open(root / f"audio_{shard}.tar", "w") as archive:
            for path in files:
                info = tarfile.TarInfo(path.name)
                data = path.read_bytes()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
                entries.append(
                    {
                        "audio_filepath": path.name,
                        "duration": 0.5,
                        "text": f"text of {path.stem}",
                        "shard_id": shard,
                    }
                )
    last = halves[1][-1]
    entries.append(
        {
            "audio_filepath": f"{last.stem}-sub1{last.suffix}",
            "duration": 0.5,
            "text": "a second text",
            "shard_id": 1,
        }
    )
    manifest = root / "tarred_audio_manifest.json"
    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return manifest


def test_tarred_manifest_joins_members_and_sub_repeats(tmp_path: Path) -> None:
    audio = make_folder_corpus(tmp_path / "audio", 6, formats=("wav", "flac"), subdirs=1)
    manifest = write_tarred(tmp_path, audio)
    assert detect_kind(manifest) == "nemo"
    summary = pack(manifest, tmp_path / "out", progress=False)
    assert summary.samples == 7
    found = tar_members(tmp_path / "out")
    for path in audio:
        assert found[path.name] == path.read_bytes()
        assert json.loads(found[f"{path.stem}.json"])["text"] == f"text of {path.stem}"
    last = audio[-1]
    assert found[f"{last.stem}-sub1{last.suffix}"] == last.read_bytes()
    assert json.loads(found[f"{last.stem}-sub1.json"])["text"] == "a second text"


def test_a_missing_member_is_named(tmp_path: Path) -> None:
    audio = make_folder_corpus(tmp_path / "audio", 2, subdirs=1)
    manifest = write_tarred(tmp_path, audio)
    with manifest.open("a") as handle:
        handle.write(json.dumps({"audio_filepath": "nowhere.wav", "text": "x", "shard_id": 0}) + "\n")
    with pytest.raises(InputError, match=r"audio_0\.tar has no member 'nowhere\.wav'"):
        pack(manifest, tmp_path / "out", progress=False)


def test_members_and_tars_no_manifest_line_names_are_counted_as_left_out(tmp_path: Path) -> None:
    """NeMo's loaders read only what the manifest lists; pack does too, and says how much it left out."""
    audio = make_folder_corpus(tmp_path / "audio", 4, subdirs=1)
    manifest = write_tarred(tmp_path, audio)
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    kept = [e for e in entries if e["audio_filepath"] != audio[0].name]  # its member stays in audio_0.tar
    manifest.write_text("".join(json.dumps(e) + "\n" for e in kept))
    with tarfile.open(tmp_path / "audio_7.tar", "w") as archive:  # a shard no line names
        info = tarfile.TarInfo(audio[1].name)
        info.size = audio[1].stat().st_size
        archive.addfile(info, io.BytesIO(audio[1].read_bytes()))
    summary = pack(manifest, tmp_path / "out", progress=False)
    assert summary.samples == len(kept)
    assert summary.left_out == {
        "NeMo tar members no manifest line reads": 1,
        "NeMo audio_*.tar files no manifest line names": 1,
    }
