"""Audio decoding from in-memory bytes into float32 ``(channels, frames)`` arrays.

PCM and IEEE-float WAV take a fast path: the RIFF header is parsed straight from the buffer and the
samples converted with ``numpy.frombuffer``, scaled exactly as libsndfile scales them (``int16 / 2**15``,
``int24 / 2**23``, ``int32 / 2**31``, ``(uint8 - 128) / 2**7``; floats are cast), so the values are
identical to ``soundfile.read(..., dtype="float32")``. Anything the fast path does not recognise, and every
other format (flac, ogg, mp3, opus, ...), is decoded by soundfile: FLAC from a file in memory
(:mod:`shardio.reading.memoryfile`), the others from ``io.BytesIO``.

Optional post-processing: a mono mix (the mean of the channels) and band-limited resampling between any
two rates with soxr (libsoxr).
"""

from __future__ import annotations

import logging
import struct
from typing import NamedTuple

import numpy as np
import soundfile

from ..errors import DecodeError, OptionError
from .memoryfile import read_sound

__all__ = ["EncodedAudio", "decode_audio", "decode_encoded", "mix_to_mono", "read_header", "resample"]

logger = logging.getLogger(__name__)


_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
# (format tag, bits per sample) -> (numpy dtype of the stored samples, scale to float32)
_SAMPLE_KINDS: dict[tuple[int, int], tuple[str, np.float32]] = {
    (_PCM, 8): ("u1", np.float32(2.0**-7)),
    (_PCM, 16): ("<i2", np.float32(2.0**-15)),
    (_PCM, 24): ("i3", np.float32(2.0**-31)),  # widened to int32 << 8, then scaled like int32 (as libsndfile)
    (_PCM, 32): ("<i4", np.float32(2.0**-31)),
    (_FLOAT, 32): ("<f4", np.float32(1.0)),
    (_FLOAT, 64): ("<f8", np.float32(1.0)),
}


class WavLayout(NamedTuple):
    offset: int
    frames: int
    channels: int
    sample_rate: int
    dtype: str
    scale: np.float32


class EncodedAudio(NamedTuple):
    """Audio bytes whose header has been read (by :func:`read_header`), to decode with :func:`decode_encoded`.

    A WAV that the fast path takes has its ``layout`` (frames, channels and rate known before decoding);
    anything else has none and is left to soundfile.
    """

    view: memoryview
    ext: str
    where: str
    layout: WavLayout | None


def read_header(data: bytes | bytearray | memoryview, ext: str, *, where: str = "") -> EncodedAudio:
    """The first, cheap half of :func:`decode_audio`: parse a WAV's header, copy nothing, raise nothing.

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
    return EncodedAudio(view, ext, where, layout)


def decode_audio(data: bytes | bytearray | memoryview, ext: str, *, where: str = "", mono: bool = False,
                 sample_rate: int | None = None, check_finite: bool = True,
                 out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
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
    return decode_encoded(read_header(data, ext, where=where), mono=mono, sample_rate=sample_rate,
                          check_finite=check_finite, out=out)


def decode_encoded(encoded: EncodedAudio, *, mono: bool = False, sample_rate: int | None = None,
                   check_finite: bool = True, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The second half of :func:`decode_audio` (same options, results and errors), after :func:`read_header`."""
    if sample_rate is not None and sample_rate <= 0:
        raise OptionError(f"sample_rate must be a positive number of Hz, not {sample_rate}")
    view, ext, where, layout = encoded
    if out is not None and (mono or sample_rate is not None or out.dtype != np.float32 or out.ndim != 2):
        out = None  # the decoded audio is not the final audio: no point in writing it there
    if layout is not None:
        audio, rate, maybe_nonfinite = convert_wav(view, layout, out)
    else:  # the one place to choose another backend (such as torchaudio)
        audio, rate, maybe_nonfinite = _decode_soundfile(view, ext, where, out)
    if audio.shape[1] == 0:
        raise DecodeError(f"{where}: the {ext} audio has no samples (0 frames, {len(view)} bytes); "
                          "expected at least one frame")
    if check_finite and maybe_nonfinite:
        _check_finite(audio, where)
    if mono and audio.shape[0] > 1:
        audio = mix_to_mono(audio)
    if sample_rate is not None and sample_rate != rate:
        audio = resample(audio, rate, sample_rate)
        rate = sample_rate
    return audio, rate


def _check_finite(audio: np.ndarray, where: str) -> None:
    finite = np.isfinite(audio)
    if not finite.all():
        channel, frame = (int(i[0]) for i in np.nonzero(~finite))
        bad = int(finite.size - finite.sum())
        raise DecodeError(f"{where}: the decoded audio holds {bad} NaN or infinite sample(s), the first at "
                          f"frame {frame} of channel {channel}; expected finite samples")


def _fits(out: np.ndarray | None, channels: int, frames: int) -> np.ndarray | None:
    """``out[:, :frames]`` when ``out`` can take audio of that shape, else None."""
    if out is None or out.shape[0] != channels or not 0 < frames <= out.shape[1]:
        return None
    return out[:, :frames]


_INTEGER_SUBTYPES = ("PCM_", "ULAW", "ALAW", "DPCM", "DWVW", "IMA_ADPCM", "MS_ADPCM", "G72", "GSM610", "VOX")
"""libsndfile subtypes of integer samples (FLAC is PCM_16/24): their float32 decoding is always finite."""


def _decode_soundfile(view: memoryview, ext: str, where: str, out: np.ndarray | None = None
                      ) -> tuple[np.ndarray, int, bool]:
    return read_sound(view, ext, where, lambda sound: _read_float32(sound, out))


def _read_float32(sound: soundfile.SoundFile, out: np.ndarray | None) -> tuple[np.ndarray, int, bool]:
    """The audio of an open sound as float32 (into ``out`` when it is mono and fits), its rate, and whether
    its samples may be other than finite."""
    if sound.seekable():
        sound.seek(0)  # as soundfile.read does: MP3 decodes (slightly) differently without it
    target = _fits(out, 1, sound.frames) if sound.channels == 1 else None
    if target is not None:  # mono: libsndfile writes straight into the caller's row
        audio = target[:, : sound.read(out=target[0]).shape[0]]
    else:
        audio = np.ascontiguousarray(sound.read(sound.frames, dtype="float32", always_2d=True).T)
    return audio, int(sound.samplerate), not sound.subtype.startswith(_INTEGER_SUBTYPES)


def convert_wav(view: memoryview, layout: WavLayout, out: np.ndarray | None) -> tuple[np.ndarray, int, bool]:
    """The samples of a WAV whose layout the fast path read, as float32 (written into ``out`` if it fits)."""
    count = layout.frames * layout.channels
    if layout.dtype == "i3":
        raw = np.frombuffer(view, np.uint8, count * 3, layout.offset).reshape(count, 3)
        wide = np.zeros((count, 4), np.uint8)
        wide[:, 1:] = raw
        samples = wide.view("<i4").reshape(count)
    elif layout.dtype == "u1":
        samples = (np.frombuffer(view, np.uint8, count, layout.offset) ^ np.uint8(0x80)).view(np.int8)
    else:
        samples = np.frombuffer(view, layout.dtype, count, layout.offset)
    target = _fits(out, layout.channels, layout.frames)
    if target is None:
        target = np.empty((layout.channels, layout.frames), np.float32)
    source = samples[None] if layout.channels == 1 else samples.reshape(layout.frames, layout.channels).T
    if layout.scale != 1.0:
        # each integer cast to float32 (rounding as libsndfile's C cast does), then scaled by a power of two,
        # which is exact. Two plain SIMD loops, the second over memory just written: 1.4x faster here than one
        # np.multiply(..., dtype=float32, casting="unsafe"), which goes through numpy's buffered casting
        np.copyto(target, source, casting="unsafe")
        target *= layout.scale
    elif layout.dtype == "<f8":
        with np.errstate(over="ignore"):  # float64 beyond float32 becomes inf, as in libsndfile
            np.copyto(target, source, casting="unsafe")
    else:
        np.copyto(target, source)
    return target, layout.sample_rate, layout.scale == 1.0


# the canonical 44-byte header: "RIFF", "WAVE", a 16-byte "fmt " chunk (tag, channels, rate, byte rate, block
# align, bits), then "data" and its size
_CANONICAL = struct.Struct("<4s4x4s4sIHHIIHH4sI")


def wav_layout(view: memoryview) -> WavLayout | None:
    """Where a RIFF/WAVE buffer's samples lie, or None when the fast path should leave it to soundfile."""
    size = len(view)
    if size >= _CANONICAL.size:  # one unpack, no chunk walk
        riff, wave, fmt_id, fmt_size, tag, channels, rate, _, block_align, bits, data_id, data_size = \
            _CANONICAL.unpack_from(view)
        if riff == b"RIFF" and wave == b"WAVE" and fmt_id == b"fmt " and fmt_size == 16 and data_id == b"data":
            if not _fast_path_takes(tag, channels, rate, bits, block_align):
                return None
            return _data_layout((tag, channels, rate, bits, block_align), _CANONICAL.size, data_size, size)
    if size < 12 or view[0:4] != b"RIFF" or view[8:12] != b"WAVE":
        return None
    position = 12
    fmt: tuple[int, int, int, int, int] | None = None
    while position + 8 <= size:
        chunk_id = view[position : position + 4].tobytes()
        (chunk_size,) = struct.unpack_from("<I", view, position + 4)
        body = position + 8
        if chunk_id == b"fmt ":
            if fmt is not None or chunk_size < 16 or body + chunk_size > size:
                return None
            fmt = _read_fmt(view, body, chunk_size)
            if fmt is None:
                return None
        elif chunk_id == b"data":
            return None if fmt is None else _data_layout(fmt, body, chunk_size, size)
        elif body + chunk_size > size:
            return None
        position = body + chunk_size + (chunk_size & 1)
    return None


def _data_layout(fmt: tuple[int, int, int, int, int], body: int, chunk_size: int, size: int) -> WavLayout | None:
    """The layout of a data chunk of ``chunk_size`` bytes at ``body`` in a buffer of ``size`` bytes."""
    if chunk_size == 0:  # may mean "not closed properly", which libsndfile repairs in its own way
        return None
    tag, channels, rate, bits, block_align = fmt
    dtype, scale = _SAMPLE_KINDS[(tag, bits)]
    # a declared size beyond the buffer (truncated, or 0xFFFFFFFF while streaming) reads what is there
    frames = min(chunk_size, size - body) // block_align
    return WavLayout(body, frames, channels, rate, dtype, scale)


def _read_fmt(view: memoryview, body: int, chunk_size: int) -> tuple[int, int, int, int, int] | None:
    tag, channels, rate, _byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", view, body)
    if tag == _EXTENSIBLE:
        if chunk_size < 40:
            return None
        _extra, valid_bits, _mask = struct.unpack_from("<HHI", view, body + 16)
        guid = view[body + 24 : body + 40].tobytes()
        if guid[2:] != _GUID_TAIL or valid_bits not in (0, bits):
            return None
        (tag,) = struct.unpack_from("<H", guid)
    if not _fast_path_takes(tag, channels, rate, bits, block_align):
        return None
    return tag, channels, rate, bits, block_align


def _fast_path_takes(tag: int, channels: int, rate: int, bits: int, block_align: int) -> bool:
    """Whether a fmt chunk's fields describe samples the fast path converts (else soundfile decodes)."""
    return (tag, bits) in _SAMPLE_KINDS and channels > 0 and rate > 0 and block_align == channels * bits // 8


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
        raise OptionError("resampling needs the soxr package (a dependency of shardio): pip install soxr"
                          ) from None
    channels, frames = audio.shape
    target = -(-frames * new_rate // orig_rate)
    pad = -(-orig_rate // new_rate) + 1  # soxr rounds its output length: zeros make it at least `target`
    padded = np.zeros((frames + pad, channels), np.float32)
    padded[:frames] = audio.T
    out = soxr.resample(padded, orig_rate, new_rate, quality="HQ")
    return np.ascontiguousarray(out[:target].T, dtype=np.float32)
