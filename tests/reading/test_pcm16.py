"""``Decoding(dtype="int16")``: 16-bit PCM as stored, exactly the float32 batches times 32768."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio import Decoding, ShardDataset, ShardWriter
from shardio.errors import OptionError
from shardio.reading.decode import decode_encoded, read_header
from shardio.reading.pcm16 import decode_steps, scales_exactly, to_float32, to_int16
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


def test_libsndfile_scales_16_bit_flac_exactly_and_vorbis_is_not_16_bit() -> None:
    assert scales_exactly("FLAC", "PCM_16") and scales_exactly("FLAC", "PCM_16")  # the second: remembered
    assert not scales_exactly("OGG", "VORBIS")  # no 16-bit values to write


@settings(max_examples=40, deadline=None)
@given(
    ext=st.sampled_from(["flac", "wav", "aiff"]),
    channels=st.integers(1, 2),
    frames=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    loud=st.booleans(),
    into_rows=st.booleans(),
)
def test_decoded_steps_scaled_are_the_float32_decoding_bit_for_bit(
    ext: str, channels: int, frames: int, seed: int, loud: bool, into_rows: bool
) -> None:
    """What the decoded cache keeps of 16-bit audio (its steps, then ``steps * 2**-15``) is what the decoder
    makes of it: FLAC and AIFF through libsndfile, WAV through the fast path; extremes included."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-32768, 32768, (frames, channels)).astype(np.int16)
    if loud:
        steps[rng.integers(0, frames, 3)] = rng.choice([-32768, 32767, 0, -1, 1], (3, channels))
    buffer = io.BytesIO()
    soundfile.write(buffer, steps, 8000, format=ext.upper(), subtype="PCM_16")
    encoded = read_header(buffer.getvalue(), ext, frames=frames, rate=8000)
    out = np.empty((channels, frames + 5), np.int16) if into_rows else None
    found = decode_steps(encoded, out)
    assert found is not None and found[1] == 8000
    assert np.array_equal(found[0], steps.T)
    row = np.full((channels, frames + 7), np.nan, np.float32) if into_rows else None
    floats = to_float32(found[0], row)
    assert floats.dtype == np.float32 and floats.shape == (channels, frames)
    assert (floats.base is row) if into_rows and row is not None else floats.base is None
    decoded, _ = decode_encoded(encoded)
    assert floats.tobytes() == decoded.tobytes()  # bit for bit


def test_audio_that_is_not_16_bit_has_no_steps() -> None:
    for subtype in ("PCM_24", "FLOAT"):
        buffer = io.BytesIO()
        ext = "flac" if subtype == "PCM_24" else "wav"
        soundfile.write(buffer, np.zeros((100, 1), np.float32), 8000, format=ext.upper(), subtype=subtype)
        assert decode_steps(read_header(buffer.getvalue(), ext), None) is None
    flac = audio_bytes(np.zeros((100, 1), np.float32), 8000, "flac")
    assert decode_steps(read_header(flac, "flac"), None) is not None
    assert decode_steps(read_header(flac, "ogg"), None) is None  # a lossy format's name: not looked into
