"""S3 range reads of a shard held to the version this process first read (:mod:`shardio.storage.validators`).

s3fs's ``cat_file`` sends no condition and returns no headers, so a shard's range is asked for here with
``GetObject`` itself, through s3fs's client (its session, endpoint, credentials and extra request arguments):
``IfMatch`` carries the ETag recorded at the shard's first read, a ``412 Precondition Failed`` is a
:class:`~shardio.errors.ShardChanged`, and the answer's ETag is compared with the recorded one (for stores
that ignore ``IfMatch``), or recorded when there is none yet. One request a range, as before.
"""

from __future__ import annotations

from typing import Any

from ..errors import shown
from .retries import http_status
from .validators import Pin, Validator

__all__ = ["is_s3", "s3_read"]


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs's file system (whose client this module calls)."""
    protocol = getattr(fs, "protocol", ())
    protocols = {protocol} if isinstance(protocol, str) else set(protocol)
    return bool({"s3", "s3a"} & protocols) and hasattr(fs, "_call_s3") and hasattr(fs, "split_path")


def s3_read(fs: Any, path: str, span: tuple[int, int], pin: Pin) -> bytes:
    """Bytes ``span`` (``(start, end)``) of ``path`` through s3fs file system ``fs`` (one try: the caller
    retries), of the version ``pin`` recorded (recorded from this answer where none is yet)."""
    from fsspec.asyn import sync

    return bytes(sync(fs.loop, _get, fs, path, span, pin))


async def _get(fs: Any, path: str, span: tuple[int, int], pin: Pin) -> bytes:
    bucket, key, version = fs.split_path(path)
    known = pin.expected
    condition = {"IfMatch": known.etag} if known is not None and known.etag else {}
    try:
        response = await fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=f"bytes={span[0]}-{span[1] - 1}",
            **({"VersionId": version} if version else {}),
            **condition,
        )
    except OSError as exc:  # s3fs's translation of botocore's ClientError, which it keeps as the cause
        if condition and http_status(exc) == 412:
            raise pin.refused(f"GetObject with IfMatch {shown(condition['IfMatch'])}") from None
        raise
    body = response["Body"]
    try:
        pin.check(Validator(etag=response.get("ETag") or None))
        return bytes(await body.read())
    finally:
        body.close()
