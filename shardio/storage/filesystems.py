"""Filesystems: a reader's fsspec filesystems, one per protocol and options, and what their servers can do.

A mix of corpora may read shards over several protocols (``http://`` and ``s3://``) with different options
(endpoints, credentials): each ``(protocol, options)`` gets its own filesystem, made on first use.

Samples are read by byte range. An HTTP server that ignores ``Range`` (``python -m http.server``) answers
every ranged GET with the whole file: each sample would download its whole shard. So the first HTTP shard
opened on each server is probed with a one-byte ranged GET, once; a ``200`` instead of ``206`` fails the
dataset with :class:`RangeNotSupported`, naming the server, rather than falling back to whole-shard reads
(which would turn a 50 KB sample into a download of its whole shard on every random access, silently).
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlsplit

from ..errors import RangeNotSupported, ReadError
from .files import filesystem
from .retries import RetryPolicy, retrying

__all__ = ["Filesystems"]


def _options_key(protocol: str, options: dict[str, Any] | None) -> str:
    return protocol + " " + json.dumps(options or {}, sort_keys=True, default=repr)


async def _ranged_status(fs: Any, url: str) -> int:
    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = {**kwargs.pop("headers", {}), "Range": "bytes=0-0"}
    async with session.get(fs.encode_url(url), headers=headers, **kwargs) as response:
        if response.status >= 400 and response.status != 404:
            response.raise_for_status()  # classified by the caller's retries (5xx, 429: transient)
        if response.status == 206:
            await response.read()  # one byte: the connection goes back to the pool
        return int(response.status)  # a 200's body (the whole file) is not read: the connection is dropped


class Filesystems:
    """The fsspec filesystems of one reader (one per protocol and options), and the HTTP servers known to
    honour ``Range``. Not shared across processes: drop it after a fork."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}
        self._ranged: dict[str, bool] = {}  # "scheme://host" -> whether it answered a ranged GET with 206
        self._lock = threading.Lock()  # read-ahead threads open shards too: one filesystem and one probe each

    def get(
        self, url: str, options: dict[str, Any] | None, where: str, retry: RetryPolicy, on_retry: Any = None
    ) -> tuple[Any, str]:
        """The filesystem for ``url`` (made with ``options``) and the path to pass it; an HTTP server is
        probed for ``Range`` support the first time one of its shards is opened."""
        protocol = url.split("://", 1)[0].lower()
        key = _options_key(protocol, options)
        with self._lock:
            fs = self._made.get(key)
            if fs is None:
                fs = self._made[key] = filesystem(url, options)[0]
            if protocol in ("http", "https"):
                self._check_range(fs, url, where, retry, on_retry)
        return fs, fs._strip_protocol(url)

    def _check_range(self, fs: Any, url: str, where: str, retry: RetryPolicy, on_retry: Any) -> None:
        parts = urlsplit(url)
        server = f"{parts.scheme}://{parts.netloc}"
        if server not in self._ranged:
            from fsspec.asyn import sync

            status = retrying(lambda: sync(fs.loop, _ranged_status, fs, url), where, retry, on_retry)
            if status == 404:
                return  # the caller's size check names the missing shard
            if status not in (200, 206):
                raise ReadError(f"{where}: a ranged GET answered HTTP {status}")
            self._ranged[server] = status == 206
        if not self._ranged[server]:
            raise RangeNotSupported(
                f"{where}: the HTTP server {server} ignores Range requests (it answered a ranged GET with "
                "200 and the whole file), and shardio reads each sample by byte range: serve the dataset "
                "with a server that supports Range (nginx, Apache, caddy, any object store), or copy it to "
                "a local directory"
            )
