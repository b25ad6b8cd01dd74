"""PlanLock: one process of a node plans an epoch while the others that need the same plan wait for it.

An exclusive ``fcntl.flock`` on ``<name>.lock`` beside plan ``name`` (:mod:`shardio.runtime.planfiles`),
taken with ``LOCK_NB`` and polled until a deadline: never an unbounded wait. The polls start a millisecond
apart and back off to :data:`POLL_S`: most waits are for a plan that takes milliseconds (a small dataset, or
a node plan being written), and a fixed 30 ms poll cost every DataLoader worker but one that much at each
epoch's start (on ``shardio bench``'s 50 ms epochs, a third of the 2-worker rate). The kernel drops a dead holder's
lock. The holder removes the lock file when it releases it (a process that opened it just before is told apart
by its inode, and locks again), so lock files outlive a hold only when their holder was killed. The lock saves
work only: whoever holds it or not, a plan file's content is a function of its name.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator

__all__ = ["FIRST_POLL_S", "POLL_S", "PlanLock", "polls"]

FIRST_POLL_S = 0.001
"""Seconds before the second attempt to take a lock that another process holds; each later pause doubles."""
POLL_S = 0.03
"""The longest pause between two attempts."""


def polls() -> Iterator[float]:
    """The pauses between attempts: :data:`FIRST_POLL_S`, doubling up to :data:`POLL_S`, then that."""
    pause = FIRST_POLL_S
    while True:
        yield min(pause, POLL_S)
        pause *= 2


class PlanLock:
    """The planning lock of lock file ``path``: :meth:`acquire`, then :meth:`release` once the plan is saved.

    ``waited`` tells whether another process held it when this one asked (it then planned, or tried to).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.waited = False
        self._fd: int | None = None

    def acquire(self, wait: float) -> bool:
        """Take the lock within ``wait`` seconds: whether it was taken (False: the deadline passed). An
        ``OSError`` when the lock file cannot be made or locked (a read-only directory, no ``flock``)."""
        deadline = time.monotonic() + wait
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            pauses = polls()
            try:
                while not _try_lock(fd):
                    self.waited = True
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return False
                    time.sleep(next(pauses))
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd = fd
                return True
            os.close(fd)  # the previous holder removed the file between our open and our lock

    def release(self) -> None:
        """Remove the lock file and let the next process in (idempotent)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
