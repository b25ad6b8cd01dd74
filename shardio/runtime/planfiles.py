"""Plan files: an epoch's plan, computed once per node and read by every process of the node that needs it.

Planning an epoch is O(N) (the plan is global: every rank's batches come out of one ordering of every shard
window), and every process that iterates needs its rank's share: the training process of each rank (with a
world size above 1, or once its DataLoader workers have begun) and each DataLoader worker that begins an epoch
the training process did not plan for it. :func:`obtain` gives a process its rank's share: read from the
node plan under :func:`~shardio.storage.files.cache_dir` ``/plans/`` when it is there; else the process
takes the plan's lock (:class:`~shardio.storage.locks.FileLock`), looks again, plans the whole epoch,
writes every rank's share (:mod:`shardio.runtime.nodeplan`) and releases the lock, while the node's other
processes that need the plan (any rank's) wait for it (at most :data:`WAIT_S`) and read their part. So the
ranks of a node plan an epoch once.

Names: ``{job}-e{epoch:06d}-{digest}`` (:func:`name`). ``job`` is a short digest of what stays the same
through a job (the index's content id, seed, options, world size, a state's ``extra``, shardio's version and
source); ``digest`` covers everything that shapes the plan (those, the epoch and its history of world-size
changes), never the rank. The content is a function of the name, so a file is never rewritten: written under a
temporary name, renamed into place, checked when read (:func:`~shardio.runtime.nodeplan.read`: owner, mode,
sizes, digests bound to the name, values). Anything that fails around the files or the lock (another node's
cache, a full disk, a read-only cache directory, no ``flock``, a holder past the deadline) only means the
process plans by itself; a damaged plan of this user's is planned again and replaced by the process that takes
its lock. A ``plans`` directory this process cannot trust (a link, another user's, writable by others) is
neither read nor written: one warning names it, and each process plans each epoch in memory.

Clean-up: the process that writes epoch ``E``'s plan removes its job's plans of epochs ``E - 2`` and before
(the ranks of a job are within an epoch of each other; a process that still needed one plans it again:
slower, never wrong), so a job keeps about two epochs' plans on a node. Any entry left for a day (a killed
job's, or a job's that changed its world size or ``extra``) goes when a plan is written (each process looks
for such entries at most every :data:`PRUNE_EVERY_S`: a listing of the directory with a ``stat`` of each entry
costs ~1 ms an epoch on a busy node), or by ``shardio cache --prune``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import OutputError
from ..planning.plan import EpochPlan
from ..planning.rankplan import RankPlan, rank_plan
from ..storage.files import cache_dir
from ..storage.locks import FileLock
from ..version import __version__
from . import nodeplan

__all__ = ["name", "save", "load", "obtain", "path", "clean", "prune", "STALE_S", "WAIT_S"]

logger = logging.getLogger(__name__)

STALE_S = 86400.0
"""A plan directory or lock file older than this (a killed job's) is removed when a process writes a plan."""
WAIT_S = 600.0
"""Seconds a process waits for another one of the node to plan what it needs, before planning it itself."""
PRUNE_EVERY_S = 600.0
"""A process that writes plans looks for stale entries at most this often."""

_NAME = re.compile(r"^([0-9a-f]+)-e([0-9]+)-[0-9a-f]+$")
_lock_warned = False  # once per process (and its forks): the cache directory stays as it is
_pruned_at: float | None = None  # when this process last looked for stale entries (time.monotonic)


def _directory() -> str:
    return os.path.join(cache_dir(), "plans")


def path(name: str) -> str:
    """Where plan ``name``'s files are (or would be)."""
    return os.path.join(_directory(), name)


def _hash(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def _code() -> str:
    """A digest of shardio's own source: plans made by other code (a development checkout between two
    versions) are never taken for this code's."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def name(job: Mapping[str, Any], epoch: int, history: Any) -> str:
    """The name of epoch ``epoch``'s plan (after world-size changes ``history``) in job ``job`` (JSON-ready:
    everything that shapes the plan and stays the same through a job, never the rank)."""
    constant = {**job, "shardio": __version__, "code": _code(), "format": 3}
    plan = _hash({**constant, "epoch": epoch, "history": history})
    return f"{_hash(constant)[:12]}-e{epoch:06d}-{plan[:32]}"


def save(name: str, plan: EpochPlan, samples: int) -> str | None:
    """Write every rank's share of ``plan`` (ids below ``samples``) as plan ``name`` (unless it is there); its
    path, or None when it cannot be written. Removes the job's plans of two epochs before and older."""
    directory = _directory()
    target = os.path.join(directory, name)
    if os.path.isdir(target):
        return target
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)  # never writable by others, whatever the umask
        if nodeplan.distrust(directory) is not None:
            return None  # load() warned
        _prune_now_and_then()
        clean(name)
        temporary = tempfile.mkdtemp(prefix=".tmp-", dir=directory)
        try:
            nodeplan.write(temporary, plan, samples, name)
            os.replace(temporary, target)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    except OSError as exc:
        if os.path.isdir(target):  # another process of the node renamed the same plan into place first
            return target
        logger.warning(
            "cannot write the epoch's plan for the node's other processes under %s (%s): each "
            "process plans the epoch by itself",
            directory,
            exc,
        )
        return None
    return target


def load(name: str, rank: int, samples: int) -> RankPlan | None:
    """Rank ``rank``'s share of plan ``name``, read into private memory, if it is there, trusted and
    consistent (ids below ``samples``); else None."""
    return nodeplan.read(path(name), rank, samples)


def obtain(name: str, rank: int, samples: int, make: Callable[[], EpochPlan]) -> RankPlan:
    """Rank ``rank``'s share of plan ``name``: read from its files, else ``make()`` (the whole epoch's plan)
    once on the node under its lock, written for every rank of the node, and this rank's part of it. In a
    plans directory that cannot be trusted, ``make()`` here, and nothing is written."""
    global _lock_warned
    found = load(name, rank, samples)
    if found is not None:
        return found
    lock = FileLock(path(name) + ".lock", what="another process planning the epoch", level=logging.WARNING)
    try:
        os.makedirs(_directory(), mode=0o755, exist_ok=True)  # never writable by others, whatever the umask
        if nodeplan.distrust(_directory()) is not None:  # load() warned
            return rank_plan(make(), rank)
        held = lock.acquire(WAIT_S)
    except (OSError, OutputError) as exc:  # OutputError: a FIFO, device or folder where the lock file goes
        logger.log(
            logging.DEBUG if _lock_warned else logging.WARNING,
            "cannot take the lock of the node's plan under %s (%s): this process plans each epoch by itself",
            _directory(),
            exc,
        )
        _lock_warned = True
        return rank_plan(make(), rank)
    if not held:
        logger.warning(
            "waited %.0f s for another process to plan the epoch (%s): planning it here", WAIT_S, name
        )
        return rank_plan(make(), rank)
    try:
        found = load(name, rank, samples)
        if found is not None:
            return found
        if not lock.waited:
            if os.path.isdir(path(name)):  # there but damaged (load said so): replaced, for the node's others
                _remove_where(lambda entry: entry.name == name)
            plan = make()
            found = load(name, rank, samples) if save(name, plan, samples) is not None else None
            return found if found is not None else rank_plan(plan, rank)
    finally:
        lock.release()
    # the holder we waited for wrote no file (a full disk, or it died): plan alongside the others, not in turn
    return rank_plan(make(), rank)


def clean(name: str) -> int:
    """Remove the plans of plan ``name``'s job from two epochs before it and older; how many went."""
    match = _NAME.match(name)
    if match is None:
        return 0
    job, epoch = match.group(1), int(match.group(2))
    prefix = job + "-e"

    def earlier(entry: os.DirEntry[str]) -> bool:
        if not entry.name.startswith(prefix):  # another job's (most entries of a shared cache): no pattern
            return False
        other = _NAME.match(entry.name)
        return other is not None and other.group(1) == job and int(other.group(2)) <= epoch - 2

    return _remove_where(earlier)  # a process that read a removed plan keeps its copy


def prune(older_than: float = STALE_S) -> int:
    """Remove plan directories, lock files and temporary directories untouched for ``older_than`` seconds;
    how many went. Safe while loaders run: a process that finds no plan file plans the epoch again."""
    now = time.time()
    return _remove_where(lambda entry: now - entry.stat(follow_symlinks=False).st_mtime > older_than)


def _prune_now_and_then() -> None:
    """:func:`prune`, unless this process did within :data:`PRUNE_EVERY_S`."""
    global _pruned_at
    now = time.monotonic()
    if _pruned_at is None or now - _pruned_at >= PRUNE_EVERY_S:
        prune()
        _pruned_at = now


_TEMPORARY = re.compile(r"^\.tmp-[A-Za-z0-9_]{8}$")  # tempfile.mkdtemp(prefix=".tmp-")'s names
_PLAN_FILES = frozenset({"ids.npy", "starts.npy", "offsets.npy", "repeats.npy", "digests"})


def _ours(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is of a kind and name this module writes, and this user's: a plan or temporary
    directory, or a plan's lock file (never a link). Anything else in ``plans/`` is someone else's."""
    info = entry.stat(follow_symlinks=False)
    if info.st_uid != os.getuid():
        return False
    if stat.S_ISDIR(info.st_mode):
        return bool(_NAME.match(entry.name) or _TEMPORARY.match(entry.name))
    lock = entry.name.removesuffix(".lock")
    return stat.S_ISREG(info.st_mode) and lock != entry.name and bool(_NAME.match(lock))


def _remove_where(chosen: Callable[[os.DirEntry[str]], bool]) -> int:
    """Remove the entries of the plans directory that ``chosen`` picks and this module wrote (a directory:
    the plan files in it, then it, if nothing else is left in it); how many went. A file it did not write is
    never removed."""
    try:
        entries = list(os.scandir(_directory()))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        try:
            if not (_ours(entry) and chosen(entry)):
                continue
            if entry.is_dir(follow_symlinks=False):
                for inner in os.scandir(entry.path):
                    if inner.name in _PLAN_FILES and inner.is_file(follow_symlinks=False):
                        os.unlink(inner.path)
                os.rmdir(entry.path)  # fails where something else was put in it: it stays
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:  # gone already (another process of the node), or not ours to remove
            pass
    return removed
