"""One corpus input made ready for a shard: read, validated, and (when asked, or for a segment) encoded.

:func:`prepare` runs in :func:`shardio.packing.pack.pack`'s worker threads, so everything here is a plain
function of a picklable :class:`Task`. A whole file is validated at the task's level
(:mod:`shardio.packing.structure`): its container's structure, sizes and checksums, its frames from its
headers where they are exact; at ``decode``, or where headers do not say, by the loader's own decoder
(:func:`shardio.reading.decode.decode_audio`) as well, so whatever pack accepts, training can decode. Its
bytes are kept unless ``transcode`` asks for another format. A segment (``offset``/``duration``) is cut from
the recording and encoded as FLAC (or WAV), with integer PCM kept exact.
"""

from __future__ import annotations

import contextlib
import io
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

import numpy as np
import soundfile as sf

from ..errors import DecodeError, InputProblem
from ..reading.decode import decode_audio
from ..reading.fields import BATCH_FIELDS
from .corpus import Source
from .source import open_regular_input
from .structure import DEFAULT_VALIDATE, Malformed, structure_facts
from .truncation import truncation_problem

__all__ = ["Prepared", "Task", "prepare"]

_CONTAINERS = {
    "wav": ("WAV", "WAVEX", "RF64"),
    "flac": ("FLAC",),
    "ogg": ("OGG",),
    "oga": ("OGG",),
    "opus": ("OGG",),
    "mp3": ("MP3",),
}
_INT16 = ("PCM_16", "PCM_S8", "PCM_U8", "ULAW", "ALAW")
_WHOLE_TOLERANCE = 0.01  # seconds: a segment [0, d] this close to the recording's end is the whole file
_END_TOLERANCE = 0.1  # seconds a segment may run past the recording's end (clipped), as Kaldi's often do
_T = TypeVar("_T")


@dataclass(frozen=True)
class Task:
    """One source to prepare under ``key``."""

    source: Source
    key: str
    transcode: str | None
    validate: str = DEFAULT_VALIDATE
    """One of :data:`shardio.packing.structure.VALIDATE_LEVELS`."""


@dataclass(frozen=True)
class Prepared:
    """A sample ready for :meth:`shardio.shards.writer.ShardWriter.write`."""

    key: str
    members: dict[str, bytes]
    audio_ext: str
    num_frames: int
    sample_rate: int
    channels: int
    input_bytes: int


class _Reject(Exception):
    """An input that fails validation; the message is the reason."""


def prepare(task: Task) -> Prepared | InputProblem:
    """Read, validate and (when asked) transcode one source; runs in a pool worker."""
    source = task.source
    clash = BATCH_FIELDS.intersection(source.meta)
    if clash:
        return InputProblem(
            source.where,
            task.key,
            f"the metadata field(s) {', '.join(map(repr, sorted(clash)))} "
            "have the name of a field shardio gives every batch "
            f"({', '.join(sorted(BATCH_FIELDS))}): rename them",
        )
    try:
        ext, data, frames, rate, channels = _load(source, task.transcode, task.validate)
    except _Reject as exc:
        return InputProblem(source.where, task.key, str(exc))
    meta = {**source.meta, "duration": round(frames / rate, 6)}
    if source.offset is not None:
        meta["offset"] = source.offset
    try:
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:  # NaN, infinity or a value JSON has no form for, from an importer
        return InputProblem(
            source.where,
            task.key,
            f"the metadata cannot be written as JSON ({exc}); expected "
            "strings, finite numbers, booleans, null, lists and objects",
        )
    return Prepared(
        task.key, {ext: data, "json": text.encode("utf-8")}, ext, frames, rate, channels, len(data)
    )


def _load(source: Source, transcode: str | None, validate: str) -> tuple[str, bytes, int, int, int]:
    """``(member ext, audio bytes, frames, sample rate, channels)`` of a validated source."""
    path = source.audio_path
    data = _member_bytes(source) if source.member else b""
    if source.offset is not None:
        with contextlib.closing(io.BytesIO(data) if source.member else _opened(path)) as file:

            def opened() -> BinaryIO:
                file.seek(0)
                return file

            info = _decoding(path, lambda: sf.info(opened()))
            start, stop = _segment_frames(source, info.frames, info.samplerate)
            if not (start == 0 and stop >= info.frames - round(_WHOLE_TOLERANCE * info.samplerate)):
                audio, rate, subtype = _decoding(
                    path, lambda: _read(opened(), source.ext, start, stop - start)
                )
                target = transcode or "flac"
                return target, _encode(audio, rate, subtype, target), len(audio), rate, audio.shape[1]
    if not source.member:
        with _opened(path) as handle:
            try:
                data = handle.read()
            except OSError as exc:
                raise _Reject(f"cannot read the file: {exc.strerror or exc}") from None
    if not data:
        raise _Reject("the file is empty (0 bytes)")
    _check_magic(data, source.ext)
    try:
        facts = structure_facts(data, source.ext)
    except Malformed as exc:
        raise _Reject(str(exc)) from None
    if transcode is None or transcode == source.ext:
        if facts is not None and validate == "structure":
            return source.ext, data, *facts
        try:  # validated by the loader's own decoder: what pack accepts, training can decode
            planar, rate = decode_audio(data, source.ext, where=path)
        except DecodeError as exc:
            raise _Reject(str(exc).removeprefix(f"{path}: ")) from None
        _check_complete(data, source.ext, planar.shape[1])
        decoded = (planar.shape[1], rate, planar.shape[0])
        _check_agree(facts, decoded, source.ext)
        return source.ext, data, *decoded
    audio, rate, subtype = _decoding(path, lambda: _read(io.BytesIO(data), source.ext, 0, -1))
    _check_complete(data, source.ext, len(audio))
    _check_agree(facts, (len(audio), rate, audio.shape[1]), source.ext)
    return transcode, _encode(audio, rate, subtype, transcode), len(audio), rate, audio.shape[1]


def _opened(path: str) -> BinaryIO:
    """The audio file ``path`` opened for reading; a FIFO, device, socket or directory is rejected (a FIFO
    would block the read until a writer came, ``/dev/zero`` would never end), as is a file that is missing,
    or a path holding a NUL (from a manifest: no file name can)."""
    if "\x00" in path:
        raise _Reject("the path holds a NUL character, which no file name can")
    try:
        return open_regular_input(path)
    except FileNotFoundError:
        raise _Reject("file not found") from None
    except OSError as exc:
        raise _Reject(f"cannot read the file: {exc.strerror or exc}") from None


def _member_bytes(source: Source) -> bytes:
    """The bytes of audio stored inside another file (see
    :mod:`shardio.integrations.importers.containers`)."""
    from ..integrations.importers.containers import read_member

    try:
        return read_member(source.audio_path, source.member)
    except FileNotFoundError:
        raise _Reject("file not found") from None
    except (OSError, KeyError, ValueError) as exc:
        raise _Reject(f"cannot read member {source.member!r}: {exc}") from None


def _check_complete(data: bytes, ext: str, frames: int) -> None:
    """Reject a file whose header claims more audio than it holds (a decoder reads it as a shorter clip)."""
    problem = truncation_problem(data, ext, frames)
    if problem is not None:
        raise _Reject(problem)


def _check_agree(facts: tuple[int, int, int] | None, decoded: tuple[int, int, int], ext: str) -> None:
    """Reject a file that decodes to other frames, rate or channels than its headers say."""
    if facts is not None and facts != decoded:
        raise _Reject(
            f"the {ext} headers say {facts[0]} frames at {facts[1]} Hz x {facts[2]} channels, it decodes to "
            f"{decoded[0]} frames at {decoded[1]} Hz x {decoded[2]} channels"
        )


def _check_magic(data: bytes, ext: str) -> None:
    """Reject content whose container is not the one the extension names (readers pick decoders by it)."""
    if data[:4] in (b"RIFF", b"RF64") and data[8:12] == b"WAVE":
        found = "WAV"
    elif data[:4] == b"fLaC":
        found = "FLAC"
    elif data[:4] == b"OggS":
        found = "OGG"
    elif data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        found = "MP3"  # an ID3 tag or an MPEG frame sync
    else:
        raise _Reject(
            f"the content is not {' or '.join(_CONTAINERS[ext])} audio (its first bytes are no audio "
            f"container's signature), as the extension .{ext} says"
        )
    if found not in _CONTAINERS[ext] and not (found == "MP3" and data[:3] == b"ID3" and ext == "flac"):
        raise _Reject(
            f"the content is {found} audio, but the extension .{ext} says {' or '.join(_CONTAINERS[ext])}"
        )


def _decoding(path: str, action: Callable[[], _T]) -> _T:
    """Run a soundfile call, turning its errors into a rejection with libsndfile's reason."""
    try:
        return action()
    except FileNotFoundError:
        raise _Reject("file not found") from None
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise _Reject(
            f"could not be decoded as audio ({getattr(exc, 'error_string', None) or exc})"
        ) from None


def _read(file: BinaryIO, ext: str, start: int, frames: int) -> tuple[np.ndarray, int, str]:
    """Decode ``frames`` frames from ``start`` (-1: to the end) as ``(frames, channels)`` and check them."""
    with sf.SoundFile(file) as sound:
        if sound.format not in _CONTAINERS[ext]:
            raise _Reject(
                f"the content is {sound.format} audio, but the extension .{ext} says "
                f"{' or '.join(_CONTAINERS[ext])}"
            )
        dtype = (
            "int16"
            if sound.subtype in _INT16
            else "int32"
            if sound.subtype in ("PCM_24", "PCM_32")
            else "float64"
            if sound.subtype == "DOUBLE"
            else "float32"
        )
        if start:
            sound.seek(start)
        audio = sound.read(frames, dtype=dtype, always_2d=True)
        rate, subtype = sound.samplerate, sound.subtype
    if audio.shape[0] == 0:
        raise _Reject("the audio has no samples (0 frames); expected at least one frame")
    if audio.dtype.kind == "f" and not np.isfinite(audio).all():
        raise _Reject(
            f"the decoded audio holds {int((~np.isfinite(audio)).sum())} NaN or infinite sample(s); "
            "expected finite samples"
        )
    return audio, rate, subtype


def _segment_frames(source: Source, total: int, rate: int) -> tuple[int, int]:
    offset = source.offset or 0.0
    start = round(offset * rate)
    stop = total if source.duration is None else start + round(source.duration * rate)
    if start >= total:
        raise _Reject(
            f"the segment starts at {offset:.3f} s, at or past the end of the recording "
            f"({total / rate:.3f} s)"
        )
    if stop - total > round(_END_TOLERANCE * rate):
        raise _Reject(
            f"the segment ends at {stop / rate:.3f} s, past the end of the recording ({total / rate:.3f} s)"
        )
    return start, min(stop, total)


def _encode(audio: np.ndarray, rate: int, subtype: str, target: str) -> bytes:
    """``audio`` as FLAC or WAV bytes, keeping integer samples exact (24 bits at most for FLAC)."""
    float_source = subtype in ("FLOAT", "DOUBLE")
    if target == "wav" and float_source:
        return _float_wav(audio.astype("<f4"), rate)
    if target == "flac":
        lossy = audio.dtype.kind == "f" and not float_source
        out_subtype = "PCM_16" if audio.dtype == np.int16 or lossy else "PCM_24"
    else:
        out_subtype = subtype if subtype in ("PCM_24", "PCM_32") else "PCM_16"
    if audio.dtype.kind == "f":
        audio = np.clip(audio, -1.0, 1.0)  # lossy decoders overshoot; libsndfile would wrap, not clip
    buffer = io.BytesIO()
    try:
        sf.write(buffer, audio, rate, format=target.upper(), subtype=out_subtype)
    except (sf.LibsndfileError, RuntimeError, ValueError) as exc:
        raise _Reject(f"cannot encode as {target} ({out_subtype}): {exc}") from None
    return buffer.getvalue()


def _float_wav(audio: np.ndarray, rate: int) -> bytes:
    """A float32 WAV written here: libsndfile's has a PEAK chunk with a timestamp,
    which breaks determinism."""
    frames, channels = audio.shape
    data = np.ascontiguousarray(audio).tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = (
        b"WAVEfmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"fact"
        + struct.pack("<II", 4, frames)
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body
