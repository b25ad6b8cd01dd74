"""Plan files: a rank's plan of a later epoch, from the training process to its persistent DataLoader workers.

A persistent worker keeps the dataset it was started with: the share of the plan it received then
(:mod:`shardio.workers.sharing`) is for that epoch only. When the training process plans another epoch (``set_epoch``,
``load_state_dict``) while such workers exist, it writes its share under :func:`~shardio.reading.storage.cache_dir`
``/plans/`` in a directory named by a digest of everything that shapes the plan (index fingerprint, seed,
options, epoch, history, world, rank, extra, shardio version); each worker maps those files read-only (one copy
in the page cache for the rank) instead of planning the whole epoch itself. The content is a function of the
name, so a file is never rewritten and no lock is needed: written under a temporary name, renamed into place.
A missing or unreadable file (another node's cache, a full disk) only means the worker plans by itself.
The training process removes the share it wrote before once it writes the next one, and any share left
for a day (by a job that was killed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from ..planning.rankplan import RankPlan
from ..reading.storage import cache_dir

__all__ = ["digest", "save", "load", "publish", "STALE_S"]

logger = logging.getLogger(__name__)

STALE_S = 86400.0
"""A plan directory older than this (a killed job's) is removed when a training process writes one."""

_ARRAYS = ("ids", "offsets", "repeats")


def _directory() -> str:
    return os.path.join(cache_dir(), "plans")


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
        _prune(directory)
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
        logger.warning("cannot write the rank's plan for persistent DataLoader workers under %s (%s): each worker "
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


def publish(name: str, plan: RankPlan, previous: str | None) -> str | None:
    """:func:`save` ``plan`` as ``name``, then remove ``previous`` (the one this process wrote before, which
    workers that still map it keep); the new path, or None."""
    path = save(name, plan)
    if previous is not None and previous != path:
        shutil.rmtree(previous, ignore_errors=True)
    return path


def _prune(directory: str) -> None:
    now = time.time()
    for entry in os.scandir(directory):
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            pass
