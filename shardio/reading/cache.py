"""ShardCache: whole remote shards on node-local disk, shared by every rank and worker on the node.

An entry is a shard's bytes under a name made of its SHA-256 and size as the index records them, so two
datasets holding the same shard share it and a changed shard never matches an old entry. Entries appear
by rename (a reader never sees a partial one) and are checked against the index's SHA-256 as they are
fetched; one process fetches a shard while the others wait on its lock
(:class:`~shardio.storage.locks.FileLock`) and then map the same file. A reader that finds a cached shard
damaged later (a tar checksum, a zstd checksum, a size) calls :meth:`ShardCache.discard` and fetches it again.

The cache holds at most ``max_bytes``: before an entry is added, the least recently used entries go,
where "used" is set both when a shard is read and when a worker's read-ahead schedules it
(:meth:`touch`), so the shards the plan reads next are the last to be evicted. Removing an entry that a
process still maps is safe (the file lives until it is unmapped). A full disk evicts more and tries once
again; if that fails too the shard is read remotely, by ranges, and a warning says so.

Housekeeping: a fetch removes its lock file when it is done, an entry takes a lock file left by a killed fetch
with it when it is evicted or discarded, and :meth:`ShardCache.prune` (``shardio cache --prune``) also removes
lock files without an entry and the temporary files of fetches that died (older than ``stale`` seconds). A
lock file is removed only by a process holding its lock, and a process that takes a lock takes the file that
is under that name once locked (``filelock`` locks again where it was removed meanwhile): two processes never
both believe they hold one shard's lock."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from collections.abc import Callable
from typing import BinaryIO

from ..errors import IntegrityError
from ..storage.files import staged
from ..storage.locks import FileLock, remove_if_free

__all__ = ["ShardCache"]

logger = logging.getLogger(__name__)


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
        it first; None when the disk has no room for it even after eviction. A fetched shard whose SHA-256
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
                self.evict(size * (attempt + 1), keep=path)
                try:
                    self._fetch_into(path, sha256, size, fetch, where)
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

    def _fetch_into(
        self, path: str, sha256: str, size: int, fetch: Callable[[BinaryIO], None], where: str
    ) -> None:
        with staged(path, "w+b", suffix="") as out:  # not named *.shard: eviction counts those
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
        files of fetches older than ``stale`` seconds (a fetch that died); returns how many files went."""
        self.evict(0)
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        removed = 0
        now = time.time()
        for name in names:
            path = os.path.join(self.directory, name)
            if name.endswith(".shard.lock") and not os.path.exists(path[: -len(".lock")]):
                removed += remove_if_free(path)
            elif name.startswith(".tmp-"):
                try:
                    if now - os.stat(path).st_mtime > stale:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def evict(self, need: int, keep: str = "") -> None:
        """Remove least recently used entries (never ``keep``) until ``need`` more bytes fit in
        ``max_bytes``."""
        entries = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if not name.endswith(".shard"):
                continue
            path = os.path.join(self.directory, name)
            try:
                info = os.stat(path)
            except FileNotFoundError:
                continue
            entries.append((info.st_mtime_ns, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total + need <= self.max_bytes:
                break
            if path == keep:
                continue
            self._remove(path)
            total -= size

    def used_bytes(self) -> int:
        """Bytes the entries take now."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        total = 0
        for name in names:
            if name.endswith(".shard"):
                try:
                    total += os.path.getsize(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
        return total
