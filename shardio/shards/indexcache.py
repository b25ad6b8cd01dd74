"""The node cache's index files: hash markers of verified columns files, and fetched remote columns files.

A columns file hashed once on a node leaves a marker under ``cache_dir()/verified`` naming its device, inode,
size and times, so later loads on the node skip the hash; a remote index's columns file is fetched once into
``cache_dir()`` (:func:`~shardio.storage.nodecache.fetch_to_cache`). Each load touches the files it uses, and
:func:`prune` removes those unused for a while (what goes is made again when next needed: a marker by hashing,
a columns file by fetching), with temporary files of fetches that died.
"""

from __future__ import annotations

import os
import time

from ..errors import OutputError
from ..storage.files import cache_dir, open_output

__all__ = ["SETTLED_S", "UNUSED_S", "mark_verified", "prune", "touch", "verified_marker"]

SETTLED_S = 5.0
"""A file whose last change is this many seconds old when it is hashed gets a marker: a later change to it
moves its modification time past any file system's timestamp granularity, so the marker no longer matches."""

UNUSED_S = 7 * 86400.0
""":func:`prune`'s default: index files untouched for a week go."""


def verified_marker(path: str, digest: str) -> str | None:
    """The node cache's marker for this very file (device, inode, size, times) holding ``digest``; None when
    the file changed too recently to be told apart from a later change by its times."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if time.time() - info.st_mtime < SETTLED_S or time.time() - info.st_ctime < SETTLED_S:
        return None
    identity = f"{digest}-{info.st_dev}-{info.st_ino}-{info.st_size}-{info.st_mtime_ns}-{info.st_ctime_ns}"
    return os.path.join(cache_dir(), "verified", identity)


def mark_verified(marker: str | None) -> None:
    """Record that the file was hashed and matched (best effort: without it, the next load hashes again)."""
    if marker is None:
        return
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open_output(marker):
            pass
    except (OSError, OutputError):  # a marker that is not a regular file: never blocked on, never marked
        pass


def touch(path: str) -> None:
    """Mark a cache file as used now (best effort), so :func:`prune` keeps it."""
    try:
        os.utime(path)
    except OSError:
        pass


def prune(unused_for: float = UNUSED_S, stale: float = 3600.0) -> int:
    """Remove markers and fetched columns files untouched for ``unused_for`` seconds, and temporary files of
    fetches older than ``stale`` seconds; returns how many files went."""
    directory = cache_dir()
    now = time.time()
    candidates = [
        (os.path.join(directory, "verified", name), unused_for)
        for name in _names(os.path.join(directory, "verified"))
    ]
    for name in _names(directory):
        if name.startswith("index-") and name.endswith(".columns"):
            candidates.append((os.path.join(directory, name), unused_for))
        elif name.startswith(".tmp-") and name.endswith(".columns"):
            candidates.append((os.path.join(directory, name), stale))
    removed = 0
    for path, age in candidates:
        try:
            if now - os.stat(path).st_mtime > age:
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            pass
    return removed


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
