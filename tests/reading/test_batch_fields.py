"""A sample's metadata field named as one of the batch's own fields (``keys``, ``lengths``, ``epoch``, ...) is
refused: in a batch it would replace the batch's own field, or be replaced by it, without a word."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
from sample_shards import wav_bytes
from torch.utils.data import DataLoader

from shardio import FormatError, InputError, ShardDataset, ShardWriter, collate
from shardio.packing.pack import pack
from shardio.reading.fields import BATCH_FIELDS


def write_dataset(
    directory: Path,
    meta: dict[str, object],
    *,
    audio: str = "wav",
    compression: str = "none",
    samples: int = 4,
) -> str:
    """``samples`` one-second samples of 8 kHz noise whose json member is ``meta`` plus its index."""
    rng = np.random.default_rng(0)
    with ShardWriter(directory, compression=compression) as writer:
        for i in range(samples):
            signal = rng.uniform(-0.5, 0.5, 8000).astype(np.float32)
            data = wav_bytes(signal, 8000)
            if audio == "flac":
                path = directory.parent / f"{directory.name}-{i}.flac"
                soundfile.write(path, signal, 8000, format="FLAC")
                data = path.read_bytes()
            writer.write(
                f"k{i}",
                {audio: data, "json": json.dumps({**meta, "i": i}).encode()},
                audio_ext=audio,
                num_frames=8000,
                sample_rate=8000,
                channels=1,
            )
    return str(directory)


@pytest.mark.parametrize("audio, compression", [("wav", "none"), ("flac", "none"), ("wav", "zstd")])
@pytest.mark.parametrize("name", ["keys", "lengths", "epoch", "repeat"])
def test_a_metadata_field_named_as_a_batch_field_is_refused(
    tmp_path: Path, audio: str, compression: str, name: str
) -> None:
    root = write_dataset(
        tmp_path / "ds", {name: ["not", "the", "keys"]}, audio=audio, compression=compression
    )
    with pytest.raises(FormatError, match=rf"k\d.*'{name}'.*rename"):
        next(iter(ShardDataset(root, batch_size=2, shuffle=False)))
    with pytest.raises(FormatError, match=rf"'{name}'"):  # single samples, batched by the DataLoader
        next(iter(DataLoader(ShardDataset(root, shuffle=False), batch_size=2, collate_fn=collate)))


def test_skipping_leaves_out_the_samples_and_says_why(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", {"keys": "x"})
    batches = list(ShardDataset(root, batch_size=2, shuffle=False, on_error="skip"))
    assert [batch["keys"] for batch in batches] == [[], []]
    assert all("'keys'" in text for batch in batches for text in batch["skipped"])


def test_other_fields_reach_the_batch_beside_its_own(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", {"text": "hello", "speaker": 7})
    batch = next(iter(ShardDataset(root, batch_size=2, shuffle=False)))
    assert batch["keys"] == ["k0", "k1"] and batch["text"] == ["hello"] * 2 and batch["speaker"] == [7, 7]
    assert batch["lengths"].tolist() == [8000, 8000] and batch["i"] == [0, 1]


def test_pack_refuses_such_a_field_of_a_manifest(tmp_path: Path) -> None:
    audio = tmp_path / "in" / "a.wav"
    audio.parent.mkdir()
    audio.write_bytes(wav_bytes(np.zeros(800, np.float32), 8000))
    lines = [{"audio_filepath": "a.wav", "text": "a", "batch_index": 3}]
    (tmp_path / "in" / "m.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    with pytest.raises(InputError, match="'batch_index'.*rename"):
        pack(tmp_path / "in" / "m.jsonl", tmp_path / "out", progress=False)
    assert {"keys", "lengths", "epoch", "batch_index", "repeat", "skipped"} == BATCH_FIELDS
