"""DirectoryLock: one writer at a time in a dataset directory, and a message naming the one that holds it.

The :class:`~shardio.storage.locks.FileLock` of ``.shardio.lock`` in the directory, which records the holder's
host, pid and start time. The kernel drops the lock when its holder exits, however it exits, so a crashed run
never leaves the directory locked; the file itself is removed on release.
"""

from __future__ import annotations

import os

from ..errors import OutputError, shown_path
from .locks import FileLock

__all__ = ["LOCK_FILE", "DirectoryLock"]

LOCK_FILE = ".shardio.lock"


class DirectoryLock:
    """Hold ``directory``'s writer lock from construction until :meth:`release`; raises
    :class:`~shardio.errors.OutputError` naming the holder when another process has it."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_FILE)
        self._lock = FileLock(self.path, what=f"the writer lock of {shown_path(directory)}")
        try:
            taken = self._lock.acquire(0)
        except OSError as exc:
            raise OutputError(
                f"{shown_path(directory)}: cannot create the lock file {LOCK_FILE} "
                f"({exc.strerror or exc}); expected a writable directory"
            ) from None
        if not taken:
            raise OutputError(
                f"{shown_path(directory)} is being written by another shardio run ({self._lock.holder()}); "
                "wait for it to finish, or write elsewhere"
            )

    def release(self) -> None:
        """Remove the lock file and let the next writer in (idempotent)."""
        self._lock.release()
