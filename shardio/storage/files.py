"""Where bytes live: local paths and fsspec URLs (``s3://``, ``gs://``, ``http://``), behind one face.

Local paths use the operating system directly; anything with a scheme goes through fsspec, imported
only when a URL is used (install the ``remote`` extra). ``storage_options`` (endpoint, credentials, ...) go
to the fsspec filesystem as keyword arguments, e.g. ``{"endpoint_url": "http://127.0.0.1:9000", "key": ...,
"secret": ...}`` for an S3-compatible server. The endpoint can also come from the environment:
``AWS_ENDPOINT_URL_S3`` (read by botocore whenever a client is made), or ``FSSPEC_S3_ENDPOINT_URL`` (read
by fsspec only when it is first imported, so set it before the process starts).

Retries (:mod:`shardio.storage.retries`) are the only retry layer: unless the caller configures them,
botocore's retries are set to a single attempt and s3fs's own retry loop to one try, since nested layers
multiply (4 x 5 x 5 attempts and over a minute per read, measured against a dropping server). HTTP reads
get socket timeouts (connect 30 s, read 60 s) instead of aiohttp's 5 minutes.

Bounds on what a server answers: an HTTP range read (:func:`read_range`) must come back as the ``206`` of the
bytes asked for (its ``Content-Range`` and length checked, no ``Content-Encoding``), is read no further than
its size, and must keep up an average rate after a grace of ``HTTP_READ_TIMEOUT`` (a
server that drips a byte a second fails the attempt, instead of holding the read for days); a whole object
(:func:`read_bytes`, an ``index.json``) is read no further than :data:`MAX_READ_BYTES`, and a file fetched
into the node cache (:func:`shardio.storage.nodecache.fetch_to_cache`) no further than its expected size
(:mod:`shardio.storage.objectcopy`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO, Literal
from urllib.parse import unquote

from ..errors import FormatError, OptionError, OutputError, shown_path
from .httpreads import HTTP_READ_TIMEOUT, http_read, is_http
from .inherited import remember
from .localshard import kind
from .objectcopy import copy_capped
from .retries import RetryPolicy, retrying
from .s3reads import is_s3, s3_read
from .validators import Pin

__all__ = [
    "cache_dir",
    "check_output_file",
    "escapes_root",
    "file_size",
    "filesystem",
    "is_url",
    "join",
    "joiner",
    "open_input",
    "open_output",
    "read_bytes",
    "read_range",
    "staged",
    "write_atomic",
]

logger = logging.getLogger(__name__)

HTTP_CONNECT_TIMEOUT = 30.0
MAX_READ_BYTES = 1 << 28
"""The most bytes :func:`read_bytes` reads of a remote object (an ``index.json`` of
about a million shards)."""


def is_url(location: str) -> bool:
    """Whether ``location`` names a remote object (it has a ``scheme://`` other than ``file://``)."""
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> str:
    return location.removeprefix("file://")


def join(root: str, name: str) -> str:
    """``root`` and ``name`` joined with the separator the location kind uses."""
    if is_url(root):
        return root.rstrip("/") + "/" + name
    return os.path.join(_local(root), name)


def joiner(root: str) -> Callable[[str], str]:
    """:func:`join` of ``root`` and a name, with the location kind resolved once: for the names of many files
    under one root (an index's shards).

    Args:
        root: A local directory or a URL.

    Returns:
        A function of a name, giving what ``join(root, name)`` gives.
    """
    if is_url(root):
        return (root.rstrip("/") + "/").__add__
    return functools.partial(os.path.join, _local(root))


def escapes_root(name: str) -> bool:
    """Whether decoding ``name``'s percent-escapes changes how it splits into path parts, or makes a part
    ``.`` or ``..`` (which URL normalisation removes, with the part before it): an HTTP client decodes ``%2e``
    and drops the dot segments, so ``%2e%2e/x`` under ``http://host/data`` is fetched as ``http://host/x``."""
    raw, decoded = (text.replace("\\", "/").split("/") for text in (name, unquote(name)))
    return len(raw) != len(decoded) or any(d != r and d in (".", "..") for r, d in zip(raw, decoded))


def _with_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus shardio's defaults for ``protocol`` (single-attempt lower layers, HTTP timeouts)."""
    options = copy.deepcopy(options)
    if protocol in ("s3", "s3a"):
        config = options.setdefault("config_kwargs", {})
        config.setdefault("retries", {"total_max_attempts": 1})
    elif protocol in ("http", "https"):
        import aiohttp

        client = options.setdefault("client_kwargs", {})
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_TIMEOUT, sock_read=HTTP_READ_TIMEOUT),
        )
    return options


def filesystem(location: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem and path for a URL, made with ``storage_options`` and shardio's defaults."""
    try:
        import fsspec
    except ImportError:
        raise OptionError(f"{location}: reading URLs needs fsspec; install shardio[remote]") from None
    protocol = location.split("://", 1)[0].lower()
    try:
        fs, path = fsspec.core.url_to_fs(location, **_with_defaults(protocol, storage_options or {}))
    except ImportError as exc:
        extra = "gcs" if protocol in ("gs", "gcs") else "remote"
        raise OptionError(
            f"{location}: no fsspec backend for {protocol}:// ({exc}); install shardio[{extra}]"
        ) from None
    except (
        TypeError,
        ValueError,
        KeyError,
    ) as exc:  # KeyError: gcsfs reading a credentials file it cannot use
        raise OptionError(
            f"{location}: storage options {sorted(storage_options or {})} do not fit the "
            f"{protocol}:// backend, or its credentials cannot be used: {type(exc).__name__}: "
            f"{exc}"
        ) from None
    if protocol in ("s3", "s3a") and getattr(fs, "retries", 1) != 1:
        fs.retries = 1  # s3fs's own loop (not a constructor option): shardio's RetryPolicy retries instead
    remember(fs)  # a forked worker keeps it rather than wait a second on its finalizer (reading.inherited)
    return fs, path


def open_input(location: str, storage_options: dict[str, Any] | None = None) -> IO[bytes]:
    """Open a local file or URL for reading bytes (random access where the backend allows it)."""
    if is_url(location):
        fs, path = filesystem(location, storage_options)
        return fs.open(path, "rb", block_size=0 if location.startswith("http") else None, cache_type="none")
    return open(_local(location), "rb")


def read_bytes(
    location: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy = RetryPolicy()
) -> bytes:
    """The whole content of a local file or URL; remote reads are retried under ``retry``, and read no further
    than :data:`MAX_READ_BYTES` (more is a :class:`FormatError`).

    Raises ``FileNotFoundError`` when there is nothing there, :class:`ReadError` when it cannot be read.
    """
    if not is_url(location):
        with open(_local(location), "rb") as handle:
            return handle.read()
    fs, path = filesystem(location, storage_options)

    def whole() -> bytes:
        out = io.BytesIO()
        copy_capped(fs, path, out, MAX_READ_BYTES)
        return out.getvalue()

    data = retrying(whole, location, retry)
    if len(data) > MAX_READ_BYTES:
        raise FormatError(
            f"{location}: more than {MAX_READ_BYTES} bytes, the most shardio reads of a whole "
            "remote file (an index.json is far smaller): not the file expected here"
        )
    return data


def read_range(
    fs: Any, path: str, start: int, end: int, total: int | None = None, pin: Pin | None = None
) -> bytes:
    """Bytes ``start`` to ``end`` of remote ``path`` (of ``total`` bytes, where known) through its filesystem
    ``fs`` (one try: the caller retries); ``pin``: the version of a shard this process reads, over HTTP and
    S3 sent as a condition and checked (:mod:`shardio.storage.validators`).

    Over HTTP the answer is checked and bounded (:mod:`shardio.storage.httpreads`); other
    backends answer through fsspec.
    """
    if is_http(fs):
        return http_read(fs, path, (start, end), total, pin)
    if pin is not None and is_s3(fs):
        return s3_read(fs, path, (start, end), pin)
    return bytes(fs.cat_file(path, start=start, end=end))


def file_size(location: str, storage_options: dict[str, Any] | None = None) -> int:
    """The size in bytes of a local file or remote object."""
    if is_url(location):
        fs, path = filesystem(location, storage_options)
        return int(fs.size(path))
    return os.path.getsize(_local(location))


def check_output_file(path: str | os.PathLike[str]) -> None:
    """That ``path`` may be written as a file: nothing is there, or a regular file (symlinks followed).

    Replacing a device node, a FIFO or a socket with a regular file (``--out /dev/full`` as root) or writing
    into one (a FIFO blocks until a reader comes) is never what an output option means, nor is replacing a
    directory. Every file shardio writes locally is checked here (:func:`write_atomic`, :func:`open_output`).

    Args:
        path: the file about to be written or replaced.

    Raises:
        OutputError: ``path`` exists and is not a regular file; the message says what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there (or a dangling link): the write itself reports what stands in its way
        return
    if not stat.S_ISREG(mode):
        raise OutputError(
            f"{shown_path(path)}: it is {kind(mode)}, not a regular file: shardio writes an "
            "output only where nothing is yet, or over a regular file"
        )


def open_output(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for writing, created or truncated, only where :func:`check_output_file` allows it: a
    FIFO swapped in after the check is not waited on (opened without blocking, checked again on the
    descriptor).

    Raises:
        OutputError: ``path`` is not a regular file.
        OSError: it cannot be opened.
    """
    check_output_file(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OutputError(f"{shown_path(path)}: it is {kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` under a temporary name in the same directory, then rename it to ``path``; an
    :class:`OutputError` where ``path`` is there and not a regular file (:func:`check_output_file`)."""
    check_output_file(path)
    with staged(path) as out:
        os.fchmod(
            out.fileno(), 0o666 & ~current_umask()
        )  # mkstemp makes it 0600: follow the umask, as shards do
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


@contextlib.contextmanager
def staged(path: str, mode: Literal["wb", "w+b"] = "wb", suffix: str | None = None) -> Iterator[BinaryIO]:
    """A new file beside ``path``, under a temporary name, for ``path``'s next content.

    Args:
        path: the file that the content replaces (or creates) once the block ends without an exception.
        mode: the mode the temporary file is opened in (``"w+b"`` to read back what was written).
        suffix: the end of the temporary file's name (``.tmp-XXXXXXXX`` then the suffix); default ``-`` and
            ``path``'s name, so cleaners can tell whose it was.

    Returns:
        A context manager giving the open temporary file. On a clean exit it is closed, ``path`` is checked
        again (:func:`check_output_file`: something may have come meanwhile) and the file is renamed to it; on
        an exception the temporary file is removed. Readers never see a partial file.

    Raises:
        OutputError: ``path`` is there and not a regular file when the block ends.
    """
    suffix = "-" + os.path.basename(path) if suffix is None else suffix
    handle, temporary = tempfile.mkstemp(
        prefix=".tmp-", suffix=suffix, dir=os.path.dirname(os.path.abspath(path))
    )
    try:
        with os.fdopen(handle, mode) as out:
            yield out
        check_output_file(path)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def current_umask() -> int:
    """The process's umask (read from ``/proc`` where it can be, since setting it to
    read it races threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def cache_dir() -> str:
    """The node-local cache directory: ``$SHARDIO_CACHE_DIR``, else ``shardio`` under ``$XDG_CACHE_HOME`` (by
    default ``~/.cache``). Every process on a node that uses the same one shares what it holds."""
    configured = os.environ.get("SHARDIO_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardio")
