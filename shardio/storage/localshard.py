"""LocalShard: one open local shard file, whose byte ranges are read without copies where the kernel allows.

A range is a view of the file's memory map. Touching a mapped page past the end of a file that shrank after
it was opened raises SIGBUS, which kills the process; so each range is first faulted in with
``MADV_POPULATE_READ`` (Linux 5.14+), which instead fails with ``EFAULT``, and that becomes a typed error.
Populating the range also replaces a page fault per 4 KiB by one call. Where the kernel lacks it (or on
other systems), ranges are read with ``pread``.

A shard rewritten in place or replaced (renamed over) while a run reads it would mix two versions of its
audio, silently where the size stays the same. So a shard opened with ``unchanged_since`` (the time its index
was loaded, which DataLoader workers share) is checked after its bytes are read or mapped (at most once a
millisecond: :data:`CHECK_EVERY_NS`): a status-change time (``st_ctime``, which every write, rename onto the
path, ``chmod`` or ``chown`` sets, and no one can set back) later than that, or a status (ctime, mtime, size)
other than at the file's first read in this process, is a :class:`~shardio.errors.ShardChanged`, and so is
every later read of the file. Checked on the open descriptor (one ``fstat``), this also sees a file rewritten
after it was opened; a replacement by rename is seen when a process opens the new file. File times come from a
clock that ticks every few milliseconds, so a file replaced within a tick of the index's load can go unseen.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import sys
import time
import weakref

from ..errors import FormatError, ReadError, ShardChanged

__all__ = ["CAN_MAP", "LocalShard", "NotRegular", "kind", "open_regular", "short_read"]

_MADV_POPULATE_READ = 22  # <linux/mman.h>; Python 3.11's mmap module does not name it
CAN_MAP = sys.platform == "linux" and hasattr(mmap.mmap, "madvise")
"""Whether local plain shards are read as views of a memory map here (else with ``pread``)."""


CHECK_EVERY_NS = 1_000_000
"""A local shard's status is checked at most once a millisecond of reads (an ``fstat`` per sample cost 1.7
µs): a change is seen at the first check after it, a millisecond of reads later at most, which is finer than
the few milliseconds by which file times tick."""


class LocalShard:
    """An open local shard file of ``size`` bytes (the size the index recorded, checked at open), whose status
    must not change after ``unchanged_since`` (``time.time_ns()``; None: not checked)."""

    def __init__(self, fd: int, size: int, unchanged_since: int | None = None) -> None:
        self.fd = fd
        self.size = size
        self.unchanged_since = unchanged_since
        self._changed: ShardChanged | None = None
        self._status: tuple[int, int, int] | None = None  # (ctime, mtime, size) at the first check
        self._checked_ns = 0  # time.monotonic_ns() of the last fstat
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None  # of the map, sliced per range
        self._mapping = CAN_MAP and size > 0
        self.closed = False
        """Whether :meth:`close` was called: a holder of this object opens the file again."""
        # the descriptor is this object's: a reader dropped without close() (a dataset made per validation
        # run, say) must not leak one descriptor per shard it read until the process runs out of them
        self._closer = weakref.finalize(self, os.close, fd)
        self._closer.atexit = False

    def close(self) -> None:
        """Close the file (once; it closes by itself when the object is collected). The map lives on (the
        mmap object holds its own descriptor) until the last view of a range is gone."""
        self._map = self._view = None
        self._mapping = False
        self.closed = True
        self._closer()

    def check_unchanged(self, where: str) -> None:
        """A :class:`ShardChanged` naming ``where`` if the file's status changed after ``unchanged_since``, or
        since this object's first check (see the module docstring); once found, every later check raises
        it."""
        if self.unchanged_since is None:
            return
        if self._changed is None:
            now = time.monotonic_ns()
            if now - self._checked_ns < CHECK_EVERY_NS and self._status is not None:
                return
            self._checked_ns = now
            info = os.fstat(self.fd)
            status = (info.st_ctime_ns, info.st_mtime_ns, info.st_size)
            if self._status is None:
                self._status = status
            if status == self._status and info.st_ctime_ns <= self.unchanged_since:
                return
            how = (
                f"its status changed at {_when(info.st_ctime_ns)}, after its index was loaded at "
                f"{_when(self.unchanged_since)}"
                if info.st_ctime_ns > self.unchanged_since
                else "its status (ctime, mtime, size) changed while this process read it"
            )
            self._changed = ShardChanged(
                f"the local shard file changed ({how}): it was rewritten or replaced while the run reads it, "
                "and reading on would mix two versions of its audio; keep shards unchanged during a run (a "
                "chmod or chown counts as a change too), or re-run 'shardio index' (or re-pack) and start "
                "again"
            )
        raise ShardChanged(f"{where}: {self._changed}")

    def read(self, offset: int, size: int, where: str) -> bytes:
        """``size`` bytes at ``offset``, copied; a short read is a :class:`FormatError`, a changed file a
        :class:`ShardChanged`."""
        try:
            data = os.pread(self.fd, size, offset)
        except OSError as exc:
            raise ReadError(f"{where}: reading {size} bytes failed: {exc}") from exc
        if len(data) != size:
            raise short_read(where, size, offset, len(data))
        self.check_unchanged(where)
        return data

    def view(self, offset: int, size: int, where: str) -> memoryview:
        """``size`` bytes at ``offset``, valid while the caller holds the view: of the map where it can be
        used, else of a copy of their own (a batch holds all its samples' views before decoding any)."""
        view = self.mapped(offset, size, where)
        return view if view is not None else memoryview(self.read(offset, size, where))

    def views(self, offsets: list[int], sizes: list[int], where: str) -> list[memoryview] | None:
        """Several ranges (a batch's samples in this shard) as views of the map, their pages faulted in, the
        file's status checked once; None when mapping is not possible here (read them with :meth:`view`).
        A range past the end of the file is a :class:`FormatError`."""
        for offset, size in zip(offsets, sizes):
            if offset + size > self.size:
                raise short_read(where, size, offset, max(0, self.size - offset))
        if not self._mapping or self._map is None:
            first = self.mapped(offsets[0], sizes[0], where) if offsets and self._mapping else None
            if first is None:
                return None
        assert self._map is not None and self._view is not None
        found, whole, populate = [], self._view, self._map.madvise
        for offset, size in zip(offsets, sizes):
            start = offset - offset % mmap.PAGESIZE
            try:
                populate(_MADV_POPULATE_READ, start, offset + size - start)
            except OSError:
                return None  # mapped() says what went wrong, one range at a time
            found.append(whole[offset : offset + size])
        self.check_unchanged(where)
        return found

    def mapped(self, offset: int, size: int, where: str) -> memoryview | None:
        """The range as a view of the map, its pages faulted in; None when mapping is not possible here."""
        if not self._mapping:
            return None
        if offset + size > self.size:  # the map covers the file as opened; madvise past it is a ValueError
            raise short_read(where, size, offset, max(0, self.size - offset))
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
            raise ReadError(
                f"{where}: reading {size} bytes at offset {offset} failed: an I/O error in the "
                "shard file's pages"
            ) from None
        self.check_unchanged(where)
        return self._view[offset : offset + size]


def _when(ns: int) -> str:
    """A ``time.time_ns()`` value as a UTC time to the microsecond, for messages."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d} UTC"


def short_read(where: str, size: int, offset: int, got: int) -> FormatError:
    """The error for ``got`` bytes where ``size`` were wanted at ``offset``: the file shrank after opening."""
    return FormatError(
        f"{where}: wanted {size} bytes at offset {offset}, got {got} (the shard changed after it was opened?)"
    )


def kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words, for messages about one that is not a regular file."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "of an unknown kind")


class NotRegular(Exception):
    """A path that names a directory, FIFO, device or socket where a regular file is expected; the message
    says which (:func:`kind`)."""

    def __init__(self, mode: int) -> None:
        super().__init__(kind(mode))
        self.directory = stat.S_ISDIR(mode)


def open_regular(path: str) -> tuple[int, int]:
    """A read-only descriptor of the regular file at ``path`` and its size, opened without blocking (a plain
    open of a FIFO waits for a writer); :class:`NotRegular` for anything else, ``OSError`` where it cannot be
    opened."""
    mode = os.stat(path).st_mode  # a device is not opened (opening some acts), a socket cannot be
    if not stat.S_ISREG(mode):
        raise NotRegular(mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(fd)  # again on the descriptor: a FIFO swapped in meanwhile is not read
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegular(info.st_mode)
    return fd, info.st_size
