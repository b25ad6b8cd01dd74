"""DecodedCache: a sample's audio decoded once per node, and read back from node-local disk after that.

A reader concern, never a plan concern: it changes how bytes become audio, never which samples a batch holds,
and a batch read through it is bit-identical to one read without it. An entry is what the decoder made of a
sample (mixed to mono and resampled where asked, before the ``transform``, which runs on every read with its
epoch's generator): float32 audio, kept as int16 where every value is exactly ``int16 / 32768`` (16-bit
sources: half the disk, and read back exactly; the assembler decodes those as int16 and hands them over so,
see :func:`~shardio.reading.pcm16.decode_steps`, and other float32 audio is checked as it is kept); with
``dtype="int16"`` and no transform, the batch's int16 audio itself. Entries live in
:class:`~shardio.storage.segments.Segments` (checked, bounded, shared by every process of the node) under a
namespace digested from what makes the audio: the index's ``content_id`` and the decoding options that change
samples (``mono``, ``sample_rate``, ``dtype``, whether a transform follows). An entry is also held to what the
index says of its sample (channels, rate, at most its frames) before use. An entry also holds the sample's
other members (its ``json``, ``txt``, ...: ``{ext: bytes}``), so that a batch read from the cache never
touches the shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ..shards.index import Index
from ..storage.eviction import segment_sizes
from ..storage.segments import Segments
from .options import Decoding
from .wav import fits

__all__ = ["FORMAT", "DecodedCache", "Entry", "clear", "namespace", "report"]

FORMAT = 2
"""The entries' layout version: part of the namespace, so another layout is never read."""
_INT16, _FLOAT32 = 0, 1
_SCALE = np.float32(2.0**-15)
_TRAILER = struct.Struct("<II")  # an entry's payload ends with: audio bytes, members bytes
_MEMBER = struct.Struct("<BI")  # a member: its ext's length, its size; then the ext and its bytes


class Entry(NamedTuple):
    """A cached sample's audio, ``(channels, frames)``, and its rate; ``final``: it is the batch's audio
    already (int16 for a ``dtype="int16"`` dataset without a transform); ``in_out``: it was written into the
    ``out`` array given; ``members``: the sample's other members, ``{ext: bytes}``."""

    audio: np.ndarray
    rate: int
    final: bool
    in_out: bool = False
    members: dict[str, memoryview] | None = None


def namespace(index: Index, decoding: Decoding) -> str:
    """The name of the entries of ``index``'s samples decoded with ``decoding``'s options."""
    key = {
        "format": FORMAT,
        "content": index.content_id,
        "mono": decoding.mono,
        "sample_rate": decoding.sample_rate,
        "dtype": decoding.dtype,
        "transform": decoding.transform is not None,
    }
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=16).hexdigest()


class _Scratch:
    """Reused buffers for :meth:`exact_int16`. It works a cache-sized chunk at a time: its four passes over a
    sample's audio in memory took twice as long (and fresh arrays, their page faults, eight times)."""

    CHUNK = 16384

    def __init__(self) -> None:
        self.floats = np.empty(self.CHUNK, np.float32)
        self.back = np.empty(self.CHUNK, np.float32)
        self.steps = np.empty(0, np.int16)

    def exact_int16(self, audio: np.ndarray) -> np.ndarray | None:
        """``audio`` (C-contiguous float32) as int16 steps of 1/32768 (a view of a buffer reused by the next
        call) where each value is one exactly, bit for bit (so not -0.0); else None."""
        flat, size = audio.reshape(-1), audio.size
        if self.steps.size < size:
            self.steps = np.empty(size, np.int16)
        for start in range(0, size, self.CHUNK):
            end = min(start + self.CHUNK, size)
            scaled, back, steps = self.floats[: end - start], self.back[: end - start], self.steps[start:end]
            np.multiply(flat[start:end], np.float32(32768.0), out=scaled)  # exact (a power of two), -0.0 kept
            with np.errstate(invalid="ignore", over="ignore"):
                np.copyto(steps, scaled, casting="unsafe")  # out of range or between steps: caught below
            np.copyto(back, steps, casting="unsafe")
            if not np.array_equal(back.view(np.int32), scaled.view(np.int32)):
                return None
        return self.steps[:size].reshape(audio.shape)


class DecodedCache:
    """The decoded audio of ``index``'s samples under ``decoding``, in the store in ``directory`` (at most
    ``max_bytes`` on disk, every dataset together)."""

    def __init__(self, directory: str, max_bytes: int, index: Index, decoding: Decoding) -> None:
        self.directory = directory
        self.final = decoding.dtype == "int16" and decoding.transform is None
        self.segments = Segments(directory, namespace(index, decoding), max_bytes, len(index))
        columns = index.columns
        self._frames = columns["num_frames"]
        self._channels = columns["channels"]
        self._rates = columns["sample_rate"]
        self._mono = decoding.mono
        self._rate = decoding.sample_rate
        self.hits = 0
        self.stored = 0
        self._scratch = _Scratch()

    @property
    def on(self) -> bool:
        """Whether the cache is in use (its directory is private, with a secret)."""
        return self.segments.on

    def upcoming(self, ids: np.ndarray) -> None:
        """The sample ids this process reads next, in order (eviction keeps their entries longest)."""
        if self.on:
            self.segments.upcoming(ids)

    def holds(self, ids: np.ndarray) -> bool:
        """Whether every one of sample ids ``ids`` has an entry this process knows of (not yet checked)."""
        return self.segments.holds(ids)

    def _expected(self, sample_id: int) -> tuple[int, int, int]:
        """(channels, rate, most frames) the decoded audio of sample ``sample_id`` can have."""
        channels = 1 if self._mono else int(self._channels[sample_id])
        rate, frames = int(self._rates[sample_id]), int(self._frames[sample_id])
        if self._rate is not None and self._rate != rate:
            frames, rate = -(-frames * self._rate // rate), self._rate
        return channels, rate, frames

    def get(self, sample_id: int, out: np.ndarray | None = None) -> Entry | None:
        """Sample ``sample_id``'s entry (float32 written into ``out[:, :frames]`` when that fits, as the
        decoder does), else None."""
        found = self.segments.get(sample_id)
        if found is None:
            return None
        meta, entry = found
        parts = _split(entry)
        if parts is None:
            self.segments.distrusted += 1
            return None
        payload, members = parts
        kind, channels, rate = meta & 0xFF, (meta >> 8) & 0xFFFF, meta >> 24
        want_channels, want_rate, most = self._expected(sample_id)
        itemsize = 2 if kind == _INT16 else 4
        frames, rest = divmod(len(payload), itemsize * max(channels, 1))
        if (
            kind not in (_INT16, _FLOAT32)
            or channels != want_channels
            or rate != want_rate
            or rest
            or not 0 < frames <= most
            or (self.final and kind != _INT16)
        ):
            self.segments.distrusted += 1
            return None
        stored = np.frombuffer(payload, np.int16 if kind == _INT16 else np.float32).reshape(channels, frames)
        self.hits += 1
        if self.final:
            target = fits(out, channels, frames) if out is not None and out.dtype == np.int16 else None
            if target is None:
                return Entry(stored.copy(), rate, True, False, members)
            np.copyto(target, stored)
            return Entry(target, rate, True, True, members)
        target = fits(out, channels, frames) if out is not None and out.dtype == np.float32 else None
        in_out = target is not None
        if target is None:
            target = np.empty((channels, frames), np.float32)
        if kind == _INT16:  # exact: each int16 is a float32, scaled by a power of two
            np.copyto(target, stored, casting="unsafe")
            target *= _SCALE
        else:
            np.copyto(target, stored)
        return Entry(target, rate, False, in_out, members)

    def put(
        self, sample_id: int, audio: np.ndarray, rate: int, members: Mapping[str, memoryview] | None = None
    ) -> None:
        """Keep sample ``sample_id``'s decoded audio: the batch's int16 audio where :attr:`final`, else the
        decoder's float32 (before any transform); and its other ``members`` (``{ext: bytes}``, not its
        audio's)."""
        if not self.on:
            return
        blob = _joined(members or {})
        if blob is None:
            return
        audio = np.asarray(audio)
        if audio.ndim != 2 or not 0 < audio.shape[0] <= 0xFFFF or rate >= 1 << 40:
            return
        if audio.dtype == np.int16:
            kind, stored = _INT16, np.ascontiguousarray(audio)
        else:
            kind, stored = _FLOAT32, np.ascontiguousarray(audio, dtype=np.float32)
            steps = self._scratch.exact_int16(stored)
            if steps is not None:
                kind, stored = _INT16, steps
        if self.final and kind != _INT16:
            return
        meta = kind | (stored.shape[0] << 8) | (rate << 24)
        sound = stored.reshape(-1).view(np.uint8)
        pad = -(sound.size + len(blob) + _TRAILER.size) % 8  # the next entry's audio stays aligned
        tail = blob + bytes(pad) + _TRAILER.pack(sound.size, len(blob))
        if self.segments.put(sample_id, meta, sound.data, tail):
            self.stored += 1

    def close(self) -> None:
        """Close the cache's files (what this process reserved and did not fill is given back)."""
        self.segments.close()


def _joined(members: Mapping[str, memoryview]) -> bytes | None:
    """``members`` as one run of bytes (each: :data:`_MEMBER`, its ext, its bytes); None where one does not
    fit."""
    parts: list[bytes | memoryview] = []
    for ext, data in members.items():
        name = ext.encode()
        if len(name) > 0xFF or len(data) >= 1 << 31:
            return None
        parts += [_MEMBER.pack(len(name), len(data)), name, data]
    return b"".join(parts)


def _split(entry: memoryview) -> tuple[memoryview, dict[str, memoryview]] | None:
    """An entry's payload as its audio bytes and its members; None where it is not one."""
    if len(entry) < _TRAILER.size:
        return None
    sound, size = _TRAILER.unpack_from(entry, len(entry) - _TRAILER.size)
    if not 0 <= len(entry) - _TRAILER.size - sound - size < 8:
        return None
    members, at, end = {}, sound, sound + size
    while at < end:
        if at + _MEMBER.size > end:
            return None
        length, count = _MEMBER.unpack_from(entry, at)
        at += _MEMBER.size
        if at + length + count > end:
            return None
        try:
            ext = str(entry[at : at + length], "utf-8")
        except UnicodeDecodeError:
            return None
        members[ext] = entry[at + length : at + length + count]
        at += length + count
    return entry[:sound], members


def report(directory: str) -> dict[str, int]:
    """What the decoded cache in ``directory`` holds: ``namespaces`` (datasets and decoding options),
    ``segments`` and ``bytes`` (their files' sizes)."""
    sizes = segment_sizes(directory)
    return {
        "namespaces": len({os.path.dirname(path) for path in sizes}),
        "segments": len(sizes),
        "bytes": sum(size for size, _ in sizes.values()),
    }


def clear(directory: str) -> int:
    """Remove every segment of the decoded cache in ``directory`` (regular ``*.seg`` files in its namespace
    folders, nothing else; safe while loaders read it: they decode again); returns how many went."""
    removed = 0
    for path in segment_sizes(directory):
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
