"""Node plan: an epoch's plan as every rank's share, in one directory that every process of a node maps.

The files (``numpy`` ``.npy``, mapped read-only by :func:`read`), ranks one after the other:

- ``ids.npy``: every rank's sample ids, rank 0's batches first, then rank 1's, ... (``int32`` where the
  dataset's ids fit, else ``int64``);
- ``starts.npy``: ``world + 1`` ``int64`` positions in ``ids``: rank ``r``'s ids are
  ``ids[starts[r]:starts[r + 1]]``;
- ``offsets.npy``: ``world x (batches + 1)`` ``int64``; row ``r`` is rank ``r``'s batch offsets (as
  :class:`~shardio.planning.rankplan.RankPlan`'s, relative to ``starts[r]``);
- ``repeats.npy``, only when some sample is a planned repeat: a ``bool`` per id, like ``ids``.

:func:`write` streams the ranks' shares into the files one at a time, so it never holds more than the whole
plan (which the planner made) and one rank's share. :func:`read` checks what a rank relies on (its slice of
``ids`` within the dataset, its offsets, the shapes of ``starts`` and ``offsets``) and returns views.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..planning.plan import EpochPlan
from ..planning.rankplan import RankPlan, rank_plan
from ..planning.repeats import Repeats

__all__ = ["MappedRankPlan", "write", "read", "ids_dtype"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MappedRankPlan(RankPlan):
    """A rank's share mapped from the node plan in ``directory``: it pickles as that reference, not as its
    arrays, so a spawn or forkserver DataLoader worker maps the same files (nothing in shared memory, nothing
    copied). Unpickled where the files are gone or damaged, it becomes None: the receiver plans again."""

    directory: str = ""
    samples: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return read, (self.directory, self.rank, self.samples)


def ids_dtype(samples: int) -> np.dtype:
    """The dtype of the ids of a dataset of ``samples`` samples: ``int32`` where every id fits."""
    return np.dtype(np.int32 if samples <= np.iinfo(np.int32).max else np.int64)


def _header(file: BinaryIO, dtype: np.dtype, length: int) -> None:
    np.lib.format.write_array_header_1_0(file, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                "fortran_order": False, "shape": (length,)})


def write(directory: str, plan: EpochPlan, samples: int) -> None:
    """Write every rank's share of ``plan`` (ids below ``samples``) into the empty ``directory``."""
    world, batches = plan.world_size, plan.num_batches
    sizes = np.diff(plan.offsets)
    starts = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(sizes[plan.rank_batches].sum(axis=1, dtype=np.int64), out=starts[1:])
    offsets = np.zeros((world, batches + 1), dtype=np.int64)
    dtype = ids_dtype(samples)
    repeats = Repeats(plan)  # once for every rank: it is O(N)
    flags_file: BinaryIO | None = None
    try:
        with open(os.path.join(directory, "ids.npy"), "wb") as ids_file:
            _header(ids_file, dtype, int(starts[-1]))
            for rank in range(world):
                share = rank_plan(plan, rank, repeats)
                share.ids.astype(dtype, copy=False).tofile(ids_file)
                offsets[rank] = share.offsets
                if share.repeats is not None and flags_file is None:
                    flags_file = open(os.path.join(directory, "repeats.npy"), "wb")
                    _header(flags_file, np.dtype(np.bool_), int(starts[-1]))
                    np.zeros(int(starts[rank]), dtype=np.bool_).tofile(flags_file)  # the ranks before: none
                if flags_file is not None:
                    none = np.zeros(share.ids.shape[0], np.bool_)
                    flags = share.repeats if share.repeats is not None else none
                    flags.tofile(flags_file)
                del share
    finally:
        if flags_file is not None:
            flags_file.close()
    np.save(os.path.join(directory, "starts.npy"), starts)
    np.save(os.path.join(directory, "offsets.npy"), offsets)


def read(directory: str, rank: int, samples: int) -> MappedRankPlan | None:
    """Rank ``rank``'s share from ``directory``, as read-only views of the mapped files, if they are there and
    consistent (ids below ``samples``); else None (a warning when they are there but damaged or foreign)."""
    try:
        ids, starts, offsets = (_mapped(os.path.join(directory, n + ".npy")) for n in ("ids", "starts", "offsets"))
        repeats_path = os.path.join(directory, "repeats.npy")
        repeats = _mapped(repeats_path) if os.path.exists(repeats_path) else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as exc:
        logger.warning("the node plan under %s cannot be read (%s): planning the epoch here instead",
                       directory, exc)
        return None
    share = _share(directory, rank, samples, ids, starts, offsets, repeats)
    if share is None:
        logger.warning("the node plan under %s is inconsistent for rank %d: planning the epoch here instead",
                       directory, rank)
    return share


# the header np.save and write() give a 1-d or 2-d array: its dtype and shape
_HEADER = re.compile(rb"\{'descr': '(<i4|<i8|\|b1)', 'fortran_order': False, 'shape': \((\d+),(?: (\d+))?\), \} *\n")
_MAGIC = b"\x93NUMPY\x01\x00"


def _mapped(path: str) -> np.ndarray:
    """The array in the ``.npy`` file at ``path``, mapped read-only. The headers this module writes are read
    by one pattern: ``np.load`` parses a header with ``ast.literal_eval``, ~0.1 ms a file, so three a process
    an epoch. Any other header is left to ``np.load``."""
    with open(path, "rb") as file:
        head = file.read(128)
        match = _HEADER.fullmatch(head, 10) if head[:8] == _MAGIC and len(head) == 128 else None
        if match is None or int.from_bytes(head[8:10], "little") != 118:
            return np.load(path, mmap_mode="r")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    shape = tuple(int(size) for size in match.groups()[1:] if size is not None)
    return np.frombuffer(mapped, np.dtype(match[1].decode()), math.prod(shape), 128).reshape(shape)


def _share(directory: str, rank: int, samples: int, ids: np.ndarray, starts: np.ndarray, offsets: np.ndarray,
           repeats: np.ndarray | None) -> MappedRankPlan | None:
    """Rank ``rank``'s views, or None where the arrays are not a node plan of a dataset of ``samples`` ids."""
    if not (ids.ndim == 1 and ids.dtype.kind == "i" and starts.dtype == offsets.dtype == np.int64
            and offsets.ndim == 2 and starts.shape == (offsets.shape[0] + 1,) and 0 <= rank < offsets.shape[0]
            and offsets.shape[1] >= 1 and starts[0] == 0 and starts[-1] == ids.shape[0]
            and bool(np.all(starts[1:] >= starts[:-1]))
            and (repeats is None or (repeats.dtype == np.bool_ and repeats.shape == ids.shape))):
        return None
    begin, end = int(starts[rank]), int(starts[rank + 1])
    row = offsets[rank]
    mine = ids[begin:end]
    if not (row[0] == 0 and row[-1] == end - begin and bool(np.all(row[1:] >= row[:-1]))
            and (mine.shape[0] == 0 or (0 <= int(mine.min()) and int(mine.max()) < samples))):
        return None
    return MappedRankPlan(rank, mine, row, None if repeats is None else repeats[begin:end], directory=directory,
                          samples=samples)
