"""Audio made for tests: tones and noise written with numpy + soundfile, in every format libsndfile writes.

Plain functions (no fixtures), so tests, hypothesis strategies and subprocess helpers can all call them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from shardio import synth

__all__ = [
    "FORMATS",
    "SHARED_CORPORA",
    "audio_bytes",
    "make_folder_corpus",
    "tone",
    "write_samples",
    "write_text",
    "write_tone",
]

FORMATS: dict[str, tuple[str, str]] = {**synth.FORMATS, "oga": ("OGG", "VORBIS")}
"""Extension -> (libsndfile format, default subtype): what the synthetic corpora write, plus ``.oga``."""

SHARED_CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
"""The project's shared real corpora, next to the repository; absent in users' clones."""


def tone(
    seconds: float,
    sample_rate: int = 16000,
    channels: int = 1,
    freq: float = 440.0,
    amplitude: float = 0.3,
    seed: int = 0,
) -> np.ndarray:
    """A ``(frames, channels)`` float32 sine (one frequency per channel) plus a little noise."""
    frames = max(int(round(seconds * sample_rate)), 0)
    t = np.arange(frames, dtype=np.float64) / sample_rate
    rng = np.random.default_rng(seed)
    columns = [
        amplitude * np.sin(2 * np.pi * freq * (1 + 0.25 * c) * t) + 0.01 * rng.standard_normal(frames)
        for c in range(channels)
    ]
    return np.stack(columns, axis=1).astype(np.float32) if frames else np.zeros((0, channels), np.float32)


def audio_bytes(samples: np.ndarray, sample_rate: int, ext: str = "wav", subtype: str | None = None) -> bytes:
    """``samples`` encoded in the format of extension ``ext`` (subtype defaulting per :data:`FORMATS`)."""
    file_format, default_subtype = FORMATS[ext]
    buffer = io.BytesIO()
    sf.write(buffer, samples, sample_rate, format=file_format, subtype=subtype or default_subtype)
    return buffer.getvalue()


def write_samples(
    path: str | os.PathLike[str],
    samples: np.ndarray,
    sample_rate: int,
    *,
    format: str | None = None,
    subtype: str | None = None,
) -> Path:
    """Write ``samples`` to ``path``; the format follows the extension unless ``format`` names one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    ext = format or target.suffix[1:].lower()
    target.write_bytes(audio_bytes(samples, sample_rate, ext, subtype))
    return target


def write_tone(
    path: str | os.PathLike[str],
    seconds: float = 0.5,
    sample_rate: int = 16000,
    *,
    format: str | None = None,
    subtype: str | None = None,
    channels: int = 1,
    freq: float = 440.0,
    seed: int = 0,
) -> Path:
    """Write a tone of ``seconds`` to ``path`` (format from the extension unless given); returns the path."""
    return write_samples(
        path,
        tone(seconds, sample_rate, channels, freq, seed=seed),
        sample_rate,
        format=format,
        subtype=subtype,
    )


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write a UTF-8 text file (a transcript sidecar, a manifest, a Kaldi table)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def make_folder_corpus(
    root: str | os.PathLike[str],
    count: int,
    *,
    formats: Sequence[str] = ("wav",),
    seconds: tuple[float, float] = (0.2, 0.6),
    sample_rate: int = 8000,
    texts: bool = True,
    subdirs: int = 3,
    seed: int = 0,
) -> list[Path]:
    """``count`` tones under ``root`` (spread over ``subdirs`` folders, formats taken in turn) with ``.txt``
    transcripts; returns the audio paths in the order the folder reader yields them (sorted)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        ext = formats[i % len(formats)]
        path = Path(root) / f"d{i % max(subdirs, 1)}" / f"utt{i:05d}.{ext}"
        write_tone(path, float(rng.uniform(*seconds)), sample_rate, freq=200.0 + 10 * (i % 50), seed=i)
        if texts:
            write_text(path.with_suffix(".txt"), f"utterance number {i}")
        paths.append(path)
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())
