"""Eviction: which segment files of a bounded store go, so that a writer's room fits its bound."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["SUFFIX", "evict", "segment_sizes", "soonest"]

SUFFIX = ".seg"


def segment_sizes(directory: str) -> dict[str, tuple[int, int]]:
    """Every segment file of the store in ``directory`` (each namespace's folder): path -> (size, when last
    used in ns: the later of its mtime, set by writes, and its atime, set by readers). Links and anything but
    regular files are left out."""
    found: dict[str, tuple[int, int]] = {}
    try:
        spaces = os.listdir(directory)
    except OSError:
        return found
    for space in spaces:
        folder = os.path.join(directory, space)
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.endswith(SUFFIX):
                try:
                    info = os.stat(os.path.join(folder, name), follow_symlinks=False)
                except OSError:
                    continue
                if info.st_mode & 0o170000 == 0o100000:
                    used = max(info.st_mtime_ns, info.st_atime_ns)
                    found[os.path.join(folder, name)] = (info.st_size, used)
    return found


def evict(
    sizes: dict[str, tuple[int, int]], grow: int, max_bytes: int, keep: str | None, soonest: dict[str, int]
) -> tuple[bool, list[str]]:
    """Remove segments (never ``keep``) until ``grow`` more bytes fit in ``max_bytes``: whether they do, and
    the segments removed.

    First the segments that hold nothing upcoming (``soonest``: path -> position of the first upcoming entry
    it holds), least recently used first; then those whose first upcoming entry comes latest."""
    total = sum(size for size, _ in sizes.values())
    removed: list[str] = []
    if total + grow <= max_bytes:
        return True, removed
    order = sorted(
        (path for path in sizes if path != keep),
        key=lambda path: (path in soonest, -soonest.get(path, 0), sizes[path][1]),
    )
    for path in order:
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
        total -= sizes[path][0]
        if total + grow <= max_bytes:
            return True, removed
    return False, removed


def soonest(
    where: np.ndarray, next_use: np.ndarray | None, names: dict[str, int], folder: str
) -> dict[str, int]:
    """For the segments (``names``: file name -> slot, in ``folder``) that hold upcoming entries, the position
    of the first: ``where[n]`` is entry ``n``'s slot (-1: none), ``next_use[n]`` when it is read next."""
    if next_use is None:
        return {}
    known = where >= 0
    if not known.any():
        return {}
    limit = np.iinfo(next_use.dtype).max
    first = np.full(max(names.values(), default=-1) + 1, limit, next_use.dtype)
    np.minimum.at(first, where[known], next_use[known])
    return {
        os.path.join(folder, name): int(first[slot]) for name, slot in names.items() if first[slot] < limit
    }
