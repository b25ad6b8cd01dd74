"""Where bytes live: local paths and fsspec URLs (``s3://``, ``gs://``, ``http://``), behind one face.

Local paths use the operating system directly; anything with a scheme goes through fsspec, imported
only when a URL is used (install the ``remote`` extra).
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Any

from .errors import OptionError

__all__ = ["is_url", "join", "open_input", "write_atomic", "file_size"]


def is_url(location: str) -> bool:
    """Whether ``location`` names a remote object (it has a ``scheme://`` other than ``file://``)."""
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def join(root: str, name: str) -> str:
    """``root`` and ``name`` joined with the separator the location kind uses."""
    if is_url(root):
        return root.rstrip("/") + "/" + name
    return os.path.join(_local(root), name)


def filesystem(location: str) -> tuple[Any, str]:
    """The fsspec filesystem and path for a URL."""
    try:
        import fsspec
    except ImportError:
        raise OptionError(f"{location}: reading URLs needs fsspec; install shardio[remote]") from None
    fs, path = fsspec.core.url_to_fs(location)
    return fs, path


def open_input(location: str) -> IO[bytes]:
    """Open a local file or URL for reading bytes (random access where the backend allows it)."""
    if is_url(location):
        fs, path = filesystem(location)
        return fs.open(path, "rb", block_size=0 if location.startswith("http") else None, cache_type="none")
    return open(_local(location), "rb")


def file_size(location: str) -> int:
    """The size in bytes of a local file or remote object."""
    if is_url(location):
        fs, path = filesystem(location)
        return int(fs.size(path))
    return os.path.getsize(_local(location))


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` under a temporary name in the same directory, then rename it to ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
