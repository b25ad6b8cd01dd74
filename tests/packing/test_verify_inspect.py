"""verify catches damaged shards (flipped byte, truncation, a missing file) and, without decoding, damaged
audio in shards whose hashes match (indexed in place: pack's structure checks); inspect's numbers are
right."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from audio_factory import audio_bytes, tone, write_tone

from shardio.errors import FormatError
from shardio.packing.indexer import build_index
from shardio.packing.inspection import inspect_dataset, render_report
from shardio.packing.pack import pack
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index
from shardio.shards.writer import ShardWriter


@pytest.fixture(params=["none", "zstd"])
def dataset(request: pytest.FixtureRequest, wav_corpus: Path, tmp_path: Path) -> Path:
    pack(wav_corpus, tmp_path / "ds", compression=request.param, samples_per_shard=16, progress=False)
    return tmp_path / "ds"


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_sound_dataset_verifies(dataset: Path) -> None:
    assert verify_dataset(dataset) == []
    assert verify_dataset(dataset, decode=True) == []


def test_flipped_byte_in_audio_data(dataset: Path) -> None:
    index = Index.load(dataset)
    shard = dataset / index.shards[1].name
    sample = int(index.shard_ids.tolist().index(1)) + 3
    offset = int(index.columns["frame_offset"][sample]) + (1000 if index.shards[1].codec == "none" else 60)
    flip_byte(shard, offset)
    problems = verify_dataset(dataset)
    assert problems and problems[0].startswith(f"{index.shards[1].name}: SHA-256 ")
    assert all(p.startswith(index.shards[1].name) for p in problems)
    if index.shards[1].codec == "zstd":  # the frame's checksum fails too
        assert any("zstd" in p and repr(index.keys[sample]) in p for p in problems[1:])


def test_flipped_byte_in_a_tar_header(wav_corpus: Path, tmp_path: Path) -> None:
    pack(wav_corpus, tmp_path / "ds", samples_per_shard=16, progress=False)
    index = Index.load(tmp_path / "ds")
    flip_byte(tmp_path / "ds" / index.shards[0].name, int(index.columns["frame_offset"][5]) + 2)
    problems = verify_dataset(tmp_path / "ds")
    assert any(repr(index.keys[5]) in p and "checksum" in p for p in problems), problems


def test_truncated_and_missing_shards(dataset: Path) -> None:
    index = Index.load(dataset)
    shard = dataset / index.shards[0].name
    shard.write_bytes(shard.read_bytes()[:-1500])
    (dataset / index.shards[2].name).unlink()
    problems = verify_dataset(dataset)
    expected = index.shards[0].bytes
    assert f"{index.shards[0].name}: {expected - 1500} bytes, the index says {expected}" in "\n".join(
        problems
    )
    assert any(p.startswith(f"{index.shards[2].name}: the shard file is missing") for p in problems)
    assert not any(p.startswith(index.shards[1].name) for p in problems)


def _flipped(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x40
    return bytes(damaged)


@pytest.mark.parametrize(
    ("ext", "damage", "reason"),
    [
        ("flac", _flipped, "fails its CRC-16"),
        ("flac", lambda data: data[: len(data) * 3 // 4], "fails its CRC-16"),
        ("wav", lambda data: data[: len(data) // 2], "truncated: the WAV data chunk claims 32000 bytes"),
    ],
    ids=["flac-flipped-byte", "flac-cut", "wav-cut"],
)
def test_damaged_audio_indexed_in_place_is_found_without_decoding(
    tmp_path: Path, ext: str, damage: Callable[[bytes], bytes], reason: str
) -> None:
    """Another tool's tar, indexed where it is (``shardio index`` reads only the audio headers, which the
    damage leaves whole): its SHA-256 is the damaged bytes', and the structure checks find the damage."""
    with tarfile.open(tmp_path / "other-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, seed, change in (("good", 1, bytes), ("bad", 2, damage)):
            data = change(audio_bytes(tone(1.0, 16000, 1, seed=seed), 16000, ext))
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    build_index([tmp_path / "other-000000.tar"], progress=False)
    for decode in (False, True):
        problems = verify_dataset(tmp_path, decode=decode, progress=False)
        assert len(problems) == 1, problems
        assert problems[0].startswith(f"other-000000.tar: sample 'bad': the .{ext} member is malformed: ")
        assert reason in problems[0]


@pytest.mark.parametrize("ext", ["flac", "wav"])
def test_headers_that_disagree_with_the_index_are_found_without_decoding(tmp_path: Path, ext: str) -> None:
    whole = audio_bytes(tone(0.5, 8000, 1), 8000, ext)
    with ShardWriter(tmp_path / "d") as writer:  # the writer trusts its caller: as another tool might have
        writer.write("off", {ext: whole}, audio_ext=ext, num_frames=3999, sample_rate=8000, channels=1)
    problems = verify_dataset(tmp_path / "d", progress=False)
    assert problems == [
        "shard-000000.tar: sample 'off': its headers say 4000 frames at 8000 Hz x 1 channels, the index says "
        "3999 frames at 8000 Hz x 1 channels"
    ]


def test_missing_index_is_a_problem(tmp_path: Path) -> None:
    problems = verify_dataset(tmp_path)
    assert len(problems) == 1 and "no index here" in problems[0]
    with pytest.raises(FormatError, match="no index here"):
        inspect_dataset(tmp_path)


def test_inspect_numbers(tmp_path: Path) -> None:
    specs = [
        ("a.wav", 0.5, 8000, 1),
        ("b.wav", 0.5, 8000, 1),
        ("c.flac", 1.5, 16000, 2),
        ("d.flac", 2.5, 16000, 1),
        ("e.mp3", 12.0, 22050, 1),
    ]
    for name, seconds, rate, channels in specs:
        write_tone(tmp_path / "in" / name, seconds, rate, channels=channels)
    summary = pack(tmp_path / "in", tmp_path / "ds", samples_per_shard=2, progress=False)
    report = inspect_dataset(tmp_path / "ds")
    assert (report["shards"], report["samples"]) == (3, 5)
    assert report["seconds"] == pytest.approx(17.0, abs=0.01)
    assert report["hours"] == pytest.approx(17.0 / 3600, rel=1e-3) == pytest.approx(summary.hours)
    assert report["bytes"] == summary.bytes == sum(p.stat().st_size for p in (tmp_path / "ds").glob("*.tar"))
    assert report["formats"] == {"wav": 2, "flac": 2, "mp3": 1}
    assert report["sample_rates"] == {"8000": 2, "16000": 2, "22050": 1}
    assert report["channels"] == {"1": 4, "2": 1}
    assert report["codecs"] == {"none": 3}
    assert report["duration"]["min"] == 0.5 and report["duration"]["median"] == 1.5
    assert report["duration"]["max"] == pytest.approx(12.0, abs=0.01)
    counts = {(b["from"], b["to"]): b["samples"] for b in report["histogram"]}
    assert counts[(0.0, 1.0)] == 2 and counts[(1.0, 2.0)] == 1 and counts[(2.0, 3.0)] == 1
    assert counts[(10.0, 15.0)] == 1 and sum(counts.values()) == 5
    json.dumps(report)  # JSON-ready
    text = render_report(report)
    assert "samples      5" in text and "wav (2), flac (2), mp3 (1)" in text and "16000 (2)" in text
    assert len(text.splitlines()) == 10 + len(report["histogram"])
