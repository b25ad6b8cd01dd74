"""The synthetic corpus: layout, transcripts, determinism, speech-likeness, formats and durations."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from shardio.errors import OptionError
from shardio.reading.decode import decode_audio
from shardio.synth import FORMATS, duration_sample, make_corpus


def load(path: Path) -> tuple[np.ndarray, int]:
    audio, rate = decode_audio(path.read_bytes(), path.suffix, where=str(path))
    return audio[0], rate


def test_layout_transcripts_and_durations(tmp_path: Path) -> None:
    paths = make_corpus(tmp_path, num_files=20, speakers=3, min_seconds=1.0, max_seconds=3.0)
    assert len(paths) == 20
    for number, path in enumerate(paths):
        speaker = number % 3
        assert path.relative_to(tmp_path).as_posix() == f"spk{speaker:02d}/spk{speaker:02d}_{number:04d}.wav"
        text = path.with_suffix(".txt").read_text(encoding="utf-8")
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", text), text
    seconds = np.array([len(load(p)[0]) / 16000 for p in paths])
    assert seconds.min() >= 1.0 - 1e-3 and seconds.max() <= 3.0 + 1e-3
    assert np.histogram(seconds, bins=5, range=(1.0, 3.0))[0].min() >= 2  # spread over the whole range
    transcripts = [p.with_suffix(".txt").name for p in paths]
    expected = [f"spk{s:02d}" for s in range(3)] + [p.name for p in paths] + transcripts
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(expected)


def test_same_arguments_same_corpus(tmp_path: Path) -> None:
    first = make_corpus(tmp_path / "a", num_files=6, seed=5)
    second = make_corpus(tmp_path / "b", num_files=6, seed=5)
    other = make_corpus(tmp_path / "c", num_files=6, seed=6)
    for a, b, c in zip(first, second, other, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert a.with_suffix(".txt").read_text() == b.with_suffix(".txt").read_text()
        assert a.read_bytes() != c.read_bytes()


def test_audio_looks_like_speech_not_a_tone(tmp_path: Path) -> None:
    (path,) = make_corpus(tmp_path, num_files=1, min_seconds=4.0, max_seconds=4.0)
    audio, rate = load(path)
    assert np.isfinite(audio).all() and 0.2 < np.abs(audio).max() <= 1.0
    hop = rate // 100  # 10 ms frames
    energy = (audio[: len(audio) // hop * hop].reshape(-1, hop) ** 2).mean(axis=1)
    quiet = energy < 0.01 * energy.max()
    assert 0.05 < quiet.mean() < 0.6  # pauses and closures, but mostly sound
    # the loudness rises and falls mostly at syllable rates (2-10 Hz)
    envelope = np.sqrt(energy) - np.sqrt(energy).mean()
    modulation = np.abs(np.fft.rfft(envelope)) ** 2
    rates = np.fft.rfftfreq(len(energy), 1 / 100)
    syllabic = modulation[(rates >= 2) & (rates <= 10)].sum()
    assert syllabic > 0.35 * modulation[(rates > 0.25) & (rates < 25)].sum()
    # energy spread over many harmonics and formants, not one spectral line
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    assert np.sort(spectrum)[-20:].sum() < 0.2 * spectrum.sum()
    freqs = np.fft.rfftfreq(len(audio), 1 / rate)
    assert spectrum[(freqs > 1000) & (freqs < 4000)].sum() > 0.02 * spectrum.sum()


def test_speakers_differ_in_pitch(tmp_path: Path) -> None:
    low, high = make_corpus(
        tmp_path, num_files=2, speakers=2, min_seconds=3.0, max_seconds=3.0, with_text=False
    )

    def pitch(path: Path) -> float:
        """The median autocorrelation pitch of the loudest quarter of 40 ms frames."""
        audio, rate = load(path)
        size = int(0.04 * rate)
        frames = audio[: len(audio) // size * size].reshape(-1, size)
        loudest = frames[np.argsort((frames**2).sum(axis=1))[-len(frames) // 4 :]]
        shortest, longest = rate // 400, rate // 60
        estimates = []
        for frame in loudest - loudest.mean(axis=1, keepdims=True):
            correlation = np.correlate(frame, frame, "full")[size - 1 :]
            estimates.append(rate / (shortest + np.argmax(correlation[shortest:longest])))
        return float(np.median(estimates))

    assert 85 < pitch(low) < 160 < pitch(high) < 260
    assert not list(tmp_path.rglob("*.txt"))


def test_every_format_decodes(tmp_path: Path) -> None:
    formats = tuple(FORMATS)
    paths = make_corpus(tmp_path, num_files=len(formats), formats=formats, min_seconds=1.0, max_seconds=1.5)
    assert [p.suffix[1:] for p in paths] == list(formats)
    for path in paths:
        audio, rate = load(path)
        assert rate == 16000 and 0.9 * rate < len(audio) < 1.7 * rate


def test_given_durations_and_sample_rate(tmp_path: Path) -> None:
    paths = make_corpus(tmp_path, num_files=3, sample_rate=8000, durations=[0.05, 2.0, 0.5])
    assert [len(load(p)[0]) for p in paths] == [400, 16000, 4000]
    assert all(load(p)[1] == 8000 for p in paths)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"formats": ("wav", "aiff")},
        {"formats": ()},
        {"formats": ("opus",), "sample_rate": 44100},
        {"min_seconds": 3.0, "max_seconds": 2.0},
        {"min_seconds": 0.0},
        {"speakers": 0},
        {"sample_rate": 4000},
        {"durations": [1.0]},
        {"durations": [1.0, -1.0]},
    ],
)
def test_bad_options(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(OptionError):
        make_corpus(tmp_path, num_files=2, **kwargs)  # type: ignore[arg-type]


def test_librispeech_like_durations() -> None:
    seconds = duration_sample(20000, "librispeech", seed=1)
    assert seconds.shape == (20000,) and seconds.dtype == np.float64
    assert seconds.min() >= 1.0 and seconds.max() <= 35.0
    assert 0.7 < np.mean((seconds >= 10) & (seconds <= 17)) < 0.9
    assert np.mean(seconds < 5) > 0.03 and np.mean(seconds > 20) > 0.02
    assert 12 < np.median(seconds) < 16
    np.testing.assert_array_equal(seconds, duration_sample(20000, seed=1))
    assert not np.array_equal(seconds, duration_sample(20000, seed=2))


def test_uniform_durations_and_bad_profiles() -> None:
    seconds = duration_sample(1000, "uniform", seed=0, low=2.0, high=4.0)
    assert seconds.min() >= 2.0 and seconds.max() <= 4.0 and seconds.std() > 0.4
    with pytest.raises(OptionError):
        duration_sample(10, "tedlium")
    with pytest.raises(OptionError):
        duration_sample(10, "uniform", low=5.0, high=1.0)
