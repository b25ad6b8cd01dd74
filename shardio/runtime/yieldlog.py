"""The yield log: with ``SHARDIO_YIELD_LOG=DIR`` set, each process appends what its shardio loader yielded.

It records, it never decides: nothing reads it back while training; ``shardio check-resume`` compares the logs
of two runs afterwards. (It is not the *data ledger* of ``shardio trace``/``quarantine``/``remix``, which
answers questions about a dataset's plan; this one is a record of one run.)

Where a batch is recorded is where it reaches the training loop: a :class:`~shardio.ShardLoader`'s training
process (its workers record nothing), a dataset iterated in the training process (``num_workers=0``), and,
under a torch ``DataLoader`` with workers (whose hand-over shardio cannot see), the worker that made it: its
records carry the iteration, and the reader puts each iteration's batches in plan order, the order an
in-order DataLoader hands them over. A batch made ahead and never trained on (a worker's prefetch at a kill)
is recorded there too; a check cuts a killed run's records at the state its restart loaded, so it never
counts.

Each process writes a file of its own (``{time_ns}-{pid}.jsonl`` in ``DIR``, opened exclusive and append-only)
of one JSON object per line, each written whole in one ``write`` (no buffer to lose to a SIGKILL; a torn last
line, from a machine that stopped, is ignored on reading). A record: ``kind`` (``"batch"``, or ``"load"`` when
a state was loaded), the dataset (``src``: its index fingerprint and seed, digested), ``rank``, ``world``,
``epoch``; a batch adds its epoch ``step``, ``position`` (the state's position after it), ``worker`` (``null``
in the training process), ``iteration``, ``size``, ``digest`` (of its keys), ``trainer`` (``"lightning"`` once
Lightning is imported, for the report's page), and with ``SHARDIO_YIELD_LOG_KEYS=1`` its ``keys`` and those
not planned repeats (``fresh``); a load adds the state's ``position``, its ``from_world`` and whether it came
``after_iter`` (once an iteration had begun).
Unset, each batch costs one environment lookup.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, shown

__all__ = [
    "ENV",
    "KEYS_ENV",
    "LoadRecord",
    "BatchRecord",
    "keys_digest",
    "read_log",
    "recorder",
    "silence",
    "YieldLog",
]

logger = logging.getLogger(__name__)

ENV = "SHARDIO_YIELD_LOG"
"""The environment variable naming the directory the yield log is written to (unset: no log)."""

KEYS_ENV = "SHARDIO_YIELD_LOG_KEYS"
"""Set to ``1``: batch records carry their keys too (for an exactly-once check across world sizes)."""

MAX_LINE = 4 << 20
"""The longest record read back (a batch of many long keys stays far below it)."""

MAX_BYTES = 1 << 30
"""The most bytes read back from one run's log directory."""

MAX_FILES = 10_000
"""The most files read back from one run's log directory."""

_silenced: int | None = None  # the pid of a process that records nothing (a ShardLoader worker)


def silence() -> None:
    """Record nothing in this process (a :class:`~shardio.ShardLoader` worker: its training process records
    the batches it hands over)."""
    global _silenced
    _silenced = os.getpid()


def recorder() -> YieldLog | None:
    """This process's yield log, or ``None`` when ``SHARDIO_YIELD_LOG`` is unset (or this process is
    silenced).

    Returns:
        The log to record to, opened on its first record.
    """
    directory = os.environ.get(ENV)
    if not directory or _silenced == os.getpid():
        return None
    global _log
    if _log is None or _log.pid != os.getpid() or _log.directory != directory:
        _log = YieldLog(directory)
    return _log


def keys_digest(keys: Sequence[str]) -> str:
    """The digest of a batch's keys, in order (16 hex digits)."""
    return hashlib.blake2b("\n".join(keys).encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class YieldLog:
    """One process's file of records (see the module docs); a write that fails warns once and ends it."""

    def __init__(self, directory: str) -> None:
        self.directory, self.pid = directory, os.getpid()
        self._fd: int | None = None
        self._failed = False
        self._sources: dict[tuple[str, int], str] = {}
        self._prefixes: dict[tuple[str, int, int, int | None, str], str] = {}
        self.keys = os.environ.get(KEYS_ENV) == "1"

    def source(self, fingerprint: str, seed: int) -> str:
        """The short name of a dataset (its index fingerprint and seed) in records."""
        found = self._sources.get((fingerprint, seed))
        if found is None:
            named = f"{fingerprint}:{seed}".encode()
            found = self._sources[(fingerprint, seed)] = hashlib.blake2b(named, digest_size=6).hexdigest()
        return found

    def batch(
        self, batch: dict[str, Any], *, src: str, rank: int, world: int, worker: int | None, it: str
    ) -> None:
        """Record a batch yielded (its ``epoch``, ``batch_index`` and ``keys`` fields say which)."""
        keys = batch.get("keys")
        keys = [keys] if isinstance(keys, str) else list(keys) if keys is not None else []
        step = int(batch["batch_index"])
        prefix = self._prefixes.get((src, rank, world, worker, it))
        if (
            prefix is None
        ):  # the fields an iteration's records share, written once (a batch costs ~20 us less)
            if len(self._prefixes) > 64:
                self._prefixes.clear()
            shared = dict(kind="batch", src=src, rank=rank, world=world, worker=worker, iteration=it)
            shared["trainer"] = "lightning" if _LIGHTNING & sys.modules.keys() else None
            prefix = self._prefixes[(src, rank, world, worker, it)] = json.dumps(
                shared, separators=(",", ":")
            )[:-1]
        line = (
            f'{prefix},"epoch":{int(batch["epoch"])},"step":{step},"position":{step + 1},"size":{len(keys)},'
            f'"digest":"{keys_digest(keys)}","t":{time.time_ns()}'
        )
        if self.keys:
            repeat = batch.get("repeat")
            tolist = getattr(repeat, "tolist", None)
            flags = tolist() if tolist is not None else [bool(repeat)] * len(keys)
            if not isinstance(flags, list) or len(flags) != len(keys):
                flags = [False] * len(keys)
            fresh = [key for key, again in zip(keys, flags) if not again]
            line += f',"keys":{json.dumps(keys)},"fresh":{json.dumps(fresh)}'
        self._append((line + "}\n").encode())

    def loaded(
        self, *, src: str, rank: int, world: int, epoch: int, position: int, from_world: int, after_iter: bool
    ) -> None:
        """Record that a state was loaded: the ``epoch`` and ``position`` it continues from."""
        record = dict(kind="load", src=src, rank=rank, world=world, epoch=epoch, position=position)
        self._write({**record, "from_world": from_world, "after_iter": after_iter, "t": time.time_ns()})

    def _write(self, record: dict[str, Any]) -> None:
        self._append((json.dumps(record, separators=(",", ":"), ensure_ascii=True) + "\n").encode())

    def _append(self, line: bytes) -> None:
        if self._failed:
            return
        try:
            if self._fd is None:
                os.makedirs(self.directory, exist_ok=True)
                name = os.path.join(self.directory, f"{time.time_ns()}-{self.pid}.jsonl")
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
                self._fd = os.open(name, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
            os.write(self._fd, line)
        except OSError as exc:
            self._failed = True
            logger.warning("the yield log in %s cannot be written (%s): no more records", self.directory, exc)


_log: YieldLog | None = None
_LIGHTNING = {"lightning.pytorch", "pytorch_lightning"}


@dataclass(frozen=True)
class BatchRecord:
    """A batch a run yielded (see the module docs for each field)."""

    src: str
    rank: int
    world: int
    epoch: int
    step: int
    worker: int | None
    iteration: str
    size: int
    digest: str
    t: int
    keys: tuple[str, ...] | None = None
    fresh: tuple[str, ...] | None = None
    trainer: str | None = None


@dataclass(frozen=True)
class LoadRecord:
    """A state a run loaded: the epoch and position it continues from."""

    src: str
    rank: int
    world: int
    epoch: int
    position: int
    from_world: int
    after_iter: bool
    t: int


_BIG = 1 << 62
_INTS = {"rank": (0, 1 << 20), "world": (1, 1 << 20), "epoch": (0, _BIG), "step": (0, _BIG), "t": (0, _BIG)}
_INTS |= {"size": (0, _BIG), "position": (0, _BIG), "from_world": (1, 1 << 20)}


def _field(record: dict[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    if kind is int:
        low, high = _INTS[name]
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"field {name}: {shown(value)}")
    elif kind is str:
        if type(value) is not str or not 0 < len(value) <= 64:
            raise ValueError(f"field {name}: {shown(value)}")
    elif type(value) is not kind:
        raise ValueError(f"field {name}: {shown(value)}")
    return value


def _strings(value: Any, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if type(value) is not list or not all(type(k) is str for k in value):
        raise ValueError(f"field {name}: not a list of keys")
    return tuple(value)


def _record(record: Any) -> BatchRecord | LoadRecord:
    if type(record) is not dict:
        raise ValueError("not a JSON object")
    common = {n: _field(record, n, int) for n in ("rank", "world", "epoch", "t")}
    src = _field(record, "src", str)
    if record.get("kind") == "load":
        load = {n: _field(record, n, int) for n in ("position", "from_world")}
        return LoadRecord(src=src, **common, **load, after_iter=_field(record, "after_iter", bool))
    if record.get("kind") != "batch":
        raise ValueError(f"kind {shown(record.get('kind'))}")
    worker = record.get("worker")
    if worker is not None and (type(worker) is not int or not 0 <= worker < 1 << 20):
        raise ValueError(f"field worker: {shown(worker)}")
    if record.get("trainer") not in (None, "lightning"):
        raise ValueError(f"field trainer: {shown(record.get('trainer'))}")
    return BatchRecord(
        src=src,
        **common,
        step=_field(record, "step", int),
        worker=worker,
        iteration=_field(record, "iteration", str),
        size=_field(record, "size", int),
        digest=_field(record, "digest", str),
        keys=_strings(record.get("keys"), "keys"),
        fresh=_strings(record.get("fresh"), "fresh"),
        trainer=record.get("trainer"),
    )


def read_log(directory: str) -> list[BatchRecord | LoadRecord]:
    """Every record of one run's log directory, file by file, each file in its order.

    The directory and its files are data a job wrote: a symlink, or anything but a regular file, is refused,
    reads are bounded (:data:`MAX_LINE`, :data:`MAX_BYTES`, :data:`MAX_FILES`), and a file's last line
    without its newline (torn by a kill) is ignored.

    Args:
        directory: The run's log directory (``SHARDIO_YIELD_LOG`` of the run).

    Returns:
        The records (an empty list when the directory does not exist: nothing was yielded).

    Raises:
        FormatError: A symlink or special file, a record that is not one, or logs beyond the bounds.
    """
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        raise FormatError(f"the yield log {shown(directory)} is not a directory (a symlink is refused)")
    names = sorted(entry for entry in os.listdir(directory) if entry.endswith(".jsonl"))
    if len(names) > MAX_FILES:
        raise FormatError(f"the yield log {shown(directory)} has {len(names)} files, more than {MAX_FILES}")
    records: list[BatchRecord | LoadRecord] = []
    budget = MAX_BYTES
    for name in names:
        path = os.path.join(directory, name)
        for number, line in _lines(path, budget):
            budget -= len(line)
            try:
                records.append(_record(json.loads(line)))
            except (ValueError, RecursionError) as exc:
                raise FormatError(f"{shown(path)} line {number}: not a yield-log record ({exc})") from None
    return records


def _lines(path: str, budget: int) -> Iterator[tuple[int, bytes]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise FormatError(f"{shown(path)} cannot be opened as a yield log ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(f"{shown(path)} is not a regular file")
        number = 0
        while True:
            line = file.readline(MAX_LINE + 1)
            number += 1
            if not line:
                return
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:
                    raise FormatError(f"{shown(path)} line {number} is longer than {MAX_LINE} bytes")
                return  # a torn last line
            budget -= len(line)
            if budget < 0:
                raise FormatError(f"the yield log holds more than {MAX_BYTES} bytes")
            yield number, line
