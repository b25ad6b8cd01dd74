"""Corpus streams: which stream positions each epoch of a mix takes, after re-mixes.

Each corpus of a mix is an endless stream of passes (:mod:`shardio.planning.mix`): stream position ``p`` is
a fixed sample (pass ``p // size``, shuffled by ``(seed, pass, corpus)``), whatever the mix. A mix that
took effect at epoch ``since`` plays each corpus's *stream from there*: first the ``pending`` positions
(left over by a corpus dropped in the middle of an epoch, in order), then ``cursor``, ``cursor + 1``, ...;
epoch ``e`` takes items ``[(e - since) * q, (e - since + 1) * q)`` of that sequence (``q`` the quota).

Positions travel in states as *ranges*: ``[[start, stop], ...]``, runs of consecutive positions in order
(compact where consumption is a prefix plus a scattered set, as in the middle of an epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import StateError

__all__ = ["Stream", "expand", "ranges_of"]


def expand(ranges: Sequence[Sequence[int]]) -> np.ndarray:
    """The positions of ``ranges`` in order, with a :class:`StateError` for a malformed range."""
    parts = []
    for item in ranges:
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or any(type(v) is not int for v in item)
                or not 0 <= item[0] < item[1]):
            raise StateError(f"malformed loader state: a stream range must be [start, stop] integers with "
                             f"0 <= start < stop, not {item!r}")
        parts.append(np.arange(item[0], item[1], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def ranges_of(positions: np.ndarray) -> list[list[int]]:
    """``positions`` (in their order) as runs of consecutive positions, JSON-ready."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.shape[0] == 0:
        return []
    cuts = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [positions.shape[0]]])
    return [[int(positions[a]), int(positions[b - 1]) + 1] for a, b in zip(starts, stops)]


class Stream(NamedTuple):
    """A corpus's stream from a point on: the ``pending`` positions, then ``cursor`` onwards."""

    cursor: int = 0
    pending: np.ndarray = np.zeros(0, dtype=np.int64)

    def take(self, first: int, count: int) -> np.ndarray:
        """Items ``[first, first + count)`` of the stream: stream positions."""
        items = np.arange(first, first + count, dtype=np.int64)
        held = self.pending.shape[0]
        if held == 0:
            return items + self.cursor
        return np.where(items < held, self.pending[np.minimum(items, held - 1)], self.cursor + items - held)

    def advance(self, count: int) -> Stream:
        """The stream after its first ``count`` items."""
        held = self.pending.shape[0]
        if count <= held:
            return Stream(self.cursor, self.pending[count:])
        return Stream(self.cursor + count - held, np.zeros(0, dtype=np.int64))
