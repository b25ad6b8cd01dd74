"""ShardCache: whole remote shards on node-local disk, shared by every rank and worker on the node.

An entry is a shard's bytes under a name made of its SHA-256 and size as the index records them, so two
datasets holding the same shard share it and a changed shard never matches an old entry. Entries appear
by rename (a reader never sees a partial one) and are checked against the index's SHA-256 as they are
fetched; one process fetches a shard while the others wait on its lock (``fcntl.flock``) and then map
the same file. A reader that finds a cached shard damaged later (a tar checksum, a zstd checksum, a size)
calls :meth:`ShardCache.discard` and fetches it again.

The cache holds at most ``max_bytes``: before an entry is added, the least recently used entries go,
where "used" is set both when a shard is read and when a worker's read-ahead schedules it
(:meth:`touch`), so the shards the plan reads next are the last to be evicted. Removing an entry that a
process still maps is safe (the file lives until it is unmapped). A full disk evicts more and tries once
again; if that fails too the shard is read remotely, by ranges, and a warning says so.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from ..errors import IntegrityError

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
        """The shard cached, fetched with ``fetch(out)`` (which writes its bytes) unless another process did it
        first; None when the disk has no room for it even after eviction. A fetched shard whose SHA-256 differs
        from the index's is not kept (:class:`IntegrityError`)."""
        if size > self.max_bytes:
            return None
        os.makedirs(self.directory, exist_ok=True)
        path = self._name(sha256, size)
        with open(path + ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
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
                    logger.warning("%s: no room in the shard cache %s (%s)%s", where, self.directory, exc,
                                   "; evicting more" if attempt == 0 else "; reading it remotely instead")
        return None

    def _fetch_into(self, path: str, sha256: str, size: int, fetch: Callable[[BinaryIO], None], where: str) -> None:
        handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(handle, "w+b") as out:
                fetch(out)
                out.flush()
                out.seek(0)
                digest = hashlib.file_digest(out, "sha256").hexdigest()
                got = out.tell()
            if got != size or digest != sha256:
                raise IntegrityError(f"{where}: fetched {got} bytes with SHA-256 {digest}, the index records "
                                     f"{size} bytes and {sha256}: the remote shard changed after indexing")
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def discard(self, sha256: str, size: int) -> None:
        """Remove the entry (a reader found it damaged); the next reader fetches it again."""
        try:
            os.unlink(self._name(sha256, size))
        except FileNotFoundError:
            pass

    def evict(self, need: int, keep: str = "") -> None:
        """Remove least recently used entries (never ``keep``) until ``need`` more bytes fit in ``max_bytes``."""
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
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
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
