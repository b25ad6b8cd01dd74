"""Plan files: a rank's plan of an epoch, planned by one process of the rank and mapped by its other workers.

A DataLoader worker holds the share of the plan it inherited or received (:mod:`shardio.workers.sharing`) for
that epoch only. When a later epoch begins without the training process planning it first (a persistent worker
after ``set_epoch``; any worker when epochs advance without ``set_epoch``), the worker needs the whole epoch's
plan, O(N) to compute. Instead, :func:`obtain` maps the rank's share from a file under
:func:`~shardio.reading.storage.cache_dir` ``/plans/``, in a directory named by a digest of everything that
shapes the plan (index fingerprint, seed, options, epoch, history, world, rank, extra, shardio version): one
copy in the page cache for the rank. The first process that finds no file takes the plan's lock
(:class:`~shardio.workers.planlock.PlanLock`), plans, writes the file and releases the lock; the others wait
for it (at most :data:`WAIT_S`) and map the file. The training process writes the file when it plans an epoch
while workers exist (``set_epoch``, ``load_state_dict``), so persistent workers find it.

The content is a function of the name, so a file is never rewritten: written under a temporary name, renamed
into place, checked when mapped. Anything that fails around the files or the lock (another node's cache, a
full disk, a read-only cache directory, no ``flock``, a holder past the deadline) only means the process plans
by itself. A process removes the share it wrote before once it writes the next one, and any entry left for a
day (by a job that was killed) goes when a share is written or by ``shardio cache --prune``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..planning.rankplan import RankPlan
from ..reading.storage import cache_dir
from .planlock import PlanLock

__all__ = ["digest", "save", "load", "obtain", "path", "remove", "prune", "STALE_S", "WAIT_S"]

logger = logging.getLogger(__name__)

STALE_S = 86400.0
"""A plan directory or lock file older than this (a killed job's) is removed when a process writes a plan."""
WAIT_S = 600.0
"""Seconds a process waits for another one of the node to plan what it needs, before planning it itself."""

_ARRAYS = ("ids", "offsets", "repeats")
_lock_warned = False  # once per process (and its forks): the cache directory stays as it is


def _directory() -> str:
    return os.path.join(cache_dir(), "plans")


def path(name: str) -> str:
    """Where plan ``name``'s files are (or would be)."""
    return os.path.join(_directory(), name)


def digest(**key: Any) -> str:
    """The name of the plan that ``key`` (JSON-ready: everything that shapes a rank's plan) determines."""
    from .. import __version__

    text = json.dumps({**key, "shardio": __version__, "format": 1}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def save(name: str, plan: RankPlan) -> str | None:
    """Write ``plan`` as plan ``name`` (unless it is there); its path, or None when it cannot be written."""
    directory = _directory()
    path = os.path.join(directory, name)
    if os.path.isdir(path):
        return path
    try:
        os.makedirs(directory, exist_ok=True)
        prune()
        temporary = tempfile.mkdtemp(prefix=".tmp-", dir=directory)
        try:
            for array_name, array in zip(_ARRAYS, (plan.ids, plan.offsets, plan.repeats)):
                if array is not None:
                    np.save(os.path.join(temporary, array_name + ".npy"), array)
            os.replace(temporary, path)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    except OSError as exc:
        if os.path.isdir(path):  # another process of the node renamed the same plan into place first
            return path
        logger.warning("cannot write the rank's plan for its other processes under %s (%s): each worker "
                       "plans the epoch by itself", directory, exc)
        return None
    return path


def load(name: str, rank: int, samples: int) -> RankPlan | None:
    """Plan ``name`` mapped read-only, if it is there and consistent (ids below ``samples``); else None."""
    path = os.path.join(_directory(), name)
    try:
        ids, offsets = (np.load(os.path.join(path, n + ".npy"), mmap_mode="r") for n in _ARRAYS[:2])
        repeats_path = os.path.join(path, "repeats.npy")
        repeats = np.load(repeats_path, mmap_mode="r") if os.path.exists(repeats_path) else None
    except (OSError, ValueError, EOFError):
        return None
    consistent = (ids.ndim == offsets.ndim == 1 and ids.dtype.kind == "i" and offsets.dtype == np.int64
                  and offsets.shape[0] >= 1 and offsets[0] == 0 and offsets[-1] == ids.shape[0]
                  and bool(np.all(offsets[1:] >= offsets[:-1]))
                  and (ids.shape[0] == 0 or 0 <= int(ids.min()) and int(ids.max()) < samples)
                  and (repeats is None or (repeats.dtype == np.bool_ and repeats.shape == ids.shape)))
    if not consistent:
        logger.warning("the plan files under %s are inconsistent: planning the epoch here instead", path)
        return None
    return RankPlan(rank, ids, offsets, repeats)


def obtain(name: str, rank: int, samples: int, make: Callable[[], RankPlan]) -> tuple[RankPlan, str | None]:
    """Plan ``name`` mapped from its file, else ``make()`` once on the node under its lock and written for
    the others; the plan, and the path of the file this process wrote (None when it wrote none)."""
    global _lock_warned
    found = load(name, rank, samples)
    if found is not None:
        return found, None
    lock = PlanLock(os.path.join(_directory(), name + ".lock"))
    try:
        os.makedirs(_directory(), exist_ok=True)
        held = lock.acquire(WAIT_S)
    except OSError as exc:
        logger.log(logging.DEBUG if _lock_warned else logging.WARNING, "cannot take the lock of the rank's "
                   "plan under %s (%s): this process plans each epoch by itself", _directory(), exc)
        _lock_warned = True
        return make(), None
    if not held:
        logger.warning("waited %.0f s for another process to plan the rank's epoch (%s): planning it here",
                       WAIT_S, name)
        return make(), None
    try:
        found = load(name, rank, samples)
        if found is not None:
            return found, None
        if not lock.waited:
            plan = make()
            return plan, save(name, plan)
    finally:
        lock.release()
    # the holder we waited for wrote no file (a full disk, or it died): plan alongside the others, not in turn
    return make(), None


def remove(path: str | None) -> None:
    """Remove the plan directory ``path`` (None: nothing); processes that map its files keep them."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def prune(older_than: float = STALE_S) -> int:
    """Remove plan directories, lock files and temporary directories untouched for ``older_than`` seconds;
    how many went. Safe while loaders run: a process that finds no plan file plans the epoch again."""
    now = time.time()
    removed = 0
    try:
        entries = list(os.scandir(_directory()))
    except OSError:
        return 0
    for entry in entries:
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > older_than:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
        except OSError:
            pass
    return removed
