"""Batch assembly: every kind of audio member lands exactly in its row, whether it was decoded there or
copied; samples skipped in any pass are listed in batch order; reads come in passes only from memory maps,
and survive the reader closing their shard files."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from audio_factory import audio_bytes, tone

import shardio.storage.localshard
from shardio import Index, ShardDataset, ShardWriter
from shardio.reading.reader import Reader

RATE = 8000
KINDS = {  # name: (extension, soundfile subtype, channels)
    "wav-pcm16-mono": ("wav", "PCM_16", 1),
    "wav-pcm16-stereo": ("wav", "PCM_16", 2),
    "wav-float-mono": ("wav", "FLOAT", 1),
    "flac-mono": ("flac", "PCM_16", 1),  # libsndfile decodes into the row
    "flac-stereo": ("flac", "PCM_16", 2),  # libsndfile decodes elsewhere; the row gets a copy
}


def write(
    directory: Path, members: list[tuple[str, dict[str, bytes]]], *, ext: str, channels: int, compression: str
) -> Index:
    with ShardWriter(directory, compression=compression, max_samples=4) as writer:
        for key, data in members:
            try:
                frames = soundfile.info(io.BytesIO(data[ext])).frames
            except soundfile.LibsndfileError:  # a member meant to fail
                frames = 100
            writer.write(key, data, audio_ext=ext, num_frames=frames, sample_rate=RATE, channels=channels)
    return Index.load(directory)


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_member_lands_exactly_in_its_row(tmp_path: Path, kind: str, compression: str) -> None:
    ext, subtype, channels = KINDS[kind]
    clips = {
        f"k{i}": audio_bytes(tone(0.05 + 0.04 * i, RATE, channels, seed=i), RATE, ext, subtype)
        for i in range(6)
    }
    index = write(
        tmp_path / "ds",
        [(key, {ext: data}) for key, data in clips.items()],
        ext=ext,
        channels=channels,
        compression=compression,
    )
    for epoch in range(2):  # the second reuses memory the first wrote
        for batch in ShardDataset(index.root, batch_size=3, seed=epoch):
            assert batch["audio"].shape[:2] == (3, channels)
            for row, key in enumerate(batch["keys"]):
                expected, _ = soundfile.read(io.BytesIO(clips[key]), dtype="float32", always_2d=True)
                length = int(batch["lengths"][row])
                assert torch.equal(batch["audio"][row, :, :length], torch.from_numpy(expected.T.copy()))
                assert not batch["audio"][row, :, length:].any()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_samples_skipped_in_any_pass_are_listed_in_batch_order(tmp_path: Path, compression: str) -> None:
    def wav(seed: int) -> bytes:
        return audio_bytes(tone(0.1, RATE, seed=seed), RATE, "wav", "PCM_16")

    def meta(key: str) -> bytes:
        return json.dumps({"text": key}).encode()

    members = {f"k{i}": {"wav": wav(i), "json": meta(f"k{i}")} for i in range(6)}
    members["k1"]["wav"] = b"not audio at all"  # fails when decoded (the last pass)
    members["k3"]["json"] = b'{"text": '  # fails when its metadata is read (the pass before)
    members["k4"]["wav"] = audio_bytes(np.full((40, 1), np.nan, np.float32), RATE, "wav", "FLOAT")
    index = write(tmp_path / "ds", list(members.items()), ext="wav", channels=1, compression=compression)
    dataset = ShardDataset(index.root, batch_size=6, shuffle=False, on_error="skip")
    (batch,) = list(dataset)
    assert batch["keys"] == ["k0", "k2", "k5"] and batch["text"] == ["k0", "k2", "k5"]
    assert [line.split(":", 1)[0] for line in batch["skipped"]] == ["k1", "k3", "k4"]
    assert dataset.stats.errors == {"DecodeError": 2, "FormatError": 1}
    for row, key in enumerate(batch["keys"]):
        expected, _ = soundfile.read(io.BytesIO(members[key]["wav"]), dtype="float32", always_2d=True)
        assert torch.equal(batch["audio"][row, :, : expected.shape[0]], torch.from_numpy(expected.T.copy()))


def test_reads_come_in_passes_only_from_memory_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clips = [
        (f"k{i}", {"wav": audio_bytes(tone(0.05, RATE, seed=i), RATE, "wav", "PCM_16")}) for i in range(2)
    ]
    plain = write(tmp_path / "plain", clips, ext="wav", channels=1, compression="none")
    zstd = write(tmp_path / "zstd", clips, ext="wav", channels=1, compression="zstd")
    assert Reader(plain).maps(0) == shardio.storage.localshard.CAN_MAP
    assert not Reader(zstd).maps(0)  # each sample is decompressed: held one at a time
    monkeypatch.setattr(shardio.storage.localshard, "CAN_MAP", False)
    assert not Reader(plain).maps(0)


def test_the_lane_opens_again_the_shards_the_reader_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane keeps the shards it reads for the iteration; one the reader closed since (it keeps
    ``max_open`` open) is opened again, and the lane still makes every batch."""
    from shardio.reading.assembly import Assembler, Decoding
    from shardio.reading.lane import Lane

    clips = [
        (f"k{i}", {"wav": audio_bytes(tone(0.05 + 0.01 * i, RATE, seed=i), RATE, "wav", "PCM_16")})
        for i in range(12)
    ]
    index = write(tmp_path / "ds", clips, ext="wav", channels=1, compression="none")  # 3 shards of 4
    served: list[bool] = []
    common = Lane.common

    def counted(self: Lane, *args: Any) -> dict[str, Any] | None:
        made = common(self, *args)
        served.append(made is not None)
        return made

    monkeypatch.setattr(Lane, "common", counted)
    reader = Reader(index, max_open=1)
    assembler = Assembler(
        reader, Decoding(), seed=0, batched=True, on_error="raise", fields=lambda _: {}, in_worker=False
    )
    for ids in ([0, 4], [8, 1], [5, 9], [0, 4]):
        batch = assembler.batch(np.array(ids), 0)
        for row, key in enumerate(batch["keys"]):
            expected, _ = soundfile.read(io.BytesIO(dict(clips)[key]["wav"]), dtype="float32", always_2d=True)
            decoded = batch["audio"][row, :, : expected.shape[0]]
            assert torch.equal(decoded, torch.from_numpy(expected.T.copy()))
    assert served == [True] * 4 and len(reader._handles) == 1


def test_a_batch_across_more_shards_than_the_reader_keeps_open(tmp_path: Path) -> None:
    """Reading in passes holds views of every shard a batch touches; closing a shard's file on the way (the
    reader keeps ``max_open`` open) must leave the views already taken intact."""
    from shardio.reading.assembly import Assembler, Decoding

    clips = [
        (f"k{i}", {"wav": audio_bytes(tone(0.05 + 0.01 * i, RATE, seed=i), RATE, "wav", "PCM_16")})
        for i in range(12)
    ]
    index = write(tmp_path / "ds", clips, ext="wav", channels=1, compression="none")  # 3 shards of 4
    ids = np.array([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])  # every sample's shard differs from the last
    reader = Reader(index, max_open=1)
    assembler = Assembler(
        reader, Decoding(), seed=0, batched=True, on_error="raise", fields=lambda _: {}, in_worker=False
    )
    batch = assembler.batch(ids, 0)
    assert len(reader._handles) == 1
    for row, key in enumerate(batch["keys"]):
        expected, _ = soundfile.read(io.BytesIO(dict(clips)[key]["wav"]), dtype="float32", always_2d=True)
        assert torch.equal(batch["audio"][row, :, : expected.shape[0]], torch.from_numpy(expected.T.copy()))
