"""PCM16: audio as int16 (``decoding=Decoding(dtype="int16")``), half the bytes of float32 to move and hold.

16-bit PCM (WAV, and FLAC through libsndfile) is copied as it is stored, with no cast or scale: the model
converts on the GPU (``batch["audio"].cuda().float() / 32768``, exactly the float32 batch). Anything else is
decoded to float32 as usual (mixed, resampled, transformed), then rounded to the nearest step of 1/32768 and
clipped to [-32768, 32767].

The decoded cache keeps 16-bit sources as int16 and makes their float32 audio as ``int16 * 2**-15``
(:func:`decode_steps`, :func:`to_float32`): for the WAV fast path that is its conversion itself; for a
libsndfile format it is used only where :func:`scales_exactly` proved, once per process, that libsndfile's
own float32 decoding of every 16-bit value in that format is exactly that, bit for bit.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import soundfile

from .decode import EncodedAudio, check_frames_read, check_layout, check_rate, frames_to_read
from .memoryfile import read_sound
from .wav import fits, planar

__all__ = [
    "PCM_EXTENSIONS",
    "SCALE",
    "decode_pcm16",
    "decode_steps",
    "scales_exactly",
    "to_float32",
    "to_int16",
]

SCALE = np.float32(2.0**-15)
"""What a 16-bit step is in float32 audio (a power of two: the product of an int16 and it is exact)."""
PCM_EXTENSIONS = frozenset({"flac", "wav", "wave", "aif", "aiff", "w64", "caf", "au"})
"""Extensions of the formats :func:`decode_steps` looks into: those that may hold 16-bit PCM."""
_PROVEN: dict[tuple[str, str], bool] = {}  # (libsndfile format, subtype) -> scales_exactly's answer


def to_int16(audio: Any) -> np.ndarray:
    """Float audio (numpy, or a CPU tensor) in [-1, 1) as int16 steps of 1/32768, rounded and clipped."""
    scaled = np.rint(np.asarray(audio, dtype=np.float32) * np.float32(32768.0))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def decode_pcm16(
    encoded: EncodedAudio, out: np.ndarray | None, *, exact: bool = False
) -> tuple[np.ndarray, int] | None:
    """The int16 samples of 16-bit PCM audio, as stored (into ``out[:, :frames]``, an int16 ``(channels, T)``
    array, when they fit), and its rate; None when the audio is not 16-bit PCM (decode it as float32), or,
    with ``exact``, where its float32 decoding is not known to be exactly ``int16 * 2**-15`` (see
    :func:`decode_steps`)."""
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
    stored = read_sound(view, ext, where, lambda sound: _read_int16(sound, out, encoded, exact))
    if stored is not None:
        check_rate(encoded, stored[1])
    return stored


def decode_steps(encoded: EncodedAudio, out: np.ndarray | None) -> tuple[np.ndarray, int] | None:
    """What :func:`~shardio.reading.decode.decode_encoded` (without mono mix or resampling) makes of 16-bit
    PCM audio, as its int16 steps: its float32 audio is exactly :func:`to_float32` of them, bit for bit. For
    WAV the fast path reads, that is how it converts; for a format libsndfile decodes, where
    :func:`scales_exactly` proved it of libsndfile. Into ``out`` (an int16 ``(channels, T)`` array) when it
    fits; None for other audio (decode it as float32), with the same errors as ``decode_encoded``. Audio of
    an extension outside :data:`PCM_EXTENSIONS` is not opened (None): lossy formats hold no 16-bit PCM, and
    an Ogg file's opening costs ~8% of its decoding."""
    if encoded.layout is None and encoded.ext not in PCM_EXTENSIONS:
        return None
    return decode_pcm16(encoded, out, exact=True)


def to_float32(steps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Int16 ``(channels, frames)`` steps as float32 ``steps * 2**-15`` (into ``out[:, :frames]``, a float32
    ``(channels, T)`` array, when it fits): cast, then scaled by a power of two, as the WAV fast path
    converts (two plain loops: cheaper than one ``np.multiply`` through numpy's buffered casting)."""
    target = fits(out, *steps.shape) if out is not None and out.dtype == np.float32 else None
    if target is None:
        target = np.empty(steps.shape, np.float32)
    np.copyto(target, steps, casting="unsafe")
    target *= SCALE
    return target


def scales_exactly(format: str, subtype: str) -> bool:
    """Whether libsndfile decodes 16-bit audio of ``format`` and ``subtype`` (a ``SoundFile``'s, such as
    ``"FLAC"``, ``"PCM_16"``) to float32 as exactly ``int16 * 2**-15``: proven once per process, by decoding
    every int16 value, written in that format, both as int16 and as float32 and comparing them bit for bit."""
    known = _PROVEN.get((format, subtype))
    if known is None:
        known = _PROVEN[(format, subtype)] = _prove(format, subtype)
    return known


def _prove(format: str, subtype: str) -> bool:
    steps = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16).reshape(-1, 2)  # two channels
    try:
        written = io.BytesIO()
        soundfile.write(written, steps, 8000, format=format, subtype=subtype)
        read = [
            soundfile.read(io.BytesIO(written.getvalue()), dtype=dtype, always_2d=True)[0]
            for dtype in ("int16", "float32")
        ]
    except (RuntimeError, ValueError, TypeError, EOFError, OSError):  # a format libsndfile does not write
        return False
    ints, floats = read
    if ints.shape != steps.shape or not np.array_equal(ints, steps) or floats.dtype != np.float32:
        return False
    return bool((ints.astype(np.float32) * SCALE).tobytes() == floats.tobytes())


def _read_int16(
    sound: soundfile.SoundFile, out: np.ndarray | None, encoded: EncodedAudio, exact: bool = False
) -> tuple[np.ndarray, int] | None:
    """The samples of an open 16-bit PCM sound, as stored (into ``out`` when it is mono and fits), and its
    rate; None for any other sound (with ``exact``: or one whose format :func:`scales_exactly` does not
    hold for)."""
    if sound.subtype != "PCM_16" or sound.frames <= 0:
        return None
    if exact and not scales_exactly(sound.format, sound.subtype):
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
