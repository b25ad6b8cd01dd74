"""ShardCache: whole remote shards on node-local disk, shared by every rank and worker on the node.

An entry is a shard's bytes under a name made of its SHA-256 and size as the index records them, so two
datasets holding the same shard share it and a changed shard never matches an old entry. Entries appear
by rename (a reader never sees a partial one) and are checked against the index's SHA-256 as they are
fetched; one process fetches a shard while the others wait on its lock
(:class:`~shardio.storage.locks.FileLock`) and then map the same file. A reader that finds a cached shard
damaged later (a tar checksum, a zstd checksum, a size) calls :meth:`ShardCache.discard` and fetches it again.

The cache holds at most ``max_bytes``, its entries and the fetches under way together, whatever the number
of processes and read-ahead threads filling it at once: a fetch reserves its shard's bytes before it starts,
under the cache's one reservation lock (``.reserve.lock``), by creating its temporary file, whose name records
the shard's size (``.tmp-XXXXXXXX-<sha256>-<size>.fill``); it evicts the least recently used entries to make
room for it, counting every other fetch's reservation. Where the room is held by fetches under way (nothing
left to evict), it waits for them, up to :data:`ROOM_WAIT_S`, then reads the shard remotely. A reservation
whose fetch died (its shard's lock is free) is removed. "Used" is set both when a shard is read and when a
worker's read-ahead schedules it (:meth:`touch`), so the shards the plan reads next are the last to be
evicted. Removing an entry that a process still maps is safe (the file lives until it is unmapped). A full
disk evicts more and tries once again; if that fails too the shard is read remotely, by ranges, and a
warning says so.

Only regular files named as the cache names them are counted, evicted or pruned: a directory, link or any
other file put there is left alone (never deleted: the cache did not write it).

Housekeeping: a fetch removes its lock file when it is done, an entry takes a lock file left by a killed fetch
with it when it is evicted or discarded, and :meth:`ShardCache.prune` (``shardio cache --prune``) also removes
lock files without an entry and the temporary files of fetches that died (older than ``stale`` seconds). A
lock file is removed only by a process holding its lock, and a process that takes a lock takes the file that
is under that name once locked (``filelock`` locks again where it was removed meanwhile): two processes never
both believe they hold one shard's lock."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from ..errors import IntegrityError, OutputError
from ..storage.files import staged
from ..storage.locks import FileLock, polls, remove_if_free

__all__ = ["ROOM_WAIT_S", "ShardCache"]

logger = logging.getLogger(__name__)

ROOM_WAIT_S = 60.0
"""Seconds a fetch waits for other fetches under way to leave room in the cache, before reading remotely."""
_ENTRY = re.compile(r"^[0-9a-f]{64}-[0-9]+\.shard$")
_FILLING = re.compile(r"^\.tmp-.*-([0-9a-f]{64})-([0-9]+)\.fill$")
_RESERVE = ".reserve.lock"
_threads = threading.Lock()  # a process's read-ahead threads queue here, not by polling the file lock


def _new_reserving_lock() -> None:
    global _threads
    _threads = threading.Lock()  # a fork's child: a thread of the parent may have held it


os.register_at_fork(after_in_child=_new_reserving_lock)


class ShardCache:
    """Remote shards kept whole in ``directory`` (created when needed), at most ``max_bytes`` in all."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def _name(self, sha256: str, size: int) -> str:
        return os.path.join(self.directory, f"{sha256}-{size}.shard")

    def lookup(self, sha256: str, size: int) -> str | None:
        """The local path of the shard with this SHA-256 and size, when cached (marked as used); else None."""
        path = self._name(sha256, size)
        try:
            if os.path.getsize(path) == size:
                os.utime(path)
                return path
        except OSError:
            pass
        return None

    def touch(self, sha256: str, size: int) -> None:
        """Mark the shard as about to be read (the plan's read-ahead scheduled it), so it is evicted last."""
        try:
            os.utime(self._name(sha256, size))
        except OSError:
            pass

    def fill(self, sha256: str, size: int, fetch: Callable[[BinaryIO], None], where: str) -> str | None:
        """The shard cached, fetched with ``fetch(out)`` (which writes its bytes) unless another process did
        it first; None when it cannot be held within ``max_bytes`` (fetches under way keep the room past
        :data:`ROOM_WAIT_S`) or the disk has no room for it even after eviction. A fetched shard whose SHA-256
        differs from the index's is not kept (:class:`IntegrityError`)."""
        if size > self.max_bytes:
            return None
        os.makedirs(self.directory, exist_ok=True)
        path = self._name(sha256, size)
        fetching = f"another process fetching {where} into the shard cache"
        with FileLock(path + ".lock", what=fetching):
            found = self.lookup(sha256, size)
            if found is not None:
                return found
            for attempt in range(2):
                try:
                    with self._reserved(path, sha256, size, size * (attempt + 1)) as out:
                        if out is None:
                            logger.debug(
                                "%s: no room in the shard cache %s; read remotely", where, self.directory
                            )
                            return None
                        self._fetch_into(out, sha256, size, fetch, where)
                    return path
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    logger.warning(
                        "%s: no room in the shard cache %s (%s)%s",
                        where,
                        self.directory,
                        exc,
                        "; evicting more" if attempt == 0 else "; reading it remotely instead",
                    )
        return None

    @contextlib.contextmanager
    def _reserved(self, path: str, sha256: str, size: int, need: int) -> Iterator[BinaryIO | None]:
        """The temporary file of the entry at ``path``, made once ``need`` bytes fit beside the entries and
        the other fetches' reservations (evicting entries; waiting for fetches under way); renamed to ``path``
        when the block ends without an exception. None when no room came within :data:`ROOM_WAIT_S`. The
        file is made and renamed under the reservation lock, so that a fill's listing of the directory sees
        it under one of its names (a rename while a directory is listed may show it under neither)."""
        deadline = time.monotonic() + ROOM_WAIT_S
        pauses = polls()
        while True:
            with contextlib.ExitStack() as fetching:
                with self._reserving():
                    room = self._make_room(need, keep=path)
                    if room:  # the reservation: a file whose name says its size
                        out = fetching.enter_context(staged(path, "w+b", suffix=f"-{sha256}-{size}.fill"))
                if room:
                    yield out
                    with self._reserving():
                        fetching.close()  # the rename to the entry
                    return
            if time.monotonic() >= deadline:
                yield None
                return
            time.sleep(next(pauses))

    @contextlib.contextmanager
    def _reserving(self) -> Iterator[None]:
        """The cache's reservation lock (a process's threads queue on a thread lock first, not by polling)."""
        with (
            _threads,
            FileLock(os.path.join(self.directory, _RESERVE), what="room in the shard cache", record=False),
        ):
            yield

    def _fetch_into(
        self, out: BinaryIO, sha256: str, size: int, fetch: Callable[[BinaryIO], None], where: str
    ) -> None:
        fetch(out)
        out.flush()
        out.seek(0)
        hashed = hashlib.sha256()
        while chunk := out.read(1 << 22):  # hashlib.file_digest is Python 3.11's
            hashed.update(chunk)
        digest, got = hashed.hexdigest(), out.tell()
        if got != size or digest != sha256:
            raise IntegrityError(
                f"{where}: fetched {got} bytes with SHA-256 {digest}, the index records "
                f"{size} bytes and {sha256}: the remote shard changed after indexing"
            )

    def discard(self, sha256: str, size: int) -> None:
        """Remove the entry (a reader found it damaged); the next reader fetches it again."""
        self._remove(self._name(sha256, size))

    def _remove(self, path: str) -> bool:
        """Remove an entry, then its lock file unless a process holds that lock; whether the entry was
        there."""
        try:
            os.unlink(path)
            removed = True
        except FileNotFoundError:
            removed = False
        remove_if_free(path + ".lock")
        return removed

    def prune(self, stale: float = 3600.0) -> int:
        """Evict down to ``max_bytes``, and remove lock files without an entry (unless held) and temporary
        files of fetches older than ``stale`` seconds (a fetch that died); returns how many files went. Only
        regular files are looked at: a directory or link of those names is left alone."""
        self.evict(0)
        removed = 0
        now = time.time()
        for name, info in self._files():
            path = os.path.join(self.directory, name)
            if name.endswith(".shard.lock") and not os.path.exists(path[: -len(".lock")]):
                removed += remove_if_free(path)
            elif name.startswith(".tmp-") and now - info.st_mtime > stale:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed += 1
        return removed

    def evict(self, need: int, keep: str = "") -> None:
        """Remove least recently used entries (never ``keep``) until ``need`` more bytes fit in
        ``max_bytes`` beside the entries (fetches under way not counted: see :meth:`fill`)."""
        self._evict_to(self.max_bytes - need, self._entries(), keep)

    def used_bytes(self) -> int:
        """Bytes the entries take now."""
        return sum(size for _, size, _ in self._entries())

    def _files(self) -> list[tuple[str, os.stat_result]]:
        """The regular files of the cache directory (links not followed), with their ``lstat``."""
        found = []
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(info.st_mode):
                            found.append((entry.name, info))
        except FileNotFoundError:
            pass
        return found

    def _entries(self, files: list[tuple[str, os.stat_result]] | None = None) -> list[tuple[int, int, str]]:
        """``(mtime_ns, size, path)`` of every entry (a regular file named as :meth:`_name` names them) among
        ``files`` (default: the directory's)."""
        return [
            (info.st_mtime_ns, info.st_size, os.path.join(self.directory, name))
            for name, info in (self._files() if files is None else files)
            if _ENTRY.match(name)
        ]

    def _evict_to(self, bound: int, entries: list[tuple[int, int, str]], keep: str) -> int:
        """Remove least recently used ``entries`` (never ``keep``) until they take at most ``bound`` bytes;
        the bytes they take then."""
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= bound:
                break
            if path == keep:
                continue
            self._remove(path)
            total -= size
        return total

    def _make_room(self, need: int, keep: str) -> bool:
        """With the reservation lock held: evict until ``need`` more bytes fit beside the entries and the
        live reservations (a dead fetch's is removed); whether they do."""
        reserved = 0
        files = self._files()
        for name, _ in files:
            match = _FILLING.match(name)
            if match is None:
                continue
            if self._filling(f"{match.group(1)}-{match.group(2)}.shard.lock"):
                reserved += int(match.group(2))
            else:  # its fetch died: the reservation goes
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))
        return self._evict_to(
            self.max_bytes - reserved - need, self._entries(files), keep
        ) + reserved + need <= (self.max_bytes)

    def _filling(self, lock_name: str) -> bool:
        """Whether a fetch holds the shard lock ``lock_name`` (a fetch holds it while its reservation
        exists; a file left there unlocked is a dead fetch's)."""
        path = os.path.join(self.directory, lock_name)
        if not os.path.exists(path):
            return False
        lock = FileLock(path)
        try:
            if not lock.acquire(0):
                return True
        except (OSError, OutputError):
            return True  # cannot tell: counted
        lock.release()
        return False
