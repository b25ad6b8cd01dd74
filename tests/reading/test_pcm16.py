"""``Decoding(dtype="int16")``: 16-bit PCM as stored, exactly the float32 batches times 32768."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shardio import Decoding, ShardDataset, ShardWriter
from shardio.errors import OptionError
from shardio.reading.pcm16 import to_int16
from tests.audio_factory import audio_bytes
from tests.sample_shards import make_uneven_dataset


@pytest.fixture(scope="module")
def wavs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pcm16_wavs")
    make_uneven_dataset(directory, [9, 14], seed=3)
    return directory


@pytest.fixture(scope="module")
def flacs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pcm16_flacs")
    rng = np.random.default_rng(1)
    with ShardWriter(directory) as writer:
        for i in range(10):
            channels = 1 if i % 3 else 2
            audio = rng.uniform(-0.5, 0.5, (int(rng.integers(800, 3000)), channels)).astype(np.float32)
            writer.write(
                f"f{i:02d}",
                {"flac": audio_bytes(audio, 8000, "flac")},
                audio_ext="flac",
                num_frames=audio.shape[0],
                sample_rate=8000,
                channels=channels,
            )
    return directory


def _pairs(
    directory: Path, decoding: Decoding = Decoding(), **options: Any
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    floats = list(ShardDataset(directory, seed=5, decoding=decoding, **options))
    ints = list(ShardDataset(directory, seed=5, decoding=replace(decoding, dtype="int16"), **options))
    assert len(floats) == len(ints) > 0
    return list(zip(floats, ints))


@pytest.mark.parametrize("source", ["wavs", "flacs"])
def test_int16_batches_are_the_float32_batches_times_32768(
    source: str, request: pytest.FixtureRequest
) -> None:
    directory = request.getfixturevalue(source)
    options: dict[str, Any] = (
        {"batch_size": 4} if source == "wavs" else {}
    )  # FLAC: mono and stereo, unbatched
    for floats, ints in _pairs(directory, **options):
        assert ints["audio"].dtype == torch.int16 and floats["audio"].dtype == torch.float32
        assert ints.get("keys", ints.get("key")) == floats.get("keys", floats.get("key"))
        assert torch.equal(ints["audio"].float() / 32768, floats["audio"])  # padding included
        if "lengths" in ints:
            assert torch.equal(ints["lengths"], floats["lengths"])


def test_int16_after_a_transform_is_the_transformed_float_rounded(wavs: Path) -> None:
    def quieter(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        return {**sample, "audio": sample["audio"] * np.float32(rng.uniform(0.1, 0.9))}

    for floats, ints in _pairs(wavs, batch_size=3, decoding=Decoding(transform=quieter, mono=True)):
        assert ints["audio"].dtype == torch.int16
        assert torch.equal(ints["audio"], torch.from_numpy(to_int16(floats["audio"].numpy())))


def test_an_unknown_dtype_is_refused_when_the_dataset_is_made(wavs: Path) -> None:
    with pytest.raises(OptionError, match="dtype must be one of float32, int16, not 'float16'"):
        ShardDataset(wavs, decoding=Decoding(dtype="float16"))


@given(st.lists(st.integers(-32768, 32767), max_size=50), st.floats(-4.0, 4.0, allow_nan=False, width=32))
def test_to_int16_keeps_pcm16_values_and_clips_the_rest(values: list[int], loud: float) -> None:
    stored = np.array(values, dtype=np.int16)
    assert np.array_equal(to_int16(stored.astype(np.float32) / 32768), stored)
    converted = int(to_int16(np.array([loud], np.float32))[0])
    assert converted == min(32767, max(-32768, round(loud * 32768)))
