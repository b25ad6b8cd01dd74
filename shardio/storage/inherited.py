"""Inherited filesystems: the fsspec filesystems a forked process got from its parent, kept and never closed.

fsspec's async filesystems (HTTP, S3, GCS) close their client session from a ``weakref.finalize`` that runs
the close on the event loop they were made on, waiting for it in 1 s polls. In a forked child (a DataLoader
worker) that loop has no thread, so finalizing a filesystem inherited from the parent blocks for a whole
second before fsspec gives up. Those filesystems are reference cycles that fsspec's instance cache drops in a
new process: the cyclic collector finalizes them later, in whatever thread it happens to run, often fsspec's
own event-loop thread, which stalls every request of the worker for that second (measured: a 2-worker epoch
of read-ahead over HTTP waited ~1 s per worker before its first batch). So every filesystem :func:`remember`
saw is held, strongly, in a child after a fork: its session is the parent's (its sockets too), so the child
never uses it, never closes it, and the objects cost only their memory, once per fork.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["remember"]

_made: weakref.WeakSet[Any] = weakref.WeakSet()
_inherited: list[Any] = []


def remember(fs: Any) -> None:
    """Note a filesystem made in this process, so a process forked from it keeps it (see the module doc)."""
    try:
        _made.add(fs)
    except TypeError:  # not weakly referenceable: not one of fsspec's finalized filesystems
        pass


def _keep_inherited() -> None:
    _inherited.extend(_made)
    _made.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keep_inherited)
