"""A deterministic, speech-like synthetic corpus (numpy only), for demos, tests and benchmarks.

Each utterance is a run of made-up words whose syllables are built as speech is: a consonant (a burst
of noise for stops, hiss for fricatives, a murmur for nasals and liquids) and a vowel (a harmonic-rich
voiced source whose pitch follows a slowly moving, declining contour, shaped by three formants that glide
from vowel to vowel), with a syllable-rate amplitude envelope, pauses between words and a little
background noise. The transcript sidecar spells the same words. Files and transcripts depend only on
the arguments: the same call writes the same corpus.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
from numpy.lib.stride_tricks import sliding_window_view

from .errors import OptionError
from .storage.files import check_output_file, write_atomic

__all__ = ["FORMATS", "make_corpus", "duration_sample"]

logger = logging.getLogger(__name__)

FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
"""The extensions :func:`make_corpus` writes, and the soundfile container and subtype of each."""
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)

_VOWELS: dict[str, tuple[float, float, float]] = {  # (F1, F2, F3) in Hz for an adult male voice
    "a": (730, 1090, 2440),
    "e": (530, 1840, 2480),
    "i": (270, 2290, 3010),
    "o": (570, 840, 2410),
    "u": (300, 870, 2240),
}
_VOWEL_NAMES = "".join(_VOWELS)
_STOPS, _FRICATIVES, _SONORANTS = "ptkbdg", "fsvzh", "mnlr"
_CONSONANTS = _STOPS + _FRICATIVES + _SONORANTS
_BANDWIDTHS = np.array([90.0, 110.0, 170.0])
_FORMANT_GAINS = np.array([1.0, 0.55, 0.25])


@dataclass(frozen=True)
class _Speaker:
    f0: float  # mean pitch, Hz
    formant_scale: float  # shorter vocal tracts have higher formants
    rate: float  # syllables per second


def _speaker(seed: int, number: int) -> _Speaker:
    rng = np.random.default_rng([seed, 1, number])
    high = number % 2 == 1  # alternate lower and higher voices
    return _Speaker(
        f0=float(rng.uniform(170, 240) if high else rng.uniform(90, 140)),
        formant_scale=float(rng.uniform(1.1, 1.2) if high else rng.uniform(0.95, 1.05)),
        rate=float(rng.uniform(3.8, 5.5)),
    )


def make_corpus(
    out_dir: str | Path,
    *,
    num_files: int = 200,
    seed: int = 0,
    formats: Sequence[str] = ("wav",),
    sample_rate: int = 16000,
    min_seconds: float = 1.0,
    max_seconds: float = 5.0,
    speakers: int = 4,
    with_text: bool = True,
    durations: Sequence[float] | None = None,
) -> list[Path]:
    """Write ``num_files`` speech-like utterances under ``out_dir`` and return their paths, in order.

    File ``i`` belongs to speaker ``i % speakers`` and is ``spkSS/spkSS_IIII.EXT``, with its extension
    taken in turn from ``formats`` (see :data:`FORMATS`) and, with ``with_text``, a ``.txt`` transcript
    beside it. Durations are spread evenly over ``[min_seconds, max_seconds]`` in a shuffled order, unless
    ``durations`` gives one per file (see :func:`duration_sample`).
    """
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise OptionError(f"formats must be a non-empty choice among {sorted(FORMATS)}, not {list(formats)}")
    if "opus" in formats and sample_rate not in _OPUS_RATES:
        raise OptionError(f"opus needs a sample rate among {_OPUS_RATES}, not {sample_rate}")
    if num_files < 0 or speakers < 1 or sample_rate < 8000:
        raise OptionError(
            f"need num_files >= 0, speakers >= 1 and sample_rate >= 8000 (got {num_files}, "
            f"{speakers}, {sample_rate})"
        )
    if durations is None:
        if not 0 < min_seconds <= max_seconds:
            raise OptionError(f"need 0 < min_seconds <= max_seconds, got {min_seconds} and {max_seconds}")
        rng = np.random.default_rng([seed, 0])
        spread = (rng.permutation(num_files) + rng.uniform(size=num_files)) / max(num_files, 1)
        lengths = (min_seconds + spread * (max_seconds - min_seconds)).tolist()
    elif len(durations) != num_files or min(durations, default=1.0) <= 0:
        raise OptionError(f"durations must give {num_files} positive values, got {len(durations)}")
    else:
        lengths = [float(d) for d in durations]
    root = Path(out_dir)
    voices = [_speaker(seed, s) for s in range(speakers)]
    paths: list[Path] = []
    total = 0.0
    for number, seconds in enumerate(lengths):
        speaker = number % speakers
        ext = formats[number % len(formats)]
        audio, words = _utterance(
            np.random.default_rng([seed, 2, number]), seconds, sample_rate, voices[speaker]
        )
        path = root / f"spk{speaker:02d}" / f"spk{speaker:02d}_{number:04d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        container, subtype = FORMATS[ext]
        check_output_file(path)
        soundfile.write(path, audio, sample_rate, format=container, subtype=subtype)
        if with_text:
            write_atomic(str(path.with_suffix(".txt")), " ".join(words).encode("utf-8"))
        paths.append(path)
        total += len(audio) / sample_rate
    logger.info("synthetic corpus: %d files, %.1f min of audio, in %s", len(paths), total / 60, root)
    return paths


def _utterance(
    rng: np.random.Generator, seconds: float, rate: int, voice: _Speaker
) -> tuple[np.ndarray, list[str]]:
    """One utterance of ``seconds`` (float32 mono) and the words it says."""
    n = max(1, round(seconds * rate))
    voiced_env = np.zeros(n, np.float32)
    noise_env = np.zeros(n, np.float32)
    centres: list[float] = []  # sample positions of the vowels, and their formants
    targets: list[tuple[float, float, float]] = []
    words: list[str] = []
    syllable = 1.0 / voice.rate
    t = rng.uniform(0.05, 0.2)
    end = seconds - rng.uniform(0.05, 0.15)
    while True:
        count = int(rng.integers(1, 5))
        letters: list[str] = []
        for _ in range(count):
            pick, vowel_pick = rng.integers(len(_CONSONANTS)), rng.integers(len(_VOWEL_NAMES))
            consonant, vowel = _CONSONANTS[pick], _VOWEL_NAMES[vowel_pick]
            c_len, v_len = syllable * rng.uniform((0.2, 0.45), (0.35, 0.8))
            if t + c_len + v_len > end:
                break
            _consonant(consonant, int(t * rate), int(c_len * rate), rng, voiced_env, noise_env)
            t += c_len
            a, b = int(t * rate), int((t + v_len) * rate)
            voiced_env[a:b] += np.sqrt(np.sin(np.linspace(0, np.pi, b - a))) * rng.uniform(0.7, 1.0)
            centres.append((a + b) / 2)
            targets.append(_VOWELS[vowel])
            letters.append(consonant + vowel)
            t += v_len
        if not letters:
            break
        words.append("".join(letters))
        long_pause = rng.uniform() < 0.15
        t += rng.uniform(0.25, 0.6) if long_pause else rng.uniform(0.04, 0.14)
        if t >= end:
            break
    if not words:  # too short for a syllable: one short vowel
        voiced_env[:] = np.sin(np.linspace(0, np.pi, n)) * 0.8
        centres, targets, words = [n / 2], [_VOWELS["a"]], ["a"]
    source = _glottal(rng, n, rate, voice) * voiced_env
    voiced = _formants(source, rate, centres, targets, voice.formant_scale)
    noise = rng.standard_normal(n + 1, dtype=np.float32)
    hiss = np.diff(noise) * noise_env  # differenced noise: a high-frequency hiss
    audio = voiced + 0.08 * hiss + np.float32(10 ** (-50 / 20)) * noise[1:]
    audio *= np.float32(rng.uniform(0.3, 0.9) / max(float(np.abs(audio).max()), 1e-9))
    return audio.astype(np.float32, copy=False), words


def _consonant(
    letter: str,
    start: int,
    length: int,
    rng: np.random.Generator,
    voiced_env: np.ndarray,
    noise_env: np.ndarray,
) -> None:
    """Add one consonant's envelopes: silence then a burst (stops), hiss (fricatives) or a murmur."""
    if length <= 0:
        return
    ramp = np.sin(np.linspace(0, np.pi, length))
    if letter in _STOPS:
        burst = max(1, length // 4)
        noise_env[start + length - burst : start + length] += np.linspace(1.0, 0.2, burst)
        if letter in "bdg":  # voiced stops murmur through the closure
            voiced_env[start : start + length] += 0.15 * ramp
    elif letter in _FRICATIVES:
        noise_env[start : start + length] += rng.uniform(0.5, 0.9) * ramp
        if letter in "vz":
            voiced_env[start : start + length] += 0.25 * ramp
    else:
        voiced_env[start : start + length] += 0.35 * ramp


def _glottal(rng: np.random.Generator, n: int, rate: int, voice: _Speaker) -> np.ndarray:
    """A sawtooth voice source whose pitch moves: intonation, declination, accents and jitter."""
    seconds = n / rate
    knots = np.arange(0.0, seconds + 0.05, 0.05)
    wander = np.cumsum(rng.normal(0, 0.02, knots.size))
    contour = (
        1
        + 0.12 * np.sin(2 * np.pi * rng.uniform(0.2, 0.5) * knots + rng.uniform(0, 2 * np.pi))
        - 0.15 * knots / max(seconds, 1e-3)
        + wander
        - wander.mean()
    )
    f0 = voice.f0 * np.clip(np.interp(np.arange(n) / rate, knots, contour), 0.6, 1.6)
    cycles = np.cumsum(f0) / rate
    return (2 * (cycles % 1.0) - 1).astype(np.float32)


def _formants(
    source: np.ndarray,
    rate: int,
    centres: list[float],
    targets: list[tuple[float, float, float]],
    scale: float,
) -> np.ndarray:
    """Filter ``source`` frame by frame through three resonances that glide between the vowel targets."""
    hop = rate // 100
    size = 2 * hop
    frames = -(-source.size // hop) + 1
    padded = np.zeros((frames + 1) * hop, np.float32)
    padded[hop : hop + source.size] = source
    # periodic Hann: the overlapping halves of consecutive frames add up to 1
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(size) / size)).astype(np.float32)
    starts = np.arange(frames) * hop
    spectra = np.fft.rfft(sliding_window_view(padded, size)[::hop] * window, axis=1)
    # frame k covers source samples (k-1)*hop .. (k+1)*hop, so it is centred on sample k*hop
    tracks = np.stack([np.interp(starts, centres, [f[i] for f in targets]) for i in range(3)], axis=1)
    tracks = (scale * tracks).astype(np.float32)
    freqs = np.fft.rfftfreq(size, 1 / rate).astype(np.float32)
    response = np.full((frames, freqs.size), 0.02, np.float32)
    for formant in range(3):  # a Lorentzian peak per formant (one 2-D pass each beats a 3-D broadcast)
        detune = (freqs[None, :] - tracks[:, formant, None]) * np.float32(2 / _BANDWIDTHS[formant])
        detune *= detune
        detune += 1
        response += np.float32(_FORMANT_GAINS[formant]) / detune
    shaped = np.fft.irfft(spectra * response, n=size, axis=1)
    out = np.zeros((frames + 1, hop), np.float32)
    out[:-1] += shaped[:, :hop]
    out[1:] += shaped[:, hop:]
    return out.reshape(-1)[hop : hop + source.size]


def duration_sample(
    n: int, profile: str = "librispeech", seed: int = 0, *, low: float = 1.0, high: float = 5.0
) -> np.ndarray:
    """``n`` utterance durations in seconds (float64), drawn from a realistic distribution.

    ``librispeech``: most utterances 10-17 s (about 14.5 s typical), a tail of short ones down to 1 s and
    a few long ones up to 35 s, as in LibriSpeech's training sets. ``uniform``: uniform over
    ``[low, high]`` (1-5 s by default, like segmented speech).
    """
    rng = np.random.default_rng([seed, 3])
    if profile == "uniform":
        if not 0 < low <= high:
            raise OptionError(f"need 0 < low <= high, got {low} and {high}")
        return rng.uniform(low, high, n)
    if profile != "librispeech":
        raise OptionError(f"duration profile must be 'librispeech' or 'uniform', not {profile!r}")
    kind = rng.choice(3, size=n, p=[0.78, 0.17, 0.05])
    body = np.clip(rng.normal(14.5, 1.6, n), 10.0, 17.0)
    short = rng.uniform(1.0, 10.0, n)
    long = rng.uniform(17.0, 35.0, n)
    return np.select([kind == 0, kind == 1], [body, short], long)
