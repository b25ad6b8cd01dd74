"""Stream-compressed shards (``gzip``, ``bz2``, single-frame ``zstd``): decompressed up to a bound.

Such a shard cannot be seeked, so the reader decompresses it and keeps the result. A few MB of gzip can
expand to many GB; only the bytes the index places samples in are decompressed, so memory stays bounded
by what the index (already checked against the shard's size) justifies. A shard whose samples span more
than the reader keeps is read a sample's span at a time (:class:`StreamCursor`), so one huge member (a 2 GiB
``x.bin`` in 9 MB of gzip) is held only by a read of its own sample. An allocation that fails is a
:class:`~shardio.errors.ReadError`, not a ``MemoryError``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import re
from typing import Any

import zstandard

from ..errors import FormatError, ReadError

__all__ = ["StreamCursor", "decompress_prefix", "decompress_upto", "describe", "out_of_memory"]

_CHUNK = 1 << 20
_BYTES_LITERAL = re.compile(r"b'(?:[^'\\]|\\.)*'" + r'|b"(?:[^"\\]|\\.)*"')


def describe(exc: BaseException) -> str:
    """A decompressor's error as text, with any bytes it quotes from the file left out (gzip's "Not a gzipped
    file (b'ro')" quotes the first two)."""
    return f"{type(exc).__name__}: {_BYTES_LITERAL.sub('<bytes>', str(exc))}"


def _reader(raw: bytes | memoryview, codec: str) -> Any:
    if codec == "gzip":
        return gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb")
    if codec == "bz2":
        return bz2.BZ2File(io.BytesIO(raw), mode="rb")
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True)


def decompress_upto(raw: bytes | memoryview, codec: str, limit: int, where: str) -> bytes:
    """``raw`` (a whole ``codec`` stream) decompressed, up to ``limit`` bytes: never more are made, and the
    output grows in chunks as the data really decompresses (whatever a header claims)."""
    out = io.BytesIO()  # its getvalue() hands over its own buffer: the output is never held twice at once
    made = 0
    try:
        stream = _reader(raw, codec)
        while made < limit:
            chunk = stream.read(min(_CHUNK, limit - made))
            if not chunk:
                break
            made += out.write(chunk)
    except (OSError, EOFError, ValueError, zstandard.ZstdError) as exc:
        raise FormatError(f"{where}: cannot decompress the shard ({codec}): {describe(exc)}") from None
    except MemoryError:
        raise out_of_memory(where, codec, limit) from None
    return out.getvalue()


def out_of_memory(where: str, codec: str, size: int) -> ReadError:
    """The error for ``size`` decompressed bytes this process could not allocate."""
    return ReadError(
        f"{where}: {size} bytes decompressed from the {codec} shard cannot be held in this "
        "process's memory (its address space or memory limit); re-pack the dataset with "
        "'shardio pack' (seekable, a frame per sample) or lower the reader's max_stream_bytes"
    )


class StreamCursor:
    """One stream shard (``raw``, compressed with ``codec``) decompressed forward a span at a time: the bytes
    before a span are decompressed and dropped, so what is held is the span alone, whatever precedes it in
    the shard. A span that starts before the cursor's position starts the stream over."""

    def __init__(self, raw: bytes | memoryview, codec: str) -> None:
        self.raw, self.codec = raw, codec
        self.position = 0
        self._stream: Any = None

    def span(self, start: int, end: int, where: str) -> bytes:
        """Decompressed bytes ``start`` to ``end``; a stream that ends first, or cannot be decompressed, is a
        :class:`FormatError`, bytes that cannot be allocated a :class:`ReadError`."""
        try:
            if self._stream is None or start < self.position:
                self._stream, self.position = _reader(self.raw, self.codec), 0
            while self.position < start:
                skipped = len(self._stream.read(min(_CHUNK, start - self.position)))
                if not skipped:
                    break
                self.position += skipped
            out = io.BytesIO()
            while self.position == start + out.tell() < end:
                chunk = self._stream.read(min(_CHUNK, end - self.position))
                if not chunk:
                    break
                self.position += out.write(chunk)
        except (OSError, EOFError, ValueError, zstandard.ZstdError) as exc:
            self._stream = None
            raise FormatError(
                f"{where}: cannot decompress the shard ({self.codec}): {describe(exc)}"
            ) from None
        except MemoryError:
            self._stream = None
            raise out_of_memory(where, self.codec, end - start) from None
        if self.position != end:
            self._stream = None
            raise FormatError(
                f"{where}: the shard decompresses ({self.codec}) to {self.position} bytes, but "
                f"the index places a sample up to byte {end}"
            )
        return out.getvalue()


def decompress_prefix(raw: bytes, codec: str, need: int, where: str) -> bytes:
    """The first ``need`` decompressed bytes of ``raw`` (a whole ``codec`` stream): never more are made. A
    stream that decompresses to fewer, or cannot be decompressed, is a :class:`FormatError`."""
    out = decompress_upto(raw, codec, need, where)
    if len(out) < need:
        raise FormatError(
            f"{where}: the shard decompresses ({codec}) to {len(out)} bytes, but the index "
            f"places samples up to byte {need}"
        )
    return out
