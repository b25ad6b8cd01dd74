"""Stream-compressed shards (``gzip``, ``bz2``, single-frame ``zstd``): decompressed up to a bound.

Such a shard cannot be seeked, so the reader decompresses it and keeps the result. A few MB of gzip can
expand to many GB; only the bytes the index places samples in are decompressed, so memory stays bounded
by what the index (already checked against the shard's size) justifies.
"""

from __future__ import annotations

import bz2
import gzip
import io
import re
from typing import Any

import zstandard

from ..errors import FormatError

__all__ = ["decompress_prefix", "decompress_upto", "describe"]

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
    return out.getvalue()


def decompress_prefix(raw: bytes, codec: str, need: int, where: str) -> bytes:
    """The first ``need`` decompressed bytes of ``raw`` (a whole ``codec`` stream): never more are made. A
    stream that decompresses to fewer, or cannot be decompressed, is a :class:`FormatError`."""
    out = decompress_upto(raw, codec, need, where)
    if len(out) < need:
        raise FormatError(f"{where}: the shard decompresses ({codec}) to {len(out)} bytes, but the index "
                          f"places samples up to byte {need}")
    return out
