"""Node plan: an epoch's plan as every rank's share, in one directory that every process of a node reads.

The files (``numpy`` ``.npy`` with the 128-byte header :func:`write` gives them), ranks one after the other:

- ``ids.npy``: every rank's sample ids, rank 0's batches first, then rank 1's, ... (``int32`` where the
  dataset's ids fit, else ``int64``);
- ``starts.npy``: ``world + 1`` ``int64`` positions in ``ids``: rank ``r``'s ids are
  ``ids[starts[r]:starts[r + 1]]``;
- ``offsets.npy``: ``world x (batches + 1)`` ``int64``; row ``r`` is rank ``r``'s batch offsets (as
  :class:`~shardio.planning.rankplan.RankPlan`'s, relative to ``starts[r]``);
- ``repeats.npy``, only when some sample is a planned repeat: a ``bool`` per id, like ``ids``;
- ``digests``: ``world + 1`` SHA-256 digests: of the plan's name (which covers the job's parameters, the epoch
  and its history), the dataset's size, ``starts`` and the shape of ``offsets``; then, per rank, of the name,
  the rank, its offsets, its ids and (where any is set) its repeat flags.

:func:`write` streams the ranks' shares into the files one at a time, so it never holds more than the whole
plan (which the planner made) and one rank's share. A node's cache is often shared scratch space: :func:`read`
takes the files as untrusted input. It opens the ``plans`` directory, the plan's directory and each file
without following a link (files with ``O_NONBLOCK``: a FIFO never blocks it), refuses any not owned by this
user, writable by others, or not a regular file (or directory), checks each header and that each file's size
is what its header says, reads this rank's part into private memory (a file truncated later cannot SIGBUS
it), checks the digests and the values (ids within the dataset, offsets from 0 up to the rank's count). Any
doubt means None, and one warning naming the file: the caller plans the epoch in memory.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..planning.plan import EpochPlan
from ..planning.rankplan import RankPlan, rank_plan
from ..planning.repeats import Repeats
from ..storage.privatedir import untrusted

__all__ = ["MappedRankPlan", "distrust", "ids_dtype", "read", "write"]

logger = logging.getLogger(__name__)

_DIGEST = 32
_HEADER_SIZE = 128
_FILE_MODE = 0o644
_warned: set[str] = set()  # directories this process (and its forks) warned about


class _Doubt(Exception):
    """A plan file this process does not use: why (its path is in the message)."""


@dataclass(frozen=True)
class MappedRankPlan(RankPlan):
    """A rank's share read from the node plan in ``directory``: it pickles as that reference, not as its
    arrays, so a spawn or forkserver DataLoader worker reads the same files (nothing in shared memory).
    Unpickled where the files are gone or doubtful, it becomes None: the receiver plans again."""

    directory: str = ""
    samples: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return read, (self.directory, self.rank, self.samples)


def ids_dtype(samples: int) -> np.dtype:
    """The dtype of the ids of a dataset of ``samples`` samples: ``int32`` where every id fits."""
    return np.dtype(np.int32 if samples <= np.iinfo(np.int32).max else np.int64)


def _header(file: BinaryIO, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    np.lib.format.write_array_header_1_0(
        file, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )


def _create(directory: str, name: str) -> BinaryIO:
    """A new file ``name`` in ``directory``, writable by this user only (whatever the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    return os.fdopen(os.open(os.path.join(directory, name), flags, _FILE_MODE), "wb")


def _plan_digest(
    name: str, samples: int, starts: np.ndarray, offsets_shape: tuple[int, ...], dtype: np.dtype
) -> bytes:
    digest = hashlib.sha256(f"{name}\0{samples}\0{offsets_shape}\0{dtype.str}\0".encode())
    digest.update(np.ascontiguousarray(starts, "<i8").data)
    return digest.digest()


def _rank_digest(
    name: str, rank: int, offsets: np.ndarray, ids: np.ndarray, repeats: np.ndarray | None
) -> bytes:
    digest = hashlib.sha256(f"{name}\0{rank}\0".encode())
    digest.update(np.ascontiguousarray(offsets, "<i8").data)
    digest.update(np.ascontiguousarray(ids).data)
    if repeats is not None and repeats.any():
        digest.update(np.ascontiguousarray(repeats, np.bool_).data)
    return digest.digest()


def write(directory: str, plan: EpochPlan, samples: int, name: str) -> None:
    """Write every rank's share of ``plan`` (ids below ``samples``) as plan ``name`` into the empty
    ``directory`` (files readable by others, writable by this user only)."""
    world, batches = plan.world_size, plan.num_batches
    sizes = np.diff(plan.offsets)
    starts = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(sizes[plan.rank_batches].sum(axis=1, dtype=np.int64), out=starts[1:])
    offsets = np.zeros((world, batches + 1), dtype=np.int64)
    dtype = ids_dtype(samples)
    digests = [_plan_digest(name, samples, starts, offsets.shape, dtype)]
    repeats = Repeats(plan)  # once for every rank: it is O(N)
    flags_file: BinaryIO | None = None
    try:
        with _create(directory, "ids.npy") as ids_file:
            _header(ids_file, dtype, (int(starts[-1]),))
            for rank in range(world):
                share = rank_plan(plan, rank, repeats)
                ids = share.ids.astype(dtype, copy=False)
                ids.tofile(ids_file)
                offsets[rank] = share.offsets
                digests.append(_rank_digest(name, rank, share.offsets, ids, share.repeats))
                if share.repeats is not None and flags_file is None:
                    flags_file = _create(directory, "repeats.npy")
                    _header(flags_file, np.dtype(np.bool_), (int(starts[-1]),))
                    np.zeros(int(starts[rank]), dtype=np.bool_).tofile(flags_file)  # the ranks before: none
                if flags_file is not None:
                    none = np.zeros(share.ids.shape[0], np.bool_)
                    flags = share.repeats if share.repeats is not None else none
                    flags.tofile(flags_file)
                del share, ids
    finally:
        if flags_file is not None:
            flags_file.close()
    for file_name, array in (("starts.npy", starts), ("offsets.npy", offsets)):
        with _create(directory, file_name) as file:
            np.save(file, array)
    with _create(directory, "digests") as file:
        file.write(b"".join(digests))


def distrust(directory: str) -> str | None:
    """Why directory ``directory`` cannot hold plans this process reads or writes (a link, not a directory,
    another user's, writable by others), or None when it can or is not there."""
    try:
        os.close(_open(directory, None, directory, True))
    except FileNotFoundError:
        return None
    except (_Doubt, OSError) as exc:
        return str(exc)
    return None


def _open(path: str, dir_fd: int | None, shown: str, directory: bool = False) -> int:
    """``path`` (relative to ``dir_fd``; ``shown`` in messages) opened read-only without following a link or
    blocking, once it is what a plan is made of."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _Doubt(f"{shown}: cannot be opened ({exc.strerror})") from None
    reason = untrusted(os.fstat(fd), directory)
    if reason is not None:
        os.close(fd)
        raise _Doubt(f"{shown}: {reason}")
    return fd


def read(directory: str, rank: int, samples: int) -> MappedRankPlan | None:
    """Rank ``rank``'s share of the node plan in ``directory`` (named as the plan), read into private memory,
    if it is there, trusted and consistent (ids below ``samples``); else None (with a warning, once per
    directory and process, when it is there but refused)."""
    fds: list[int] = []
    try:
        fds.append(_open(os.path.dirname(directory) or ".", None, os.path.dirname(directory), True))
        fds.append(_open(os.path.basename(directory), fds[0], directory, True))
        return _read(fds, directory, rank, samples)
    except FileNotFoundError as exc:
        if len(fds) < 2:
            return None  # no plan yet
        doubt = f"{directory}: {exc.filename} is missing"
    except (_Doubt, OSError) as exc:
        doubt = str(exc)
    finally:
        for fd in fds:
            os.close(fd)
    if not fds:  # the plans directory: obtain() plans every epoch in memory without asking again
        _warn_once(
            os.path.dirname(directory),
            f"node plan directory not used ({doubt}): this process plans each epoch in memory",
        )
    else:
        _warn_once(directory, f"node plan file not used ({doubt}): planning the epoch in memory")
    return None


def _warn_once(about: str, message: str) -> None:
    if about not in _warned:
        _warned.add(about)
        logger.warning("%s", message)


def _read(fds: list[int], directory: str, rank: int, samples: int) -> MappedRankPlan:
    """The reading of :func:`read` (``fds``: the plans directory and the plan's): a :class:`_Doubt` or an
    ``OSError`` where anything is not as :func:`write` made it."""
    files: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
    for name in ("starts", "offsets", "ids", "repeats"):
        try:
            fd = _open(name + ".npy", fds[1], os.path.join(directory, name + ".npy"))
        except FileNotFoundError:
            if name == "repeats":
                continue
            raise _Doubt(f"{directory}: {name}.npy is missing") from None
        fds.append(fd)
        files[name] = (fd, *_npy_header(fd, os.path.join(directory, name + ".npy")))
    starts = _array(directory, "starts", files["starts"], 0, None)
    (_, offsets_dtype, offsets_shape), (_, ids_dtype_, ids_shape) = files["offsets"], files["ids"]
    where = f"{directory}: "
    if not (
        starts.dtype == offsets_dtype == np.dtype("<i8")
        and len(files["starts"][2]) == 1
        and len(offsets_shape) == 2
        and ids_dtype_ in (np.dtype("<i4"), np.dtype("<i8"))
        and len(ids_shape) == 1
        and starts.shape == (offsets_shape[0] + 1,)
        and offsets_shape[1] >= 1
    ):
        raise _Doubt(where + "files of other types or shapes")
    if not (starts[0] == 0 and starts[-1] == ids_shape[0] and bool(np.all(starts[1:] >= starts[:-1]))):
        raise _Doubt(where + "starts.npy: not positions in ids.npy")
    if not 0 <= rank < offsets_shape[0]:
        raise _Doubt(where + f"no share for rank {rank} in a plan for {offsets_shape[0]} ranks")
    width = offsets_shape[1]
    row = _array(directory, "offsets", files["offsets"], rank * width, width)
    begin, end = int(starts[rank]), int(starts[rank + 1])
    ids = _array(directory, "ids", files["ids"], begin, end - begin)
    repeats = None
    if "repeats" in files:
        if files["repeats"][1:] != (np.dtype(np.bool_), ids_shape):
            raise _Doubt(where + "repeats.npy: of another type or shape than ids.npy")
        repeats = _array(directory, "repeats", files["repeats"], begin, end - begin)
    fds.append(_open("digests", fds[1], os.path.join(directory, "digests")))
    expected = _plan_digest(
        os.path.basename(directory), samples, starts, offsets_shape, ids_dtype_
    ) + _rank_digest(os.path.basename(directory), rank, row, ids, repeats)
    size = os.fstat(fds[-1]).st_size
    found = os.pread(fds[-1], _DIGEST, 0) + os.pread(fds[-1], _DIGEST, (rank + 1) * _DIGEST)
    if size != (offsets_shape[0] + 1) * _DIGEST or found != expected:
        raise _Doubt(where + "digests: the files are not this plan's (another job's, or changed)")
    if not (row[0] == 0 and row[-1] == end - begin and bool(np.all(row[1:] >= row[:-1]))):
        raise _Doubt(where + f"offsets.npy: rank {rank}'s are not positions in its ids")
    if ids.shape[0] and not (0 <= int(ids.min()) and int(ids.max()) < samples):
        raise _Doubt(where + f"ids.npy: rank {rank}'s ids are not ids of a dataset of {samples} samples")
    flags = repeats if repeats is not None and bool(repeats.any()) else None
    return MappedRankPlan(rank, ids, row, flags, directory=directory, samples=samples)


# the header write() and np.save give a 1-d or 2-d array: its dtype and shape
_HEADER = re.compile(
    rb"\{'descr': '(<i4|<i8|\|b1)', 'fortran_order': False, "
    rb"'shape': \((\d{1,19}),(?: (\d{1,19}))?\), \} *\n"
)
_MAGIC = b"\x93NUMPY\x01\x00"


def _npy_header(fd: int, path: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape in the header of the ``.npy`` file open as ``fd``, checked against its size."""
    head = os.pread(fd, _HEADER_SIZE, 0)
    match = _HEADER.fullmatch(head, 10) if head[:8] == _MAGIC and len(head) == _HEADER_SIZE else None
    if match is None or int.from_bytes(head[8:10], "little") != _HEADER_SIZE - 10:
        raise _Doubt(f"{path}: not a header of a node plan file")
    dtype = np.dtype(match[1].decode())
    shape = tuple(int(size) for size in match.groups()[1:] if size is not None)
    if os.fstat(fd).st_size != _HEADER_SIZE + math.prod(shape) * dtype.itemsize:
        raise _Doubt(f"{path}: {os.fstat(fd).st_size} bytes, not what its header says")
    return dtype, shape


def _array(
    directory: str, name: str, file: tuple[int, np.dtype, tuple[int, ...]], start: int, count: int | None
) -> np.ndarray:
    """Items ``start`` to ``start + count`` (all with None) of a checked ``.npy`` file, in private memory."""
    fd, dtype, shape = file
    count = math.prod(shape) - start if count is None else count
    array = np.empty(count, dtype)  # within the file's size, which its header and fstat agree on
    view, at = array.data.cast("B"), _HEADER_SIZE + start * dtype.itemsize
    while view.nbytes:
        got = os.preadv(fd, [view], at)
        if got == 0:
            raise _Doubt(f"{os.path.join(directory, name)}.npy: shorter than its header says (truncated)")
        view, at = view[got:], at + got
    array.flags.writeable = False
    return array
