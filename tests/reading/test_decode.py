"""decode_audio: the WAV fast path against soundfile (exact), other formats, mono, resampling, errors."""

from __future__ import annotations

import io
import struct
import time

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardio.errors import DecodeError, OptionError
from shardio.reading.decode import decode_audio, mix_to_mono, resample
from shardio.reading.wav import wav_layout

WAV_SUBTYPES = ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"]
WHERE = "shard-000003.tar.zst:spk01/utt0042@81920"


def encode(samples: np.ndarray, subtype: str, *, container: str = "WAV", rate: int = 16000) -> bytes:
    """Real soundfile encoding of ``(frames, channels)`` samples."""
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, subtype=subtype, format=container)
    return buffer.getvalue()


def reference(data: bytes) -> tuple[np.ndarray, int]:
    """What soundfile itself decodes, in decode_audio's layout."""
    frames, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return frames.T, rate


def full_range(subtype: str, frames: int, channels: int, seed: int) -> np.ndarray:
    """Samples covering a subtype's whole range, extremes included, in the dtype soundfile writes exactly."""
    rng = np.random.default_rng(seed)
    values: np.ndarray
    if subtype in ("PCM_U8", "PCM_16"):
        values = rng.integers(-(2**15), 2**15, size=(frames, channels)).astype(np.int16)
        values[:2, 0] = [-(2**15), 2**15 - 1]
    elif subtype in ("PCM_24", "PCM_32"):
        values = rng.integers(-(2**31), 2**31, size=(frames, channels)).astype(np.int32)
        values[:2, 0] = [-(2**31), 2**31 - 1]
    else:
        values = rng.uniform(-1.5, 1.5, size=(frames, channels))
        values[:2, 0] = [1e-42, -3.0]
    return values


def riff(*chunks: tuple[bytes, bytes], pad: bool = True) -> bytes:
    """A RIFF/WAVE file from ``(id, body)`` chunks, odd bodies padded with a zero byte when ``pad``."""
    body = b"WAVE"
    for chunk_id, data in chunks:
        body += chunk_id + struct.pack("<I", len(data)) + data + (b"\0" if pad and len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def fmt_pcm16(channels: int = 1, rate: int = 16000) -> tuple[bytes, bytes]:
    return b"fmt ", struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)


def assert_same_as_soundfile(
    data: bytes | memoryview, *, fast: bool = True, check_finite: bool = True
) -> None:
    expected, rate = reference(bytes(data))
    audio, got_rate = decode_audio(data, "wav", check_finite=check_finite)
    assert (wav_layout(memoryview(data)) is not None) == fast
    assert audio.dtype == np.float32 and audio.flags.c_contiguous
    assert got_rate == rate
    np.testing.assert_array_equal(audio, expected, strict=True)


# -- the WAV fast path ------------------------------------------------------------------------------


@pytest.mark.parametrize("container", ["WAV", "WAVEX"])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("subtype", WAV_SUBTYPES)
def test_wav_fast_path_is_exactly_soundfile(subtype: str, channels: int, container: str) -> None:
    data = encode(full_range(subtype, 4001, channels, seed=channels), subtype, container=container)
    assert_same_as_soundfile(data)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_wav_fast_path_random_samples(data: st.DataObject) -> None:
    subtype = data.draw(st.sampled_from(WAV_SUBTYPES), label="subtype")
    shape = (data.draw(st.integers(1, 700), label="frames"), data.draw(st.integers(1, 2), label="channels"))
    if subtype in ("PCM_U8", "PCM_16"):
        values = data.draw(hnp.arrays(np.int16, shape))
    elif subtype in ("PCM_24", "PCM_32"):
        values = data.draw(hnp.arrays(np.int32, shape))
    elif subtype == "FLOAT":
        values = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(width=32, allow_nan=False)))
    else:  # doubles beyond float32's range decode to inf, as soundfile's do
        values = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(allow_nan=False)))
    container = data.draw(st.sampled_from(["WAV", "WAVEX"]), label="container")
    assert_same_as_soundfile(encode(values, subtype, container=container), check_finite=False)


def test_wav_from_a_memoryview_slice() -> None:
    data = encode(full_range("PCM_16", 999, 2, seed=3), "PCM_16")
    shard = b"x" * 513 + data + b"y" * 100
    view = memoryview(shard)[513 : 513 + len(data)]
    audio, _ = decode_audio(view, "wav")
    np.testing.assert_array_equal(audio, reference(data)[0])


def test_wav_with_list_chunks_before_data() -> None:
    samples = np.arange(-500, 501, dtype=np.int16).tobytes()
    for info in (b"INFOISFT\x05\x00\x00\x00abcd\x00", b"INFOx"):  # even, and odd with a pad byte
        data = riff(fmt_pcm16(), (b"LIST", info), (b"data", samples))
        assert_same_as_soundfile(data)
        assert decode_audio(data, "wav")[0].shape == (1, 1001)


def test_wav_with_odd_sized_chunk_after_data_and_trailing_bytes() -> None:
    samples = np.arange(0, 3000, 3, dtype=np.int16).tobytes()
    assert_same_as_soundfile(riff(fmt_pcm16(), (b"data", samples), (b"junk", b"abc")) + b"\x01\x02")


@pytest.mark.parametrize("cut", [1, 7, 100])
def test_truncated_wav_reads_what_is_there(cut: int) -> None:
    data = encode(full_range("PCM_16", 300, 2, seed=4), "PCM_16")[:-cut]
    assert_same_as_soundfile(data)


def test_streaming_data_size_reads_to_the_end() -> None:
    stereo = np.arange(-4000, 4000, 7, dtype=np.int16).tobytes()
    streaming = riff(fmt_pcm16(channels=2)) + b"data" + struct.pack("<I", 0xFFFFFFFF)
    assert_same_as_soundfile(streaming + stereo)
    assert decode_audio(streaming + stereo, "wav")[0].shape == (2, len(stereo) // 4)


def test_odd_data_size_drops_the_partial_frame() -> None:
    samples = np.arange(101, dtype=np.int16).tobytes()
    data = riff(fmt_pcm16()) + b"data" + struct.pack("<I", 201) + samples
    assert_same_as_soundfile(data)
    assert decode_audio(data, "wav")[0].shape == (1, 100)


@pytest.mark.parametrize("subtype", ["ULAW", "ALAW", "IMA_ADPCM", "MS_ADPCM", "GSM610"])
def test_other_wav_codecs_fall_back_to_soundfile(subtype: str) -> None:
    rate = 8000
    tone = 0.3 * np.sin(2 * np.pi * 300 * np.arange(rate) / rate)
    data = encode(tone, subtype, rate=rate)
    assert_same_as_soundfile(data, fast=False)


def test_big_endian_rifx_falls_back_to_soundfile() -> None:
    buffer = io.BytesIO()
    soundfile.write(
        buffer, full_range("PCM_16", 50, 1, seed=5), 16000, subtype="PCM_16", format="WAV", endian="BIG"
    )
    assert_same_as_soundfile(buffer.getvalue(), fast=False)


# -- other formats, mono, resampling ----------------------------------------------------------------


def test_flac_is_lossless() -> None:
    values = full_range("PCM_16", 5000, 2, seed=6)
    audio, rate = decode_audio(encode(values, "PCM_16", container="FLAC"), "flac")
    assert rate == 16000 and audio.flags.c_contiguous and audio.dtype == np.float32
    np.testing.assert_array_equal(audio, values.T.astype(np.float32) / 32768)


@pytest.mark.parametrize(
    ("ext", "container", "subtype"),
    [
        ("ogg", "OGG", "VORBIS"),
        ("oga", "OGG", "VORBIS"),
        ("mp3", "MP3", "MPEG_LAYER_III"),
        ("opus", "OGG", "OPUS"),
    ],
)
def test_lossy_formats_decode(ext: str, container: str, subtype: str) -> None:
    rate = 16000
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(2 * rate) / rate)
    data = encode(np.stack([tone, 0.5 * tone], axis=1), subtype, container=container, rate=rate)
    audio, got_rate = decode_audio(data, ext, where=WHERE)
    assert got_rate == rate and audio.dtype == np.float32 and audio.flags.c_contiguous
    assert audio.shape[0] == 2 and abs(audio.shape[1] - 2 * rate) < 0.1 * rate
    np.testing.assert_array_equal(audio, reference(data)[0])
    rms = np.sqrt(np.mean(audio[:, rate // 4 : -rate // 4] ** 2, axis=1))
    np.testing.assert_allclose(rms, [0.5 / np.sqrt(2), 0.25 / np.sqrt(2)], rtol=0.15)


def test_mono_mix_averages_channels() -> None:
    left = np.full(800, 0.5)
    right = np.linspace(-1, 1, 800)
    data = encode(np.stack([left, right], axis=1), "FLOAT")
    audio, _ = decode_audio(data, "wav", mono=True)
    assert audio.shape == (1, 800) and audio.flags.c_contiguous
    np.testing.assert_allclose(audio[0], (left + right) / 2, atol=1e-7)
    mono = encode(left, "FLOAT")
    np.testing.assert_array_equal(decode_audio(mono, "wav", mono=True)[0], reference(mono)[0])
    np.testing.assert_array_equal(mix_to_mono(np.ones((3, 4), np.float32)), np.ones((1, 4), np.float32))


def tone(frequency: float, rate: int, frames: int, amplitude: float = 0.8) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * frequency * np.arange(frames) / rate)).astype(np.float32)[None]


@pytest.mark.parametrize(
    ("orig", "new", "frequency"),
    [
        (44100, 16000, 440.0),
        (48000, 16000, 1000.0),
        (16000, 8000, 3000.0),
        (8000, 16000, 440.0),
        (16000, 22050, 2500.0),
        (22050, 16000, 5000.0),
        (11127, 16000, 440.0),
        (22254, 16000, 3000.0),
        (44056, 16000, 1000.0),
        (16000, 44056, 2000.0),
    ],
)
def test_resampled_sine_keeps_frequency_amplitude_and_phase(orig: int, new: int, frequency: float) -> None:
    out = resample(tone(frequency, orig, orig), orig, new)
    expected = tone(frequency, new, out.shape[1])
    interior = slice(new // 20, -new // 20)  # away from the zero padding at the edges
    np.testing.assert_allclose(out[:, interior], expected[:, interior], atol=2e-3)


@pytest.mark.parametrize(
    ("orig", "new", "frequency"), [(48000, 16000, 12000.0), (44100, 16000, 11000.0), (16000, 8000, 5500.0)]
)
def test_resampling_suppresses_tones_above_the_new_nyquist(orig: int, new: int, frequency: float) -> None:
    out = resample(tone(frequency, orig, orig), orig, new)
    interior = out[:, new // 20 : -new // 20]
    attenuation_db = 20 * np.log10(np.sqrt(np.mean(interior**2)) / (0.8 / np.sqrt(2)))
    assert attenuation_db < -60


@settings(max_examples=40, deadline=None)
@given(
    frames=st.integers(1, 3000),
    channels=st.integers(1, 2),
    rates=st.sampled_from(
        [
            (16000, 8000),
            (8000, 16000),
            (44100, 16000),
            (16000, 44100),
            (48000, 22050),
            (22050, 16000),
            (16000, 16000),
            (11127, 16000),
            (44056, 16000),
            (16000, 22254),
        ]
    ),
)
def test_resampled_length_is_ceil_of_the_ratio(frames: int, channels: int, rates: tuple[int, int]) -> None:
    orig, new = rates
    audio = np.random.default_rng(frames).uniform(-1, 1, (channels, frames)).astype(np.float32)
    out = resample(audio, orig, new)
    assert out.shape == (channels, -(-frames * new // orig))
    assert out.dtype == np.float32 and out.flags.c_contiguous


@pytest.mark.parametrize("orig", [11127, 22254, 44056])
def test_classic_mac_rates_resample_quickly(orig: int) -> None:
    """Rates whose ratio to 16 kHz reduces to big numbers (11127:16000 is prime to it) once failed or took
    seconds to build a filter; ten seconds of stereo take well under a second now."""
    audio = np.random.default_rng(orig).uniform(-1, 1, (2, orig * 10)).astype(np.float32)
    started = time.perf_counter()
    out = resample(audio, orig, 16000)
    assert out.shape == (2, 160000) and np.isfinite(out).all()
    assert time.perf_counter() - started < 2.0


def test_decode_with_sample_rate_resamples() -> None:
    data = encode(tone(440.0, 44100, 44100)[0], "PCM_16", rate=44100)
    audio, rate = decode_audio(data, "wav", sample_rate=16000, mono=True)
    assert rate == 16000 and audio.shape == (1, 16000)
    same, same_rate = decode_audio(data, "wav", sample_rate=44100)
    assert same_rate == 44100
    np.testing.assert_array_equal(same, reference(data)[0])


def test_bad_sample_rates_are_option_errors() -> None:
    data = encode(np.zeros(10), "PCM_16")
    with pytest.raises(OptionError, match="sample_rate"):
        decode_audio(data, "wav", sample_rate=0)
    with pytest.raises(OptionError, match="channels, frames"):
        resample(np.zeros(10, np.float32), 16000, 8000)


# -- errors name where ------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["wav", "flac", "ogg", "mp3", "opus", "weird"])
@pytest.mark.parametrize(
    "data", [b"", b"not audio at all " * 20, b"RIFF\x24\x00\x00\x00WAVEfmt ", b"fLaC\x00"]
)
def test_undecodable_bytes_raise_decode_error_naming_where(ext: str, data: bytes) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_audio(data, ext, where=WHERE)
    assert WHERE in str(caught.value) and ext in str(caught.value) and "expected" in str(caught.value)


def test_zero_frames_raise_decode_error() -> None:
    for data in [
        encode(np.zeros((0, 1)), "PCM_16"),
        riff(fmt_pcm16(), (b"data", b"\x01")),
        encode(np.zeros((0, 2)), "FLOAT", container="WAVEX"),
    ]:
        with pytest.raises(DecodeError, match="0 frames") as caught:
            decode_audio(data, "wav", where=WHERE)
        assert WHERE in str(caught.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(("subtype", "container"), [("FLOAT", "WAV"), ("DOUBLE", "WAVEX")])
def test_non_finite_samples_raise_unless_unchecked(bad: float, subtype: str, container: str) -> None:
    values = np.zeros((50, 2))
    values[17, 1] = bad
    data = encode(values, subtype, container=container)
    with pytest.raises(DecodeError, match="frame 17 of channel 1") as caught:
        decode_audio(data, "wav", where=WHERE)
    assert WHERE in str(caught.value)
    audio, _ = decode_audio(data, "wav", where=WHERE, check_finite=False)
    assert not np.isfinite(audio[1, 17]) and np.isfinite(np.delete(audio[1], 17)).all()


def test_non_finite_samples_from_soundfile_formats_raise() -> None:
    values = np.zeros((40, 1), np.float32)
    values[3, 0] = np.nan
    buffer = io.BytesIO()
    soundfile.write(buffer, values, 16000, subtype="FLOAT", format="AU")
    with pytest.raises(DecodeError, match=WHERE):
        decode_audio(buffer.getvalue(), "au", where=WHERE)


def test_where_defaults_to_a_placeholder() -> None:
    with pytest.raises(DecodeError, match="<audio bytes>"):
        decode_audio(b"junk", "wav")
