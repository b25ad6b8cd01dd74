"""The common-case lane: its batches are the general path's, field by field, over generated datasets whose
samples are common, odd or broken; it serves the common case, and leaves everything else to the general path.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from audio_factory import audio_bytes, tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_servers import serve_copy
from torch.utils.data import DataLoader

from shardio import Decoding, ShardDataset, ShardWriter
from shardio.errors import ShardioError
from shardio.packing.indexer import build_index
from shardio.reading import lane
from shardio.reading.lane import Lane

RATE = 8000
AUDIO = {  # name: (extension, soundfile subtype, channels)
    "pcm16": ("wav", "PCM_16", 1),
    "pcm16-stereo": ("wav", "PCM_16", 2),
    "pcm24": ("wav", "PCM_24", 1),
    "pcm32": ("wav", "PCM_32", 1),
    "u8": ("wav", "PCM_U8", 1),
    "float": ("wav", "FLOAT", 1),
    "flac": ("flac", "PCM_16", 1),
}
JSONS = [
    None,
    {"text": "hello", "speaker": 3},
    {"text": "x", "lengths": [1, 2], "key": "other", "audio": 1},
    {"keys": "shadowed?", "sample_rate": 5, "corpus": None},
    {"repeat": True, "skipped": 1, "epoch": "e"},
    {"speaker": {"id": 4}, "text_lengths": 2},
    "[1, 2]",
    "{not json",
    '{"t\\u00e9xt": 1.5}',
]


def _with_chunk(wav: bytes) -> bytes:
    """``wav`` with a LIST chunk between its fmt and data chunks (the header parser walks to the data)."""
    listing = b"LIST" + struct.pack("<I", 4) + b"INFO"
    body = wav[:36] + listing + wav[36:]
    return body[:4] + struct.pack("<I", len(body) - 8) + body[8:]


@st.composite
def samples(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(AUDIO)))
    ext, subtype, channels = AUDIO[kind]
    seconds = draw(st.sampled_from([0.0, 0.01, 0.03, 0.05]))
    data = audio_bytes(tone(seconds, RATE, channels, seed=draw(st.integers(0, 9))), RATE, ext, subtype)
    damage = draw(st.sampled_from(["none"] * 6 + ["chunk", "truncated", "header", "other-key"]))
    if damage == "chunk" and ext == "wav":
        data = _with_chunk(data)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "header":
        data = b"JUNK" + data[4:]
    frames = max(0, int(round(seconds * RATE)) + draw(st.sampled_from([0, 0, 0, -1, 3])))
    return {
        "ext": ext,
        "data": data,
        "channels": channels,
        "frames": frames,
        "other_key": damage == "other-key",
        "json": draw(st.sampled_from(JSONS)),
        "txt": draw(st.sampled_from([None, "spoken", "caf\xe9"])),
    }


def _write(directory: Path, drawn: list[dict[str, Any]], compression: str = "none") -> str:
    with ShardWriter(directory, max_samples=3, compression=compression) as writer:
        for number, sample in enumerate(drawn):
            key = f"utt{number:03d}"
            members = {sample["ext"]: sample["data"]}
            if sample["json"] is not None:
                members["json"] = (
                    sample["json"] if isinstance(sample["json"], str) else json.dumps(sample["json"])
                ).encode()
            if sample["txt"] is not None:
                members["txt"] = sample["txt"].encode()
            writer.write(
                key,
                members,
                audio_ext=sample["ext"],
                num_frames=sample["frames"],
                sample_rate=RATE,
                channels=sample["channels"],
            )
    for number in [n for n, sample in enumerate(drawn) if sample["other_key"]]:
        _rename_members(directory, f"utt{number:03d}.", f"utx{number:03d}.")
    return str(directory)


def _rename_members(directory: Path, old: str, new: str) -> None:
    """Rename the tar members whose names start with ``old`` in place (same length), checksums kept valid."""
    for shard in directory.glob("*.tar"):
        content = bytearray(shard.read_bytes())
        at = content.find(old.encode())
        while at >= 0:
            if at % 512 == 0:  # a header's name field
                content[at : at + len(new)] = new.encode()
                header = content[at : at + 512]
                header[148:156] = b" " * 8
                content[at + 148 : at + 156] = b"%06o\0 " % sum(header)
            at = content.find(old.encode(), at + 1)
        shard.write_bytes(bytes(content))


@contextmanager
def _general_path_only() -> Iterator[None]:
    serves = Lane.serves
    Lane.serves = staticmethod(lambda *args, **kwargs: False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Lane.serves = serves  # type: ignore[method-assign]


def _epoch(root: str, workers: int = 0, **options: Any) -> list[dict[str, Any]] | str:
    """The epoch's batches (through a DataLoader with ``workers``), each field as plain values, in order; or
    the error that ended it, as text."""
    dataset = ShardDataset(root, seed=1, **options)
    try:
        batches = DataLoader(dataset, batch_size=None, num_workers=workers) if workers else dataset
        return [
            [
                (name, (value.dtype, value.tolist()) if isinstance(value, torch.Tensor) else value)
                for name, value in batch.items()
            ]
            for batch in batches
        ]
    except ShardioError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    drawn=st.lists(samples(), min_size=1, max_size=9),
    batch_size=st.integers(1, 4),
    dtype=st.sampled_from(["float32", "int16"]),
    on_error=st.sampled_from(["skip", "raise"]),
    compression=st.sampled_from(["none", "none", "zstd"]),
)
def test_the_lane_batches_are_the_general_paths(
    drawn: list[dict[str, Any]], batch_size: int, dtype: str, on_error: str, compression: str
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = _write(
            Path(directory) / "ds", drawn, "none" if any(s["other_key"] for s in drawn) else compression
        )
        options = {"batch_size": batch_size, "decoding": Decoding(dtype=dtype), "on_error": on_error}
        with_lane = _epoch(root, **options)
        with _general_path_only():
            general = _epoch(root, **options)
    assert with_lane == general


@contextmanager
def _counting_lane() -> Iterator[list[bool]]:
    """Whether the lane built each batch (True) or left it to the general path (False), in order."""
    served: list[bool] = []
    common = Lane.common

    def counted(self: Lane, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        made = common(self, *args, **kwargs)
        served.append(made is not None)
        return made

    Lane.common = counted  # type: ignore[method-assign]
    try:
        yield served
    finally:
        Lane.common = common  # type: ignore[method-assign]


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_the_lane_serves_pcm_wav_in_plain_tar_shards(tmp_path: Path, dtype: str) -> None:
    drawn = [
        {
            "ext": "wav",
            "data": audio_bytes(tone(0.02 * (1 + n % 3), RATE, seed=n), RATE, "wav", "PCM_16"),
            "channels": 1,
            "frames": int(round(0.02 * (1 + n % 3) * RATE)),
            "other_key": False,
            "json": {"text": f"t{n}"},
            "txt": None,
        }
        for n in range(8)
    ]
    root = _write(tmp_path / "ds", drawn)
    with _counting_lane() as served:
        batches = list(ShardDataset(root, batch_size=3, seed=0, decoding=Decoding(dtype=dtype)))
    assert served == [True, True, True]
    assert sorted(key for batch in batches for key in batch["keys"]) == [f"utt{n:03d}" for n in range(8)]
    for batch in batches:
        for row, key in enumerate(batch["keys"]):
            number = int(key[3:])
            expected, _ = soundfile.read(io.BytesIO(drawn[number]["data"]), dtype=dtype, always_2d=True)
            length = int(batch["lengths"][row])
            assert torch.equal(batch["audio"][row, :, :length], torch.from_numpy(expected.T.copy()))
            assert not batch["audio"][row, :, length:].any()
            assert batch["text"][row] == f"t{number}"


def test_the_lane_leaves_a_batch_with_anything_unusual_to_the_general_path(tmp_path: Path) -> None:
    pcm = audio_bytes(tone(0.02, RATE), RATE, "wav", "PCM_16")
    common = {
        "ext": "wav",
        "data": pcm,
        "channels": 1,
        "frames": 160,
        "other_key": False,
        "json": None,
        "txt": None,
    }
    drawn = [
        common,
        common,
        {**common, "data": audio_bytes(tone(0.02, RATE), RATE, "wav", "FLOAT")},
        common,
        {**common, "json": "{broken"},
        common,
    ]
    root = _write(tmp_path / "ds", drawn)
    with _counting_lane() as served:
        batches = list(ShardDataset(root, batch_size=2, seed=0, shuffle=False, on_error="skip"))
    assert served == [True, False, False]
    assert [batch["keys"] for batch in batches] == [["utt000", "utt001"], ["utt002", "utt003"], ["utt005"]]
    assert batches[2]["skipped"][0].startswith("utt004: ")


@pytest.mark.parametrize("pass_bytes", [lane.PASS_BYTES, 0])  # read in passes, or each sample in turn
@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_the_lane_serves_local_compressed_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: str, pass_bytes: int
) -> None:
    monkeypatch.setattr(lane, "PASS_BYTES", pass_bytes)
    clips = [audio_bytes(tone(0.02 * (1 + n), RATE, seed=n), RATE, "wav", "PCM_16") for n in range(4)]
    if compression == "zstd":
        with ShardWriter(tmp_path / "ds", compression="zstd") as writer:
            for n, clip in enumerate(clips):
                writer.write(
                    f"k{n}",
                    {"wav": clip},
                    audio_ext="wav",
                    num_frames=160 * (1 + n),
                    sample_rate=RATE,
                    channels=1,
                )
        root = str(tmp_path / "ds")
    else:  # a stream-compressed shard of another tool, indexed in place
        with tarfile.open(tmp_path / "shard-000000.tar.gz", "w:gz") as tar:
            for n, clip in enumerate(clips):
                info = tarfile.TarInfo(f"k{n}.wav")
                info.size = len(clip)
                tar.addfile(info, io.BytesIO(clip))
        root = build_index([str(tmp_path / "shard-000000.tar.gz")]).root
    with _counting_lane() as served:
        batches = list(ShardDataset(root, batch_size=2, shuffle=False))
    assert served == [True, True]
    assert [batch["keys"] for batch in batches] == [["k0", "k1"], ["k2", "k3"]]
    with _general_path_only():
        general = _epoch(root, batch_size=2, shuffle=False)
    assert _epoch(root, batch_size=2, shuffle=False) == general


def test_the_lane_does_not_serve_remote_shards(tmp_path: Path) -> None:
    drawn = [
        {
            "ext": "wav",
            "data": audio_bytes(tone(0.02, RATE, seed=n), RATE, "wav", "PCM_16"),
            "channels": 1,
            "frames": 160,
            "other_key": False,
            "json": None,
            "txt": None,
        }
        for n in range(4)
    ]
    root = _write(tmp_path / "ds", drawn)
    with serve_copy(root, tmp_path / "served") as http, _counting_lane() as served:
        batches = list(ShardDataset(f"{http.url}/ds", batch_size=2, shuffle=False))
    assert served == [False, False]
    assert [batch["keys"] for batch in batches] == [["utt000", "utt001"], ["utt002", "utt003"]]


def test_an_unused_row_of_a_reused_block_is_zero(tmp_path: Path) -> None:
    long, short = (audio_bytes(tone(seconds, RATE, seed=1), RATE, "wav", "PCM_16") for seconds in (1.0, 0.5))
    drawn = [
        {
            "ext": "wav",
            "data": data,
            "channels": 1,
            "frames": frames,
            "other_key": False,
            "json": None,
            "txt": None,
        }
        for data, frames in ((long, 8000), (long, 8000), (short, 4000), (short, 4000))
    ]
    root = _write(tmp_path / "ds", drawn)
    dataset = ShardDataset(root, batch_size=2, seed=0, shuffle=False)
    for _ in range(3):  # later epochs write into blocks the earlier ones filled
        for batch in dataset:
            lengths = batch["lengths"].tolist()
            for row, length in enumerate(lengths):
                assert not np.asarray(batch["audio"][row, :, length:]).any()


def test_a_member_of_another_key_fails_the_same_on_both_paths(tmp_path: Path) -> None:
    pcm = audio_bytes(tone(0.02, RATE), RATE, "wav", "PCM_16")
    common = {
        "ext": "wav",
        "data": pcm,
        "channels": 1,
        "frames": 160,
        "other_key": False,
        "json": None,
        "txt": None,
    }
    root = _write(tmp_path / "ds", [common, {**common, "other_key": True}, common])
    with_lane = _epoch(root, batch_size=3)
    with _general_path_only():
        assert _epoch(root, batch_size=3) == with_lane
    assert (
        isinstance(with_lane, str)
        and "found member 'utx001.wav' where the index expects key 'utt001'" in with_lane
    )


def test_batches_from_workers_are_the_general_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a worker the lane's small tensors lie behind the audio in the worker's
    shared block, as collate's."""
    drawn = [
        {
            "ext": "wav",
            "data": audio_bytes(tone(0.5 + 0.3 * (n % 4), RATE, seed=n), RATE, "wav", "PCM_16"),
            "channels": 1,
            "frames": int(round((0.5 + 0.3 * (n % 4)) * RATE)),
            "other_key": False,
            "json": JSONS[(0, 1, 5)[n % 3]],
            "txt": None,
        }
        for n in range(24)
    ]
    root = _write(tmp_path / "ds", drawn)
    with_lane = _epoch(root, workers=2, batch_size=4)
    with _general_path_only():
        general = _epoch(root, workers=2, batch_size=4)
    assert with_lane == general and isinstance(general, list) and len(general) == 6

    lane_common = Lane.common

    def marked(self: Lane, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        made = lane_common(self, *args, **kwargs)
        if made is not None:
            made["from_lane"] = True
        return made

    monkeypatch.setattr(Lane, "common", marked)  # forked workers inherit it
    marks = _epoch(root, workers=2, batch_size=4)
    assert isinstance(marks, list) and all(("from_lane", True) in batch for batch in marks)
