"""Remote files copied into the node-local cache (:func:`~shardio.storage.files.cache_dir`): fetched once,
bounded by their expected size, renamed into place whole."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

from ..errors import FormatError, OutputError, ReadError, shown_path
from .files import cache_dir, filesystem, staged
from .objectcopy import copy_capped
from .retries import RetryPolicy, retrying

__all__ = ["fetch_to_cache"]


def fetch_to_cache(
    location: str,
    name: str,
    size: int,
    storage_options: dict[str, Any] | None,
    fits: Callable[[str], bool],
    retry: RetryPolicy = RetryPolicy(),
) -> str:
    """The local path of a copy of remote ``location`` (``size`` bytes) in :func:`cache_dir` under ``name``,
    fetched unless a copy of that size for which ``fits(path)`` holds is there. Processes that fetch at once
    each write a temporary file and rename it into place, so none ever sees a partial copy."""
    directory = cache_dir()
    path = os.path.join(directory, name)
    try:
        if os.path.getsize(path) == size and fits(path):
            return path
    except OSError:
        pass
    fs, remote = filesystem(location, storage_options)

    def fetch(out: IO[bytes]) -> int:
        # no further than size + 1 bytes: an endless answer never fills the disk
        out.seek(0)
        out.truncate()
        return copy_capped(fs, remote, out, size)

    try:
        os.makedirs(directory, exist_ok=True)
        with staged(path) as out:
            got = retrying(lambda: fetch(out), location, retry)
            if got != size:
                raise FormatError(
                    f"{location}: {'more than ' if got > size else ''}{min(got, size)} bytes, but "
                    f"index.json describes {size}: the index files do not belong together or one "
                    "is damaged; rebuild the index"
                )
    except (FileNotFoundError, FormatError, ReadError, OutputError):
        raise
    except OSError as exc:  # the cache itself: a full disk, a read-only directory
        raise ReadError(
            f"{shown_path(location)}: cannot be cached in {shown_path(directory)} ({exc}); set "
            "SHARDIO_CACHE_DIR to a "
            "writable local directory with room"
        ) from None
    return path
