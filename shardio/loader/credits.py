"""Credits: how many batches a ShardLoader worker may send ahead, and the training process's interruptions,
in shared memory instead of a pipe message per batch.

A credit sent as a pipe message cost the training process a pickle and a write (~25 µs a batch here) and
the worker a poll, a read and an unpickle (~30 µs); the credits here are a POSIX semaphore, whose release
and uncontended acquire make no system call. The training process grants a credit for each batch it takes;
a worker takes one before each batch it sends, and blocks on the semaphore (at most ``watch`` seconds at a
time, then looks whether the training process is alive) when it has none.

A worker reads its pipe only when told: the training process counts its interruptions (``STOP``, ``EXIT``)
in a shared counter before it sends one, and releases the semaphore to wake a worker blocked on it. A worker
compares the counter with the value its iteration began at (sent with ``START``), so an interruption sent
right after ``START`` is never missed. Between iterations only the training process touches the semaphore:
it empties it before each ``START`` of the credits left from the last iteration.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["Credits"]


class Credits:
    """One worker's credits and interruption counter, made by the loader's ``multiprocessing`` context and
    handed to the worker when it starts (as a ``Process`` argument: semaphores travel no other way)."""

    def __init__(self, context: Any) -> None:
        self._semaphore = context.Semaphore(0)
        self._interruptions = context.RawValue(ctypes.c_uint64, 0)

    # -- the training process ----------------------------------------------------------------------

    def reset(self, count: int) -> int:
        """Leave exactly ``count`` credits (the worker is between iterations); the interruption count that the
        iteration about to begin starts from."""
        while self._semaphore.acquire(False):
            pass
        for _ in range(count):
            self._semaphore.release()
        return int(self._interruptions.value)

    def grant(self) -> None:
        """One more batch may be sent."""
        self._semaphore.release()

    def interrupt(self) -> None:
        """Tell the worker to read its pipe (call before sending ``STOP`` or ``EXIT``),
        waking it if it waits."""
        self._interruptions.value += 1
        self._semaphore.release()

    # -- the worker --------------------------------------------------------------------------------

    def take(self, timeout: float) -> bool:
        """Take a credit, waiting at most ``timeout`` seconds; whether one was taken."""
        return bool(self._semaphore.acquire(True, timeout))

    def interrupted(self, since: int) -> bool:
        """Whether the training process has interrupted since its count was ``since``."""
        return int(self._interruptions.value) != since
