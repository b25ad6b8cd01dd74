"""Audio whose header disagrees with its index record: a rate or a frame count the index does not record is a
DecodeError naming the sample, and a header cannot make the decoder allocate for audio
its bytes do not hold."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hostile import run_limited
from sample_shards import wav_bytes

from shardio import DecodeError, Decoding, ShardDataset, ShardWriter
from shardio.reading.decode import MAX_RESAMPLING, decode_audio, decode_encoded, read_header

RATE = 8000
LIMIT_MB = 1024
"""Address space the hostile reads may take beyond their imports (tests/hostile.py's run_limited)."""


def flac_bytes(signal: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, signal, rate, format="FLAC")
    return buffer.getvalue()


def claiming(flac: bytes, total: int) -> bytes:
    """``flac`` whose STREAMINFO claims ``total`` frames (36 bits: the low nibble of byte 21, bytes 22-25)."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    data[21] = (data[21] & 0xF0) | (total >> 32)
    data[22:26] = (total & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(data)


def write_dataset(directory: Path, members: list[tuple[str, bytes]], *, frames: int, rate: int = RATE) -> str:
    """One sample per ``(ext, audio bytes)``, each recorded in the index as ``frames`` frames at ``rate``."""
    with ShardWriter(directory) as writer:
        for i, (ext, data) in enumerate(members):
            writer.write(
                f"k{i}",
                {ext: data, "json": json.dumps({"i": i}).encode()},
                audio_ext=ext,
                num_frames=frames,
                sample_rate=rate,
                channels=1,
            )
    return str(directory)


def signal(frames: int = RATE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, frames).astype(np.float32)


def test_a_flac_header_claiming_2_to_the_36_frames_is_a_decode_error() -> None:
    hostile = claiming(flac_bytes(signal()), 2**36 - 1)
    assert soundfile.info(io.BytesIO(hostile)).frames == 2**36 - 1
    with pytest.raises(DecodeError, match="k0"):
        decode_encoded(read_header(hostile, "flac", where="k0", frames=RATE, rate=RATE))


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_dataset_of_such_headers_fails_in_bounded_memory(tmp_path: Path, dtype: str) -> None:
    hostile = claiming(flac_bytes(signal()), 2**36 - 1)
    root = write_dataset(tmp_path / "ds", [("flac", hostile)] * 2, frames=RATE)
    code = textwrap.dedent(f"""
        decoding = shardio.Decoding(dtype={dtype!r})
        batches = list(shardio.ShardDataset({root!r}, batch_size=2, decoding=decoding, on_error="skip"))
        print([len(batch["skipped"]) for batch in batches])
        next(iter(shardio.ShardDataset({root!r}, batch_size=2, decoding=decoding)))
    """)
    done = run_limited(code, headroom_mb=LIMIT_MB, preload="torch")  # the header asks for 256 GiB
    assert done.stdout.split("\n")[0] == "[2]", done.stderr[-2000:]
    assert "shardio.errors.DecodeError: shard" in done.stderr and "MemoryError" not in done.stderr


@pytest.mark.parametrize("ext", ["wav", "flac"])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_more_frames_than_the_index_records_is_a_decode_error(tmp_path: Path, ext: str, dtype: str) -> None:
    longer = signal(RATE + 100)
    data = wav_bytes(longer, RATE) if ext == "wav" else flac_bytes(longer)
    root = write_dataset(tmp_path / "ds", [(ext, data)] * 2, frames=RATE)
    with pytest.raises(DecodeError, match=rf"k0.*(index records {RATE}\b|{RATE} frames the index records)"):
        next(iter(ShardDataset(root, batch_size=2, shuffle=False, decoding=Decoding(dtype=dtype))))


@pytest.mark.parametrize("ext", ["wav", "flac"])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_rate_the_index_does_not_record_is_a_decode_error(tmp_path: Path, ext: str, dtype: str) -> None:
    data = wav_bytes(signal(), RATE) if ext == "wav" else flac_bytes(signal())
    root = write_dataset(tmp_path / "ds", [(ext, data)] * 2, frames=RATE, rate=16000)
    with pytest.raises(DecodeError, match=rf"k0.*{RATE} Hz where the index records 16000 Hz"):
        next(iter(ShardDataset(root, batch_size=2, shuffle=False, decoding=Decoding(dtype=dtype))))
    skipped = list(
        ShardDataset(root, batch_size=2, shuffle=False, decoding=Decoding(dtype=dtype), on_error="skip")
    )
    assert [len(batch["skipped"]) for batch in skipped] == [2]


def test_fewer_frames_than_recorded_decode_as_they_are(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", [("flac", flac_bytes(signal(RATE - 10)))], frames=RATE)
    batch = next(iter(ShardDataset(root, batch_size=1)))
    assert batch["lengths"].tolist() == [RATE - 10]


def test_resampling_is_bounded_by_a_factor() -> None:
    low = wav_bytes(signal(200), 100)
    with pytest.raises(DecodeError, match=f"at most {MAX_RESAMPLING}x"):
        decode_audio(low, "wav", where="k0", sample_rate=100 * MAX_RESAMPLING + 1)
    audio, rate = decode_audio(low, "wav", sample_rate=100 * MAX_RESAMPLING)
    assert (audio.shape, rate) == ((1, 200 * MAX_RESAMPLING), 100 * MAX_RESAMPLING)


def test_the_memory_limit_of_this_test_would_catch_a_256_gib_allocation() -> None:
    """The bounded-memory test above is meaningful: under the same limit, reading as the header says fails."""
    hostile = claiming(flac_bytes(signal()), 2**36 - 1)
    code = textwrap.dedent(f"""
        import io
        with soundfile.SoundFile(io.BytesIO({hostile!r})) as sound:
            sound.read(sound.frames, dtype="float32")
    """)
    done = run_limited(code, headroom_mb=LIMIT_MB)
    assert done.returncode != 0 and "MemoryError" in done.stderr
