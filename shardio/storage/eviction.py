"""Eviction: which segment files of a bounded store go, so that a writer's room fits its bound."""

from __future__ import annotations

import os

__all__ = ["SUFFIX", "evict", "segment_sizes"]

SUFFIX = ".seg"


def segment_sizes(directory: str) -> dict[str, tuple[int, int]]:
    """Every segment file of the store in ``directory`` (each namespace's folder): path -> (size, mtime in
    ns). Links and anything but regular files are left out."""
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
                    found[os.path.join(folder, name)] = (info.st_size, info.st_mtime_ns)
    return found


def evict(
    sizes: dict[str, tuple[int, int]], grow: int, max_bytes: int, keep: str | None, soonest: dict[str, int]
) -> bool:
    """Remove segments (never ``keep``) until ``grow`` more bytes fit in ``max_bytes``; whether they do.

    First the segments that hold nothing upcoming (``soonest``: path -> position of the first upcoming entry
    it holds), least recently used first; then those whose first upcoming entry comes latest."""
    total = sum(size for size, _ in sizes.values())
    if total + grow <= max_bytes:
        return True
    order = sorted(
        (path for path in sizes if path != keep),
        key=lambda path: (path in soonest, -soonest.get(path, 0), sizes[path][1]),
    )
    for path in order:
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= sizes[path][0]
        if total + grow <= max_bytes:
            return True
    return False
