"""PCM16: audio as int16 (``decoding=Decoding(dtype="int16")``), half the bytes of float32 to move and hold.

16-bit PCM (WAV, and FLAC through libsndfile) is copied as it is stored, with no cast or scale: the model
converts on the GPU (``batch["audio"].cuda().float() / 32768``, exactly the float32 batch). Anything else is
decoded to float32 as usual (mixed, resampled, transformed), then rounded to the nearest step of 1/32768 and
clipped to [-32768, 32767].
"""

from __future__ import annotations

from typing import Any

import numpy as np
import soundfile

from .decode import EncodedAudio, check_frames_read, check_layout, check_rate, frames_to_read
from .memoryfile import read_sound
from .wav import planar

__all__ = ["decode_pcm16", "to_int16"]


def to_int16(audio: Any) -> np.ndarray:
    """Float audio (numpy, or a CPU tensor) in [-1, 1) as int16 steps of 1/32768, rounded and clipped."""
    scaled = np.rint(np.asarray(audio, dtype=np.float32) * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def decode_pcm16(encoded: EncodedAudio, out: np.ndarray | None) -> tuple[np.ndarray, int] | None:
    """The int16 samples of 16-bit PCM audio, as stored (into ``out[:, :frames]``, an int16 ``(channels, T)``
    array, when they fit), and its rate; None when the audio is not 16-bit PCM (decode it as float32)."""
    view, ext, where, layout = encoded.view, encoded.ext, encoded.where, encoded.layout
    if layout is not None:
        if layout.dtype != "<i2" or layout.frames == 0:
            return None
        check_layout(encoded, layout)
        samples = np.frombuffer(view, "<i2", layout.frames * layout.channels, layout.offset)
        source = planar(samples, layout)
        target = _fits(out, layout.channels, layout.frames)
        if target is None:
            return np.ascontiguousarray(source, dtype=np.int16), layout.sample_rate
        np.copyto(target, source)
        return target, layout.sample_rate
    stored = read_sound(view, ext, where, lambda sound: _read_int16(sound, out, encoded))
    if stored is not None:
        check_rate(encoded, stored[1])
    return stored


def _read_int16(
    sound: soundfile.SoundFile, out: np.ndarray | None, encoded: EncodedAudio
) -> tuple[np.ndarray, int] | None:
    """The samples of an open 16-bit PCM sound, as stored (into ``out`` when it is mono and fits), and its
    rate; None for any other sound."""
    if sound.subtype != "PCM_16" or sound.frames <= 0:
        return None
    if sound.seekable():
        sound.seek(0)
    frames = frames_to_read(sound, encoded)
    target = _fits(out, 1, frames) if sound.channels == 1 else None
    if target is not None:
        audio = target[:, : sound.read(out=target[0]).shape[0]]
    else:
        audio = np.ascontiguousarray(sound.read(frames, dtype="int16", always_2d=True).T)
    check_frames_read(audio.shape[1], sound, encoded)
    return audio, int(sound.samplerate)


def _fits(out: np.ndarray | None, channels: int, frames: int) -> np.ndarray | None:
    if (
        out is None
        or out.dtype != np.int16
        or out.ndim != 2
        or out.shape[0] != channels
        or not 0 < frames <= out.shape[1]
    ):
        return None
    return out[:, :frames]
