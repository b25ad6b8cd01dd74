"""EntryTrust: which entries of a store's segments a process has checked, and may read again unchecked.

An entry's checksum is checked at its first read in a process; after that it is trusted while its segment's
status (mtime and size, read with one ``fstat`` at most once a millisecond of reads) stays as it was at that
read, and only where its mtime was already older than :data:`SETTLED_NS` then: file times tick every few
milliseconds, so a write within a tick of a recent one could leave the mtime as it was, but any write to a
settled segment (``write``, a write through a map, a truncation) moves it. Not the ctime: readers mark a
segment used by its atime (``utime``, which sets the ctime). The mtime could be set back by hand: the store's
permissions keep that to its owner. A changed segment has each of its entries checked again. So a changed
entry is distrusted at the first status check after the change (a millisecond of reads later at most), as a
changed local shard is (:mod:`~shardio.storage.localshard`); a segment being written (the first epoch's) has
every read checked.
"""

from __future__ import annotations

import os
import time

import numpy as np

__all__ = ["CHECK_EVERY_NS", "SETTLED_NS", "EntryTrust"]

CHECK_EVERY_NS = 1_000_000
"""A segment's status is checked at most once a millisecond of reads (an ``fstat`` costs about 1.7 µs)."""
SETTLED_NS = 50_000_000
"""A segment whose status changed less than this long ago has every read of its entries checked."""


class EntryTrust:
    """The checked entries of a store's ``count`` numbers, by segment slot (slots are added in order)."""

    def __init__(self, count: int) -> None:
        self._trusted = np.zeros(count, np.int64)  # number -> its segment's generation when checked (0: none)
        self._gens: list[int] = []  # slot -> generation (0: not settled, every read checked)
        self._status: list[tuple[int, int]] = []  # slot -> (mtime, size) at its last check
        self._checked: list[int] = []  # slot -> time.monotonic_ns() of its last check
        self._last = 0

    def add(self) -> None:
        """A new slot (a segment opened)."""
        self._gens.append(0)
        self._status.append((0, 0))
        self._checked.append(0)

    def forget(self, slot: int) -> None:
        """Slot ``slot``'s segment is closed: nothing in it is trusted."""
        self._gens[slot] = 0

    def generation(self, slot: int, fd: int) -> int:
        """Slot ``slot``'s generation, its segment open on ``fd``: nonzero while the segment's status is
        settled and unchanged since its last check (a new one after a change); 0 when it is not settled."""
        now = time.monotonic_ns()
        if now - self._checked[slot] < CHECK_EVERY_NS:
            return self._gens[slot]
        self._checked[slot] = now
        try:
            info = os.fstat(fd)
        except OSError:
            self._gens[slot] = 0
            return 0
        status = (info.st_mtime_ns, info.st_size)
        if status != self._status[slot] or not self._gens[slot]:
            self._status[slot] = status
            self._last += 1
            self._gens[slot] = self._last if time.time_ns() - info.st_mtime_ns > SETTLED_NS else 0
        return self._gens[slot]

    def trusted(self, number: int, generation: int) -> bool:
        """Whether entry ``number`` was checked in its segment's generation ``generation`` (nonzero)."""
        return generation != 0 and int(self._trusted[number]) == generation

    def checked(self, number: int, generation: int) -> None:
        """Entry ``number`` was found sound in generation ``generation`` (0: not remembered)."""
        if generation:
            self._trusted[number] = generation
