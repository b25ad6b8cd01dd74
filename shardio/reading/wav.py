"""The PCM and IEEE-float WAV fast path: the RIFF header parsed straight from the buffer, and the samples
converted with ``numpy.frombuffer``, scaled exactly as libsndfile scales them (``int16 / 2**15``,
``int24 / 2**23``, ``int32 / 2**31``, ``(uint8 - 128) / 2**7``; floats are cast), so the values are identical
to ``soundfile.read(..., dtype="float32")``. A WAV it does not recognise is left to soundfile
(:mod:`shardio.reading.decode`)."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

__all__ = ["WavLayout", "convert_wav", "decode_rows", "fits", "planar", "wav_layout", "wav_layouts"]


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


def fits(out: np.ndarray | None, channels: int, frames: int) -> np.ndarray | None:
    """``out[:, :frames]`` when ``out`` can take audio of that shape, else None."""
    if out is None or out.shape[0] != channels or not 0 < frames <= out.shape[1]:
        return None
    return out[:, :frames]


def planar(samples: np.ndarray, layout: WavLayout) -> np.ndarray:
    """A WAV's interleaved samples as a ``(channels, frames)`` view."""
    return samples[None] if layout.channels == 1 else samples.reshape(layout.frames, layout.channels).T


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
    target = fits(out, layout.channels, layout.frames)
    if target is None:
        target = np.empty((layout.channels, layout.frames), np.float32)
    source = planar(samples, layout)
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


def decode_rows(audio: list[tuple[memoryview, WavLayout]], rows: np.ndarray) -> list[np.ndarray]:
    """A batch's WAVs (each with the layout :func:`wav_layouts` read, which fits its row) decoded into the
    rows of ``rows``, a ``(B, channels, T)`` batch: float32 rows as :func:`convert_wav` converts, int16 rows
    as stored (16-bit PCM only); what lies past a row's audio is left to the caller
    (:func:`~shardio.reading.batchmemory.clear_padding`). Each sample's audio, a view of its row."""
    decoded = []
    for (view, layout), row in zip(audio, rows):
        if rows.dtype == np.int16:
            samples = np.frombuffer(view, "<i2", layout.frames * layout.channels, layout.offset)
            target = row[:, : layout.frames]
            np.copyto(target, planar(samples, layout))
        else:
            target = convert_wav(view, layout, row)[0]
        decoded.append(target)
    return decoded


def wav_layouts(views: list[memoryview]) -> list[WavLayout | None]:
    """:func:`wav_layout` of each of a batch's WAVs."""
    return [wav_layout(view) for view in views]


# the canonical 44-byte header: "RIFF", "WAVE", a 16-byte "fmt " chunk (tag, channels, rate, byte rate, block
# align, bits), then "data" and its size
_CANONICAL = struct.Struct("<4s4x4s4sIHHIIHH4sI")


def wav_layout(view: memoryview) -> WavLayout | None:
    """Where a RIFF/WAVE buffer's samples lie, or None when the fast path should leave it to soundfile."""
    size = len(view)
    if size >= _CANONICAL.size:  # one unpack, no chunk walk
        riff, wave, fmt_id, fmt_size, tag, channels, rate, _, block_align, bits, data_id, data_size = (
            _CANONICAL.unpack_from(view)
        )
        if (
            riff == b"RIFF"
            and wave == b"WAVE"
            and fmt_id == b"fmt "
            and fmt_size == 16
            and data_id == b"data"
        ):
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


def _data_layout(
    fmt: tuple[int, int, int, int, int], body: int, chunk_size: int, size: int
) -> WavLayout | None:
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
