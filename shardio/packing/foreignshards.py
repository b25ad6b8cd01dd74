"""One pass over a shard another tool wrote: its stream codec from its name, its tar bytes decompressed and
hashed as they are read, and its samples grouped by key with their audio facts (for
:mod:`shardio.packing.indexer`)."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import logging
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO

import soundfile as sf
import zstandard

from ..errors import DecodeError, FormatError, OptionError, shown_path
from ..reading.streams import describe
from ..shards.names import key_problem, split_name
from ..shards.tarformat import walk
from .source import AUDIO_EXTENSIONS

__all__ = ["HashingReader", "index_shard", "shard_codec", "tar_stream"]

logger = logging.getLogger(__name__)

_SUFFIXES = (
    (".tar", "none"),
    (".tar.gz", "gzip"),
    (".tgz", "gzip"),
    (".tar.zst", "zstd-stream"),
    (".tar.zstd", "zstd-stream"),
    (".tar.bz2", "bz2"),
)
_Sample = tuple[str, int, int, str, IO[bytes]]  # key, start, end, audio ext, audio data (caller closes it)


def shard_codec(name: str) -> str:
    """The stream codec a shard's file name says it has: ``none``, ``gzip``, ``zstd-stream`` or ``bz2``."""
    for suffix, codec in _SUFFIXES:
        if name.endswith(suffix):
            return codec
    raise OptionError(
        f"{name}: not a shard name this indexer reads (expected one of {', '.join(s for s, _ in _SUFFIXES)})"
    )


class HashingReader(io.RawIOBase):
    """Counts and hashes every byte read through it from the shard file (and tells ``read`` each count)."""

    def __init__(self, raw: BinaryIO, read: Callable[[int], object] | None = None) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._on_read = read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.sha256.update(memoryview(buffer)[:count])
        self.size += count
        if self._on_read is not None:
            self._on_read(count)
        return count


def tar_stream(raw: BinaryIO, codec: str) -> BinaryIO:
    """The tar bytes of a shard file opened as ``raw``, decompressed as ``codec`` says (a stream codec, or
    ``none``/``zstd``); :func:`~shardio.shards.tarformat.walk` completes the decompressors' short reads."""
    if codec == "gzip":
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    elif codec == "bz2":
        stream = bz2.BZ2File(raw, mode="rb")
    elif codec in ("zstd-stream", "zstd"):
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    else:
        stream = raw
    return stream


def _samples(stream: BinaryIO, where: str) -> Iterator[_Sample]:
    """Each sample of a tar stream: its key, byte span in the (decompressed) tar, and its audio member."""
    key: str | None = None
    audio: tuple[str, IO[bytes]] | None = None
    others: list[str] = []
    boundary = start = end = 0
    for member, data in walk(stream, where):
        try:
            member_key, ext = split_name(member.name)
        except FormatError:
            logger.warning("%s: skipping member %r, whose name is not {key}.{ext}", where, member.name)
            boundary = member.end
            continue
        if member_key != key and (problem := key_problem(member_key)) is not None:
            raise FormatError(
                f"{shown_path(where)}: member {member.name!r} at offset {member.header_offset} has key "
                f"{member_key!r}, "
                f"which breaks pack's key rules: {problem}"
            )
        if member_key != key:
            if key is not None:
                yield _finish(key, start, end, audio, others, where)
            key, audio, others, start = member_key, None, [], boundary
        if audio is None and ext.rsplit(".", 1)[-1].lower() in AUDIO_EXTENSIONS:
            audio = (ext, data)
        else:
            data.close()
            others.append(ext)
        end = boundary = member.end
    if key is not None:
        yield _finish(key, start, end, audio, others, where)


def _finish(
    key: str, start: int, end: int, audio: tuple[str, IO[bytes]] | None, others: list[str], where: str
) -> _Sample:
    if audio is None:
        raise FormatError(
            f"{shown_path(where)}: sample {key!r} at offset {start} has no audio member (members: "
            f"{', '.join('.' + e for e in others)}; expected one of "
            f"{', '.join('.' + e for e in AUDIO_EXTENSIONS)})"
        )
    return key, start, end, audio[0], audio[1]


def index_shard(
    path: str, codec: str, read: Callable[[int], object] | None = None
) -> tuple[list[tuple[str, int, int, str, tuple[int, int, int]]], tuple[int, str]]:
    """The samples of one shard with their audio facts, and the shard's ``(bytes, sha256)``; ``read`` is
    called with the count of each chunk of the file read."""
    samples = []
    with open(path, "rb") as handle:
        hashing = HashingReader(handle, read)
        raw = io.BufferedReader(hashing, 1 << 20)
        try:
            stream = tar_stream(raw, codec)
            for key, start, end, ext, data in _samples(stream, path):
                try:
                    with data:
                        facts = sf.info(data)
                except (sf.LibsndfileError, RuntimeError) as exc:
                    reason = getattr(exc, "error_string", None) or exc
                    raise DecodeError(
                        f"{shown_path(path)}: sample {key!r} at offset {start}: the .{ext} member cannot be "
                        f"decoded ({reason})"
                    ) from None
                if facts.frames <= 0:
                    raise DecodeError(
                        f"{shown_path(path)}: sample {key!r} at offset {start}: the .{ext} member has "
                        "no frames"
                    )
                samples.append(
                    (key, start, end, ext, (int(facts.frames), int(facts.samplerate), int(facts.channels)))
                )
            while stream.read(1 << 20):  # the rest of the stream: the decompressor checks its end
                pass
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            raise FormatError(
                f"{shown_path(path)}: cannot decompress the {codec} stream ({describe(exc)})"
            ) from None
        while raw.read(1 << 20):
            pass
    return samples, (hashing.size, hashing.sha256.hexdigest())
