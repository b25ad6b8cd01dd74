"""HTTP reads held to what was asked: a range answered with exactly its bytes, nothing read past a bound,
and a deadline that grows with the bytes received.

fsspec's HTTP file system would take a ``200`` with the whole object for a range, a body longer than
asked for, or a server that drips a byte a second (its timeout is between socket reads, not for the read).
Here a ranged GET must come back as the ``206`` of those bytes, with no ``Content-Encoding``; the body is read
no further than its bound plus one byte; and the read must average :data:`HTTP_MIN_RATE` after a grace of
:data:`HTTP_READ_TIMEOUT` seconds. Where the caller knows the object's size (a shard's, from the index), a
range's ``Content-Range`` must carry it too: an object replaced by one of another size is refused, not read
as a mix of old and new bytes. A shard's reads also carry its validator as a condition, and each answer's is
compared with it (:mod:`shardio.storage.validators`: a same-size replacement is refused too). The request
goes through the file system's own aiohttp session, with its headers and client options. :func:`http_copy`
streams an answer into a file (a whole shard for the node cache), under the same checks and bounds, never
holding it in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import IO, Any

from ..errors import shown
from .validators import Pin, from_headers

__all__ = [
    "BadAnswer",
    "HTTP_MIN_RATE",
    "HTTP_READ_TIMEOUT",
    "SlowAnswerTimeout",
    "http_copy",
    "http_read",
    "is_http",
]

HTTP_READ_TIMEOUT = 60.0
"""Seconds a read may take before :data:`HTTP_MIN_RATE` applies (and the socket read timeout shardio sets)."""
HTTP_MIN_RATE = 256 << 10
"""Bytes per second an HTTP read must average, after a grace of ``HTTP_READ_TIMEOUT`` seconds, to go on."""


def http_read(
    fs: Any, url: str, span: tuple[int, int], total: int | None = None, pin: Pin | None = None
) -> bytes:
    """``url``'s bytes ``span`` (``(start, end)``) through fsspec HTTP file system ``fs`` (one try: the caller
    retries), checked and bounded as the module says; ``total``: the object's size where the caller knows it
    (the answer's ``Content-Range`` must then carry it); ``pin``: the shard's validator, sent as a condition
    and checked against the answer's (:class:`~shardio.errors.ShardChanged` when it changed)."""
    from fsspec.asyn import sync

    chunks: list[bytes] = []
    sync(fs.loop, _stream, fs, url, span, span[1] - span[0], chunks.append, total, pin)
    return b"".join(chunks)


def http_copy(
    fs: Any,
    url: str,
    span: tuple[int, int] | None,
    bound: int,
    out: IO[bytes],
    total: int | None = None,
    pin: Pin | None = None,
) -> int:
    """``url``'s bytes ``span`` (None: the whole object, read no further than ``bound + 1`` bytes), checked
    as :func:`http_read` checks them, but written into ``out`` as they arrive (a chunk of at most 1 MiB at a
    time, from ``fs``'s event loop); returns the bytes written (``bound + 1`` at most: a whole object longer
    than ``bound`` is the caller's to refuse)."""
    from fsspec.asyn import sync

    return int(sync(fs.loop, _stream, fs, url, span, bound, out.write, total, pin))


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP file system."""
    protocol = getattr(fs, "protocol", ())
    return bool({"http", "https"} & set((protocol,) if isinstance(protocol, str) else protocol))


class BadAnswer(Exception):
    """An HTTP answer that is not what was asked for (other bytes, an encoding, a body past its size): not
    retried, since asking again gets the same (:func:`~shardio.storage.retries.retrying` makes it a
    :class:`~shardio.errors.ReadError`)."""


class SlowAnswerTimeout(Exception):
    """An HTTP answer slower than a read may be (transient, by its name: see
    :func:`~shardio.storage.retries.is_transient`). Not a
    ``TimeoutError``, which fsspec's ``sync`` replaces with a bare ``FSTimeoutError``,
    dropping the message."""


async def _stream(
    fs: Any,
    url: str,
    span: tuple[int, int] | None,
    bound: int,
    sink: Callable[[bytes], Any],
    total: int | None,
    pin: Pin | None,
) -> int:
    """``url``'s bytes ``span`` (``(start, end)``; None: the whole object) over ``fs``'s aiohttp session, each
    chunk handed to ``sink``, read no further than ``bound + 1`` bytes and within a deadline that grows with
    the bytes received (``HTTP_READ_TIMEOUT`` plus one second per ``HTTP_MIN_RATE`` bytes):
    :class:`SlowAnswerTimeout` past it. A ranged answer must be the ``206`` of exactly those bytes, of an
    object of ``total`` bytes where that is given (:class:`BadAnswer` otherwise), and of the version ``pin``
    recorded where it has one (sent as a condition). Returns the bytes received."""
    loop = asyncio.get_running_loop()
    begun = loop.time()
    got = 0

    def left() -> float:
        return begun + HTTP_READ_TIMEOUT + got / HTTP_MIN_RATE - loop.time()

    known = pin.expected if pin is not None else None
    conditions = known.conditions() if known is not None else {}
    headers = {**fs.kwargs.get("headers", {}), "Accept-Encoding": "identity", **conditions}
    if span is not None:
        headers["Range"] = f"bytes={span[0]}-{span[1] - 1}"
    options = {name: value for name, value in fs.kwargs.items() if name != "headers"}
    encode = getattr(fs, "encode_url", None)  # fsspec's URL encoding where it has one
    try:
        session = await asyncio.wait_for(fs.set_session(), left())
        response = await asyncio.wait_for(
            session.get(encode(url) if encode else url, headers=headers, **options), left()
        )
        async with response:
            if response.status == 412 and pin is not None and conditions:
                raise pin.refused(", ".join(f"{name}: {shown(value)}" for name, value in conditions.items()))
            _check_answer(response, url, span, total)
            if pin is not None:
                pin.check(from_headers(response.headers))
            while got <= bound:
                chunk = await asyncio.wait_for(response.content.read(min(1 << 20, bound + 1 - got)), left())
                if not chunk:
                    break
                sink(chunk)
                got += len(chunk)
    except TimeoutError:  # the builtin TimeoutError from Python 3.11
        raise SlowAnswerTimeout(
            f"{url}: {got} bytes in {loop.time() - begun:.0f} s, short of the "
            f"{HTTP_MIN_RATE >> 10} KiB/s (after {HTTP_READ_TIMEOUT:.0f} s) a read must "
            "average"
        ) from None
    if span is not None and got > bound:
        raise BadAnswer(f"{url}: the answer to a request for {bound} bytes is longer")
    return got


def _check_answer(response: Any, url: str, span: tuple[int, int] | None, total: int | None) -> None:
    """An aiohttp ``response`` to a GET of ``url`` (of bytes ``span``) that can be read: its status (404:
    ``FileNotFoundError``; another error: raised for the caller's retries to classify), no content encoding,
    and for a range, the ``206`` of those bytes, of an object of ``total`` bytes where that is given (a
    server that does not know the size, ``bytes a-b/*``, is taken at its word)."""
    if response.status == 404:
        raise FileNotFoundError(url)
    if response.status >= 400:
        response.raise_for_status()
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding != "identity":
        raise BadAnswer(
            f"{url}: the server answered with Content-Encoding {shown(encoding)}, though asked for "
            "the bytes as they are (Accept-Encoding: identity)"
        )
    if span is None:
        return
    if response.status != 206:
        raise BadAnswer(
            f"{url}: a GET of bytes {span[0]} to {span[1]} was answered HTTP {response.status}, not "
            "206 (Partial Content): the server stopped honouring Range"
        )
    wanted = f"bytes {span[0]}-{span[1] - 1}/"
    found = response.headers.get("Content-Range", "")
    size = found.rpartition("/")[2].strip()
    if total is not None and found.startswith("bytes ") and size not in (str(total), "*"):
        raise BadAnswer(
            f"{url}: the object now has {shown(size)} bytes (Content-Range {shown(found)}), the index "
            f"records {total}: it was replaced after indexing; re-run 'shardio index' or re-pack"
        )
    length = response.headers.get("Content-Length")
    if not found.startswith(wanted) or (length is not None and length.strip() != str(span[1] - span[0])):
        raise BadAnswer(
            f"{url}: a GET of bytes {span[0]} to {span[1]} was answered with Content-Range "
            f"{shown(found)} and Content-Length {shown(length)}, not those bytes"
        )
