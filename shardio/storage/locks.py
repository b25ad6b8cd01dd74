"""FileLock: one process at a time on a lock file; shardio's one lock primitive, on the ``filelock`` library.

The lock is the kernel's (``flock`` through ``filelock``), so it dies with its holder, however that exits.
The holder writes a record of itself (host, pid, since) into the lock file, which a refusal or a wait names,
and removes the file when it releases it, while still holding it: ``filelock`` tells a file removed under a
waiter apart (it locks the new one), so lock files outlive a hold only when their holder was killed. Attempts
start a millisecond apart and back off to :data:`POLL_S` (most waits are for work that takes milliseconds); a
wait that lasts :data:`QUIET_S` is logged once, naming the lock file and its holder.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import OutputError
from .files import check_output_file
from .localshard import NotRegular, open_regular

if TYPE_CHECKING:
    import filelock

__all__ = ["FIRST_POLL_S", "POLL_S", "QUIET_S", "FileLock", "polls", "remove_if_free"]

logger = logging.getLogger(__name__)

FIRST_POLL_S = 0.001
"""Seconds before the second attempt to take a lock that another process holds; each later pause doubles."""
POLL_S = 0.03
"""The longest pause between two attempts."""
QUIET_S = 2.0
"""A wait for a lock is logged once it has lasted this many seconds."""
_RECORD_BYTES = 4096
_UNKNOWN = "holder unknown"


def polls() -> Iterator[float]:
    """The pauses between attempts: :data:`FIRST_POLL_S`, doubling up to :data:`POLL_S`, then that."""
    pause = FIRST_POLL_S
    while True:
        yield min(pause, POLL_S)
        pause *= 2


class FileLock:
    """The exclusive lock of lock file ``path`` (made when needed; its directory must exist).

    :meth:`acquire` takes it, waiting up to a deadline; :meth:`release` removes the file and lets the next
    process in. ``waited`` tells
    whether another process held it when this one asked. ``level`` is the level of the one log line of a long
    wait, which says what the process waits for (``what``). Without ``record``, no holder is written into the
    file (a lock taken often and briefly, such as the shard cache's reservation lock: ext4 flushes a file
    truncated and closed, 2 ms each time).
    """

    def __init__(
        self, path: str, *, what: str = "a lock", level: int = logging.INFO, record: bool = True
    ) -> None:
        self.path = path
        self.what = what
        self.level = level
        self.record = record
        self.waited = False
        self._seen = _UNKNOWN
        self._lock: filelock.BaseFileLock | None = None

    def acquire(self, wait: float | None) -> bool:
        """Take the lock within ``wait`` seconds (None: however long it takes): whether it was taken (False:
        the deadline passed). An ``OSError`` when the lock file cannot be made or locked (a read-only
        directory)."""
        check_output_file(self.path)  # a device, FIFO or socket there is neither opened nor removed
        start = time.monotonic()
        pauses = polls()
        logged = False
        # read before the first attempt: filelock before 4.0 truncates the file it
        # opens, the holder's record too
        self._seen = self.holder() if os.path.exists(self.path) else _UNKNOWN
        import filelock  # here: importing shardio stays quick (filelock's import is not)

        lock = filelock.FileLock(self.path, thread_local=False)
        while not _try(lock):
            self.waited = True
            waited = time.monotonic() - start
            if wait is not None and waited >= wait:
                return False
            if not logged and waited >= QUIET_S:
                logger.log(
                    self.level, "waiting for %s: %s is held by %s", self.what, self.path, self.holder()
                )
                logged = True
            pause = next(pauses)
            time.sleep(pause if wait is None else max(0.0, min(pause, wait - waited)))
        self._lock = lock
        if self.record:
            self._record()
        return True

    def holder(self) -> str:
        """Who holds the lock, as its file records it: ``pid 123 on host h since ...`` (else ``holder
        unknown``)."""
        try:
            fd, _ = open_regular(self.path)  # a FIFO put there is not read (it would block)
            with os.fdopen(fd, "rb") as handle:
                record = json.loads(handle.read(_RECORD_BYTES) or b"{}")
            host, since = (_printable(str(record[name]))[:64] for name in ("host", "since"))
            return f"pid {int(record['pid'])} on host {host} since {since}"
        except (OSError, ValueError, KeyError, TypeError, NotRegular):
            return self._seen

    def _record(self) -> None:
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO: no wait
        except OSError:
            return  # the record only names the holder
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(record).encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this process holds the lock through this object."""
        return self._lock is not None

    def release(self) -> None:
        """Remove the lock file and let the next process in (idempotent)."""
        if self._lock is None:
            return
        try:
            os.unlink(self.path)  # while holding it: a process that opened it before locks the next one
        except OSError:
            pass
        self._lock.release()
        self._lock = None

    def __enter__(self) -> FileLock:
        self.acquire(None)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def remove_if_free(path: str) -> bool:
    """Remove the lock file ``path`` when no process holds its lock (taken without waiting); whether it
    went."""
    if not os.path.exists(path):
        return False
    lock = FileLock(path)
    try:
        if not lock.acquire(0):
            return False
    except (OSError, OutputError):  # OutputError: a directory, FIFO or device of that name is not ours
        return False
    lock.release()
    return True


def _try(lock: filelock.BaseFileLock) -> bool:
    import filelock

    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    return True


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)
