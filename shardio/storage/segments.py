"""Segments: a node-local store of checked byte entries keyed by number, shared by every process of the node.

A store is a directory (private to its owner, ``0700``; else not used) holding a ``secret`` (16 random
bytes, ``0600``) and a subdirectory per namespace, of segment files (``*.seg``), each appended by one process
only: an entry is a 40-byte header (magic, number, the caller's 64-bit ``meta``, payload length, checksum)
and its payload. The checksum (xxh3-64 of header and payload, seeded by the secret; not a MAC: permissions
keep other users out) makes an entry of another store, cut short or changed on disk distrusted (counted,
never returned). A process checks an entry once, then reads it unchecked while its segment's status stays
the same (:mod:`~shardio.storage.entrytrust`).

Bounded: a writer reserves room before it appends (``ftruncate`` of its segment, under the store's lock, after
evicting whole segments of any namespace to fit ``max_bytes``), so the files' sizes never add up past the
bound. What a writer reserved and did not fill is zeros, where a scan of the segment stops. Eviction prefers
segments holding none of the numbers :meth:`Segments.upcoming` names, least recently used first, then those
whose first upcoming number comes latest. A process reads a segment through its memory map (``LocalShard``: a
file cut short is a typed error, not SIGBUS) on a descriptor it keeps, so a segment removed while read stays
readable. A full disk or a file-size limit (``ENOSPC``, ``EDQUOT``, ``EFBIG``) stops this process's writes
with one warning; reads go on.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import struct
import time

import numpy as np
import xxhash

from ..errors import ShardioError
from .entrytrust import EntryTrust
from .eviction import SUFFIX, evict, segment_sizes, soonest
from .localshard import LocalShard
from .locks import FileLock
from .privatedir import private_dir, secret

__all__ = ["HEADER", "Segments"]

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<4s4xQQQQ")  # magic, number, meta, payload length, checksum
_MAGIC = b"SDC1"
_MASK = (1 << 64) - 1
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)
TOUCH_S = 10.0  # a segment read from is marked used (its time set) at most this often per process
MAX_SEGMENT = 1 << 30  # bytes; entries past it are not read (offsets are int32)
RESCAN_S = 1.0  # a miss rescans the namespace's segments (others' new entries) at most this often


class Segments:
    """Entries numbered ``0 .. count - 1`` in namespace ``namespace`` of the store in ``directory``, whose
    segment files add up to at most ``max_bytes`` (every namespace together). Not usable (:attr:`on` false)
    where the directory is not private or has no secret: every lookup misses and nothing is written."""

    def __init__(self, directory: str, namespace: str, max_bytes: int, count: int) -> None:
        self.directory = directory
        self.path = os.path.join(directory, namespace)
        self.max_bytes = max_bytes
        self.count = count
        self.reserve = min(max(max_bytes // 64, 1 << 20), 64 << 20)  # a lock per reservation: ~ms
        self.segment_bytes = min(max(max_bytes // 16, self.reserve), MAX_SEGMENT)
        self.distrusted = 0
        """Entries found changed or foreign (checksum, header) and ignored, in this process."""
        self.on = private_dir(directory) and private_dir(self.path)
        self._seed = secret(directory) if self.on else None
        self.on = self._seed is not None
        self._writes = self.on
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._where = np.full(self.count, -1, np.int32)  # number -> segment slot (-1: none known)
        # 20 bytes a sample (8 the trust's), 24 with upcoming(): a segment is at most 1 GiB (segment_bytes)
        self._offset, self._length = np.zeros(self.count, np.int32), np.zeros(self.count, np.int32)
        self._fds: list[int] = []  # slot -> descriptor (-1: closed)
        self._maps: list[LocalShard | None] = []  # slot -> its entries' bytes, mapped where the kernel allows
        self._names: dict[str, int] = {}  # segment name -> slot
        self._scanned: list[int] = []  # slot -> offset scanned to
        self._touched: list[float] = []  # slot -> when this process last marked it used
        self._trust = EntryTrust(self.count)  # entries checked once, while their segment is unchanged
        self._scan_at = 0.0
        self._writer: tuple[int, int, int] | None = None  # (slot, write offset, reserved end)
        self._next_use: np.ndarray | None = None

    def close(self) -> None:
        """Close every segment; a segment this process wrote loses what it reserved and did not fill."""
        if self._pid != os.getpid():
            return
        if self._writer is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fds[self._writer[0]], self._writer[1])
        for fd, mapped in zip(self._fds, self._maps):
            if fd >= 0:
                os.close(fd)
            if mapped is not None:
                mapped.close()
        self._reset()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()

    def _check(self, number: int, meta: int, *parts: memoryview | bytes) -> int:
        prefix = HEADER.pack(_MAGIC, number, meta, sum(map(len, parts)), 0)[:-8]
        seed = (self._seed or 0) ^ xxhash.xxh3_64_intdigest(prefix, seed=self._seed or 0)
        digest = xxhash.xxh3_64(seed=seed & _MASK)  # streamed: the same digest as of the parts joined
        for part in parts:
            digest.update(part)
        return digest.intdigest()

    def get(self, number: int) -> tuple[int, memoryview] | None:
        """The ``meta`` and payload of entry ``number``, checked; None where there is none (or it was found
        changed: counted in :attr:`distrusted`)."""
        if not self.on:
            return None
        if self._pid != os.getpid():
            self._reset()
        slot, now = int(self._where[number]), time.monotonic()
        stale = now - self._scan_at > 10 * RESCAN_S  # segments others evicted are let go (their disk freed)
        if stale or (slot < 0 and now - self._scan_at >= RESCAN_S):
            self._scan_at = now
            self.scan()
            slot = int(self._where[number])
        if slot < 0:
            return None
        offset, length = int(self._offset[number]), int(self._length[number])
        mapped = self._maps[slot]
        try:
            if mapped is None or mapped.size < offset + length:  # new, or grown since mapped
                if mapped is not None:
                    mapped.close()  # its map lives on while a view of it does
                size = max(offset + length, self._scanned[slot])
                mapped = self._maps[slot] = LocalShard(os.dup(self._fds[slot]), size)
            data = mapped.view(offset, length, "")
        except (OSError, ShardioError):
            data = memoryview(b"")
        generation = self._trust.generation(slot, self._fds[slot])
        found = self._parse(number, data, check=not self._trust.trusted(number, generation))
        if found is None:
            self.distrusted += 1
            self._where[number] = -1
        else:
            self._trust.checked(number, generation)
            self._touch(slot)
        return found

    def _touch(self, slot: int) -> None:
        now = time.monotonic()
        if now - self._touched[slot] > TOUCH_S:
            self._touched[slot] = now
            with contextlib.suppress(OSError):  # least recently used first; mtime kept (see EntryTrust)
                os.utime(self._fds[slot], ns=(time.time_ns(), os.fstat(self._fds[slot]).st_mtime_ns))

    def holds(self, numbers: np.ndarray) -> bool:
        """Whether entries ``numbers`` are all known to this process (a rescan at most every
        :data:`RESCAN_S`): their :meth:`get` is then likely to find them."""
        if not self.on:
            return False
        if self._pid != os.getpid():
            self._reset()
        elif (self._where[numbers] >= 0).all():
            return True
        if time.monotonic() - self._scan_at < RESCAN_S:
            return False
        self._scan_at = time.monotonic()
        self.scan()
        return bool((self._where[numbers] >= 0).all())

    def _parse(self, number: int, data: memoryview, check: bool = True) -> tuple[int, memoryview] | None:
        if len(data) < HEADER.size:
            return None
        magic, got, meta, length, checksum = HEADER.unpack_from(data)
        payload = data[HEADER.size :]
        if (
            magic != _MAGIC
            or got != number
            or length != len(payload)
            or (check and self._check(number, meta, payload) != checksum)
        ):
            return None
        return meta, payload

    def scan(self) -> None:
        """Learn the entries other processes added since the last scan (new segments, and segments' new
        entries); forget segments that went."""
        try:
            names = [name for name in os.listdir(self.path) if name.endswith(SUFFIX)]
        except OSError:
            return
        present = set(names)
        for name, slot in list(self._names.items()):
            if name not in present and (self._writer is None or self._writer[0] != slot):
                self._forget(name, slot)
        for name in names:
            known = self._names.get(name)
            if known is None:
                known = self._open(name)
                if known is None:
                    continue
            if self._writer is None or self._writer[0] != known:
                self._scan_segment(known)

    def _open(self, name: str) -> int | None:
        try:
            fd = os.open(
                os.path.join(self.path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            )
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return self._add_slot(name, fd, 0.0)

    def _add_slot(self, name: str, fd: int, touched: float) -> int:
        self._names[name] = len(self._fds)
        self._fds.append(fd)
        self._maps.append(None)
        self._scanned.append(0)
        self._touched.append(touched)
        self._trust.add()
        return len(self._fds) - 1

    def _forget(self, name: str, slot: int) -> None:
        del self._names[name]
        self._trust.forget(slot)
        os.close(self._fds[slot])
        self._fds[slot] = -1
        mapped, self._maps[slot] = self._maps[slot], None
        if mapped is not None:
            mapped.close()
        self._where[self._where == slot] = -1

    def _scan_segment(self, slot: int) -> None:
        fd, offset = self._fds[slot], self._scanned[slot]
        size = os.fstat(fd).st_size
        while offset + HEADER.size <= size:
            header = os.pread(fd, HEADER.size, offset)
            if len(header) < HEADER.size:
                break
            magic, number, _, length, _ = HEADER.unpack(header)
            end = offset + HEADER.size + length
            if magic != _MAGIC or not 0 <= number < self.count or end > min(size, MAX_SEGMENT):
                break  # reserved zeros (a writer's tail), or not an entry: read no further
            self._where[number], self._offset[number], self._length[number] = slot, offset, end - offset
            offset = end
        self._scanned[slot] = offset

    def upcoming(self, numbers: np.ndarray) -> None:
        """The numbers this process reads next, in order: eviction keeps the segments they are in."""
        next_use = np.full(self.count, np.iinfo(np.int32).max, np.int32)
        numbers = numbers[: np.iinfo(np.int32).max - 1]
        next_use[numbers[::-1]] = np.arange(len(numbers), dtype=np.int32)[::-1]
        self._next_use = next_use

    def put(self, number: int, meta: int, payload: memoryview, tail: bytes = b"") -> bool:
        """Append entry ``number``, whose payload is ``payload`` then ``tail`` (unless this process cannot
        write: a full disk, a bound too small); whether it was."""
        if not self._writes:
            return False
        if self._pid != os.getpid():
            self._reset()
        need = HEADER.size + len(payload) + len(tail)
        if need > self.segment_bytes:
            return False
        try:
            if self._writer is None or self._writer[1] + need > self._writer[2]:
                if not self._reserve(need):
                    return False
            assert self._writer is not None
            slot, offset, end = self._writer
            check = self._check(number, meta, payload, tail)
            header = HEADER.pack(_MAGIC, number, meta, len(payload) + len(tail), check)
            os.pwritev(self._fds[slot], [header, payload, tail], offset)
        except OSError as exc:
            if exc.errno not in _FULL:
                raise
            self._writes = False
            logger.warning("decoded cache %s: cannot write (%s): reading on without caching", self.path, exc)
            return False
        self._writer = (slot, offset + need, end)
        self._scanned[slot] = offset + need
        self._where[number], self._offset[number], self._length[number] = slot, offset, need
        return True

    def _reserve(self, need: int) -> bool:
        """Room for ``need`` more bytes in this process's segment (a new one when it would outgrow
        :attr:`segment_bytes`), evicting others' to keep within the bound; whether there is."""
        chunk = max(need, self.reserve)
        with FileLock(os.path.join(self.directory, "lock"), what="the decoded cache", record=False):
            writer = self._writer
            if writer is not None:
                slot, offset, end = writer
                if os.fstat(self._fds[slot]).st_nlink == 0 or offset + chunk > self.segment_bytes:
                    os.ftruncate(self._fds[slot], offset)  # evicted by another process, or full: done with
                    self._scanned[slot] = offset
                    writer = self._writer = None
            mine = None if writer is None else os.path.join(self.path, self._name_of(writer[0]))
            grow = chunk if writer is None else writer[1] + chunk - writer[2]
            upcoming = soonest(self._where, self._next_use, self._names, self.path)
            fits, removed = evict(segment_sizes(self.directory), grow, self.max_bytes, mine, upcoming)
            for path in removed:  # this process's descriptors would keep their disk
                if os.path.dirname(path) == self.path and os.path.basename(path) in self._names:
                    self._forget(os.path.basename(path), self._names[os.path.basename(path)])
            if not fits:
                return False
            if writer is None:
                name = f"{os.urandom(8).hex()}{SUFFIX}"
                fd = os.open(
                    os.path.join(self.path, name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
                )
                writer = (self._add_slot(name, fd, time.monotonic()), 0, 0)
            slot, offset, end = writer
            try:
                os.ftruncate(self._fds[slot], offset + chunk)
            except OSError:
                if offset == 0:  # a new segment that cannot hold an entry: not left behind
                    os.unlink(os.path.join(self.path, self._name_of(slot)))
                raise
            self._writer = (slot, offset, offset + chunk)
        return True

    def _name_of(self, slot: int) -> str:
        return next(name for name, s in self._names.items() if s == slot)
