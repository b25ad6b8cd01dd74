"""Whole remote objects copied into local files: streamed, no further than a bound, over HTTP
checked as reads are."""

from __future__ import annotations

from typing import IO, Any

from ..errors import shown
from .httpreads import http_copy, is_http
from .retries import http_status
from .s3reads import is_s3
from .validators import Pin, Validator

__all__ = ["copy_capped"]

CHUNK = 1 << 22


def copy_capped(
    fs: Any, path: str, out: IO[bytes], bound: int, size: int | None = None, pin: Pin | None = None
) -> int:
    """Stream remote ``path`` through fsspec file system ``fs`` into ``out`` (one try: the caller retries), no
    further than ``bound + 1`` bytes (enough to tell that it is too big: refusing it is the caller's); returns
    the bytes written. ``size``: the object's size as an index records it (a shard's), then asked over HTTP as
    the range of exactly those bytes (read no further), whose ``206`` must say the object has that size
    (:mod:`shardio.storage.httpreads`: a replaced object is a ``BadAnswer``); None: a plain GET. Over HTTP the
    copy must also keep up :data:`~shardio.storage.httpreads.HTTP_MIN_RATE` after its grace. ``pin``: the
    version of a shard this process reads (:mod:`shardio.storage.validators`), checked against the HTTP answer
    or the ETag s3fs's file found at opening (which it sends as ``IfMatch`` on each of its reads)."""
    if is_http(fs) and size:
        return http_copy(fs, path, (0, size), size, out, total=size, pin=pin)
    if is_http(fs):
        return http_copy(fs, path, None, bound, out)
    written = 0
    with fs.open(path, "rb", block_size=CHUNK, cache_type="none") as source:
        etag = getattr(source, "details", {}).get("ETag") if pin is not None and is_s3(fs) else None
        if pin is not None and etag:
            pin.check(Validator(etag=str(etag)))
        try:
            while written <= bound and (chunk := source.read(min(CHUNK, bound + 1 - written))):
                out.write(chunk)
                written += len(chunk)
        except OSError as exc:  # s3fs's IfMatch refused: replaced while it was copied
            if pin is not None and etag and http_status(exc) == 412:
                raise pin.refused(f"GetObject with IfMatch {shown(etag)}") from None
            raise
    return written
