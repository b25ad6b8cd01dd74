"""LocalShard: one open local shard file, whose byte ranges are read without copies where the kernel allows.

A range is a view of the file's memory map. Touching a mapped page past the end of a file that shrank after
it was opened raises SIGBUS, which kills the process; so each range is first faulted in with
``MADV_POPULATE_READ`` (Linux 5.14+), which instead fails with ``EFAULT``, and that becomes a typed error.
Populating the range also replaces a page fault per 4 KiB by one call. Where the kernel lacks it (or on
other systems), ranges are read with ``pread``.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import sys
import weakref

from ..errors import FormatError, ReadError

__all__ = ["CAN_MAP", "LocalShard", "NotRegular", "kind", "open_regular", "short_read"]

_MADV_POPULATE_READ = 22  # <linux/mman.h>; Python 3.11's mmap module does not name it
CAN_MAP = sys.platform == "linux" and hasattr(mmap.mmap, "madvise")
"""Whether local plain shards are read as views of a memory map here (else with ``pread``)."""


class LocalShard:
    """An open local shard file of ``size`` bytes (the size the index recorded, checked at open)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None  # of the map, sliced per range
        self._mapping = CAN_MAP and size > 0
        # the descriptor is this object's: a reader dropped without close() (a dataset made per validation
        # run, say) must not leak one descriptor per shard it read until the process runs out of them
        self._closer = weakref.finalize(self, os.close, fd)
        self._closer.atexit = False

    def close(self) -> None:
        """Close the file (once; it closes by itself when the object is collected). The map lives on (the
        mmap object holds its own descriptor) until the last view of a range is gone."""
        self._map = self._view = None
        self._closer()

    def read(self, offset: int, size: int, where: str) -> bytes:
        """``size`` bytes at ``offset``, copied; a short read is a :class:`FormatError`."""
        try:
            data = os.pread(self.fd, size, offset)
        except OSError as exc:
            raise ReadError(f"{where}: reading {size} bytes failed: {exc}") from exc
        if len(data) != size:
            raise short_read(where, size, offset, len(data))
        return data

    def view(self, offset: int, size: int, where: str) -> memoryview:
        """``size`` bytes at ``offset``, valid while the caller holds the view: of the map where it can be
        used, else of a copy of their own (a batch holds all its samples' views before decoding any)."""
        view = self.mapped(offset, size, where)
        return view if view is not None else memoryview(self.read(offset, size, where))

    def mapped(self, offset: int, size: int, where: str) -> memoryview | None:
        """The range as a view of the map, its pages faulted in; None when mapping is not possible here."""
        if not self._mapping:
            return None
        if self._map is None:
            try:
                self._map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
            except (OSError, ValueError):  # a file system without mmap, or a file shorter than the index says
                self._mapping = False
                return None
            self._view = memoryview(self._map)
        assert self._view is not None
        start = offset - offset % mmap.PAGESIZE
        try:
            self._map.madvise(_MADV_POPULATE_READ, start, offset + size - start)
        except OSError as exc:
            if exc.errno != errno.EFAULT:  # EINVAL: a kernel before 5.14; read instead from now on
                self._mapping = False
                return None
            actual = os.fstat(self.fd).st_size
            if actual < offset + size:
                raise short_read(where, size, offset, max(0, actual - offset)) from None
            raise ReadError(f"{where}: reading {size} bytes at offset {offset} failed: an I/O error in the "
                            "shard file's pages") from None
        return self._view[offset : offset + size]


def short_read(where: str, size: int, offset: int, got: int) -> FormatError:
    """The error for ``got`` bytes where ``size`` were wanted at ``offset``: the file shrank after opening."""
    return FormatError(f"{where}: wanted {size} bytes at offset {offset}, got {got} "
                       "(the shard changed after it was opened?)")


def kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words, for messages about one that is not a regular file."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "of an unknown kind")


class NotRegular(Exception):
    """A path that names a directory, FIFO, device or socket where a regular file is expected; the message says
    which (:func:`kind`)."""

    def __init__(self, mode: int) -> None:
        super().__init__(kind(mode))
        self.directory = stat.S_ISDIR(mode)


def open_regular(path: str) -> tuple[int, int]:
    """A read-only descriptor of the regular file at ``path`` and its size, opened without blocking (a plain open
    of a FIFO waits for a writer); :class:`NotRegular` for anything else, ``OSError`` where it cannot be opened."""
    mode = os.stat(path).st_mode  # a device is not opened (opening some acts), a socket cannot be
    if not stat.S_ISREG(mode):
        raise NotRegular(mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)  # again on the descriptor: a FIFO swapped in meanwhile is not read
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegular(info.st_mode)
    return fd, info.st_size
