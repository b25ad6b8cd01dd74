"""Audio decoding from in-memory bytes into float32 ``(channels, frames)`` arrays.

PCM and IEEE-float WAV take a fast path (:mod:`shardio.reading.wav`), exact to libsndfile's values. Anything
the fast path does not recognise, and every other format (flac, ogg, mp3, opus, ...), is decoded by soundfile:
FLAC from a file in memory (:mod:`shardio.reading.memoryfile`), the others from ``io.BytesIO``.

Optional post-processing: a mono mix (the mean of the channels) and band-limited resampling between any
two rates with soxr (libsoxr).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import soundfile

from ..errors import DecodeError, OptionError
from .memoryfile import read_sound
from .wav import WavLayout, convert_wav, fits, wav_layout

__all__ = [
    "MAX_RESAMPLING",
    "EncodedAudio",
    "check_frames_read",
    "check_layout",
    "check_rate",
    "decode_audio",
    "decode_encoded",
    "frames_to_read",
    "mix_to_mono",
    "read_header",
    "resample",
]

logger = logging.getLogger(__name__)


class EncodedAudio(NamedTuple):
    """Audio bytes whose header has been read (by :func:`read_header`), to decode with :func:`decode_encoded`.

    A WAV that the fast path takes has its ``layout`` (frames, channels and rate known before decoding);
    anything else has none and is left to soundfile.
    """

    view: memoryview
    ext: str
    where: str
    layout: WavLayout | None
    frames: int | None = None
    """The frames the index records for the sample: the decoder reads no more (more is a
    :class:`~shardio.errors.DecodeError`), whatever the header claims. None: as many as the header says."""
    rate: int | None = None
    """The sample rate the index records: another one in the header is a
    :class:`~shardio.errors.DecodeError`."""


def read_header(
    data: bytes | bytearray | memoryview,
    ext: str,
    *,
    where: str = "",
    frames: int | None = None,
    rate: int | None = None,
) -> EncodedAudio:
    """The first, cheap half of :func:`decode_audio`: parse a WAV's header, copy nothing, raise nothing.
    ``frames`` and ``rate``: what the index records for the sample (see :class:`EncodedAudio`).

    Split off so that a batch can read every sample's header before it decodes any: decoding streams the
    whole sample through the CPU caches, and small work done between two decodes runs from cold caches.
    """
    ext = ext.lower().lstrip(".")
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    where = where or "<audio bytes>"
    layout = None
    if ext in ("wav", "wave"):
        layout = wav_layout(view)
        if layout is None:
            logger.debug("%s: WAV fast path does not apply; decoding with soundfile", where)
    return EncodedAudio(view, ext, where, layout, frames, rate)


def decode_audio(
    data: bytes | bytearray | memoryview,
    ext: str,
    *,
    where: str = "",
    mono: bool = False,
    sample_rate: int | None = None,
    check_finite: bool = True,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Decode audio bytes into a C-contiguous float32 ``(channels, frames)`` array and its sample rate.

    ``ext`` is the member's extension (``wav``, ``flac``, ``ogg``, ``mp3``, ``opus``, ...) and ``where`` names
    the bytes in error messages (shard, key, offset). ``mono`` averages the channels into one;
    ``sample_rate`` resamples to that rate (the returned rate is then ``sample_rate``). Raises
    :class:`~shardio.errors.DecodeError` for bytes that are not decodable audio, for zero frames, and (with
    ``check_finite``) for NaN or infinite samples.

    ``out``, a float32 ``(channels, T)`` array, receives the audio in ``out[:, :frames]`` (and that view is
    returned) when the audio has that many channels (one, for formats other than WAV), at most ``T`` frames,
    and no mono mix or resampling is asked; otherwise it is left alone and a new array is returned. A batch
    is so decoded in place, without a copy of each sample.
    """
    return decode_encoded(
        read_header(data, ext, where=where),
        mono=mono,
        sample_rate=sample_rate,
        check_finite=check_finite,
        out=out,
    )


def decode_encoded(
    encoded: EncodedAudio,
    *,
    mono: bool = False,
    sample_rate: int | None = None,
    check_finite: bool = True,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """The second half of :func:`decode_audio` (same options, results and errors), after
    :func:`read_header`."""
    if sample_rate is not None and sample_rate <= 0:
        raise OptionError(f"sample_rate must be a positive number of Hz, not {sample_rate}")
    view, ext, where, layout = encoded.view, encoded.ext, encoded.where, encoded.layout
    if out is not None and (mono or sample_rate is not None or out.dtype != np.float32 or out.ndim != 2):
        out = None  # the decoded audio is not the final audio: no point in writing it there
    if layout is not None:
        check_layout(encoded, layout)
        audio, rate, maybe_nonfinite = convert_wav(view, layout, out)
    else:  # the one place to choose another backend (such as torchaudio)
        audio, rate, maybe_nonfinite = _decode_soundfile(encoded, out)
        check_rate(encoded, rate)
    if audio.shape[1] == 0:
        raise DecodeError(
            f"{where}: the {ext} audio has no samples (0 frames, {len(view)} bytes); "
            "expected at least one frame"
        )
    if check_finite and maybe_nonfinite:
        _check_finite(audio, where)
    if mono and audio.shape[0] > 1:
        audio = mix_to_mono(audio)
    if sample_rate is not None and sample_rate != rate:
        if sample_rate > MAX_RESAMPLING * rate:
            raise DecodeError(
                f"{where}: resampling {rate} Hz audio to {sample_rate} Hz would make "
                f"{sample_rate / rate:.0f} times as many samples; shardio resamples by at most "
                f"{MAX_RESAMPLING}x (expected audio at a rate of at least "
                f"{-(-sample_rate // MAX_RESAMPLING)} Hz)"
            )
        audio = resample(audio, rate, sample_rate)
        rate = sample_rate
    return audio, rate


def _check_finite(audio: np.ndarray, where: str) -> None:
    finite = np.isfinite(audio)
    if not finite.all():
        channel, frame = (int(i[0]) for i in np.nonzero(~finite))
        bad = int(finite.size - finite.sum())
        raise DecodeError(
            f"{where}: the decoded audio holds {bad} NaN or infinite sample(s), the first at "
            f"frame {frame} of channel {channel}; expected finite samples"
        )


MAX_RESAMPLING = 64
"""The most times as many samples resampling may make of a sample (8 kHz to 48 kHz is 6): more would let a
sample's rate decide how much memory its bytes take."""

_INTEGER_SUBTYPES = ("PCM_", "ULAW", "ALAW", "DPCM", "DWVW", "IMA_ADPCM", "MS_ADPCM", "G72", "GSM610", "VOX")
"""libsndfile subtypes of integer samples (FLAC is PCM_16/24): their float32 decoding is always finite."""


def _decode_soundfile(encoded: EncodedAudio, out: np.ndarray | None = None) -> tuple[np.ndarray, int, bool]:
    return read_sound(
        encoded.view, encoded.ext, encoded.where, lambda sound: _read_float32(sound, out, encoded)
    )


def _read_float32(
    sound: soundfile.SoundFile, out: np.ndarray | None, encoded: EncodedAudio
) -> tuple[np.ndarray, int, bool]:
    """The audio of an open sound as float32 (into ``out`` when it is mono and fits), its rate, and whether
    its samples may be other than finite."""
    if sound.seekable():
        sound.seek(0)  # as soundfile.read does: MP3 decodes (slightly) differently without it
    frames = frames_to_read(sound, encoded)
    target = fits(out, 1, frames) if sound.channels == 1 else None
    if target is not None:  # mono: libsndfile writes straight into the caller's row
        audio = target[:, : sound.read(out=target[0]).shape[0]]
    else:
        audio = np.ascontiguousarray(sound.read(frames, dtype="float32", always_2d=True).T)
    check_frames_read(audio.shape[1], sound, encoded)
    return audio, int(sound.samplerate), not sound.subtype.startswith(_INTEGER_SUBTYPES)


def frames_to_read(sound: soundfile.SoundFile, encoded: EncodedAudio) -> int:
    """The frames to read of an open sound: as many as its header claims, but at most one more than its index
    records, so that a header cannot make the decoder allocate for audio its bytes do not hold."""
    limit = encoded.frames
    return sound.frames if limit is None or sound.frames <= limit else limit + 1


def check_frames_read(frames: int, sound: soundfile.SoundFile, encoded: EncodedAudio) -> None:
    """A :class:`~shardio.errors.DecodeError` where ``frames`` read (see :func:`frames_to_read`) are more
    than the index records."""
    if encoded.frames is not None and frames > encoded.frames:
        raise DecodeError(
            f"{encoded.where}: the {encoded.ext} audio holds more than the {encoded.frames} frames "
            f"the index records (its header claims {sound.frames}); expected the sample the index "
            "describes: re-pack or re-index the shard"
        )


def check_rate(encoded: EncodedAudio, rate: int) -> None:
    """A :class:`~shardio.errors.DecodeError` where the audio's ``rate`` is not the one the index records."""
    if encoded.rate is not None and rate != encoded.rate:
        raise DecodeError(
            f"{encoded.where}: the {encoded.ext} audio is at {rate} Hz where the index records "
            f"{encoded.rate} Hz; expected the sample the index describes: re-pack or re-index the "
            "shard"
        )


def check_layout(encoded: EncodedAudio, layout: WavLayout) -> None:
    """:func:`check_rate` and the frame count of a WAV whose layout the fast path read, before decoding."""
    check_rate(encoded, layout.sample_rate)
    if encoded.frames is not None and layout.frames > encoded.frames:
        raise DecodeError(
            f"{encoded.where}: the WAV header claims {layout.frames} frames where the index records "
            f"{encoded.frames}; expected the sample the index describes: re-pack or re-index the "
            "shard"
        )


def mix_to_mono(audio: np.ndarray) -> np.ndarray:
    """The mean of the channels of a ``(channels, frames)`` array, as ``(1, frames)`` float32."""
    return np.ascontiguousarray(audio.mean(axis=0, keepdims=True, dtype=np.float32))


def resample(audio: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Resample ``(channels, frames)`` float32 audio from ``orig_rate`` to ``new_rate`` Hz, any two rates.

    With `soxr <https://github.com/dofuuz/python-soxr>`_ (libsoxr's "HQ" quality: a linear-phase filter of
    about 120 dB stop-band attenuation, pass band flat to 0.91 of the lower Nyquist frequency, its delay
    removed). Output sample ``n`` is at time ``n / new_rate``, and there are
    ``ceil(frames * new_rate / orig_rate)`` of them (the input is zero-padded past its end for the last).
    """
    if orig_rate <= 0 or new_rate <= 0:
        raise OptionError(f"sample rates must be positive, not {orig_rate} -> {new_rate}")
    if audio.ndim != 2:
        raise OptionError(f"resample takes (channels, frames) audio, not an array of shape {audio.shape}")
    if orig_rate == new_rate:
        return audio
    try:
        import soxr
    except ImportError:  # a core dependency: only a broken install lacks it
        raise OptionError(
            "resampling needs the soxr package (a dependency of shardio): pip install soxr"
        ) from None
    channels, frames = audio.shape
    target = -(-frames * new_rate // orig_rate)
    pad = -(-orig_rate // new_rate) + 1  # soxr rounds its output length: zeros make it at least `target`
    padded = np.zeros((frames + pad, channels), np.float32)
    padded[:frames] = audio.T
    out = soxr.resample(padded, orig_rate, new_rate, quality="HQ")
    return np.ascontiguousarray(out[:target].T, dtype=np.float32)
