"""Corpus streams: which stream positions each epoch of a mix takes, after re-mixes.

Each corpus of a mix is an endless stream of passes (:mod:`shardio.planning.mix`): stream position ``p`` is
a fixed sample (pass ``p // size``, shuffled by ``(seed, pass, corpus)``), whatever the mix. A mix that
took effect at epoch ``since`` plays each corpus's *stream from there*: first the ``pending`` positions
(left over by a corpus dropped in the middle of an epoch, in order), then ``cursor``, ``cursor + 1``, ...;
epoch ``e`` takes items ``[(e - since) * q, (e - since + 1) * q)`` of that sequence (``q`` the quota).

Positions travel in states as *ranges*: ``[[start, stop], ...]``, runs of consecutive positions in order
(compact where consumption is a prefix plus a scattered set, as in the middle of an epoch). A stream keeps its
``pending`` positions as ranges too (a ``(k, 2)`` array): taking an epoch's items from it costs the items
taken and the number of ranges, never the length of the ranges (a state's few bytes can say
``[[0, 10**12]]``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..errors import OptionError, StateError
from .options import Ordering
from .order import MIX, window_order

__all__ = [
    "Stream",
    "expand",
    "ranges_of",
    "as_ranges",
    "join_ranges",
    "stream_samples",
    "corpus_key",
    "merge_places",
    "MAX_POSITION",
]

MAX_POSITION = 2**63 - 1
"""Stream positions are int64: the last position any epoch may play."""

_NO_RANGES = np.zeros((0, 2), dtype=np.int64)


def expand(ranges: Sequence[Sequence[int]]) -> np.ndarray:
    """The positions of ``ranges`` in order, with a :class:`StateError` for a malformed range."""
    parts = []
    for item in ranges:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or any(type(v) is not int for v in item)
            or not 0 <= item[0] < item[1]
        ):
            raise StateError(
                f"malformed loader state: a stream range must be [start, stop] integers with "
                f"0 <= start < stop, not {item!r}"
            )
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


def as_ranges(positions: np.ndarray) -> np.ndarray:
    """``positions`` (in their order) as a ``(k, 2)`` array of runs ``[start, stop)``."""
    found = ranges_of(positions)
    return np.asarray(found, dtype=np.int64).reshape(len(found), 2)


def join_ranges(ranges: np.ndarray) -> np.ndarray:
    """``ranges`` (a ``(k, 2)`` array, in order), each run that ends where the next starts joined to it."""
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if ranges.shape[0] < 2:
        return ranges
    cuts = np.flatnonzero(ranges[1:, 0] != ranges[:-1, 1]) + 1
    starts, stops = np.concatenate([[0], cuts]), np.concatenate([cuts, [ranges.shape[0]]])
    return np.stack([ranges[starts, 0], ranges[stops - 1, 1]], axis=1)


class Stream(NamedTuple):
    """A corpus's stream from a point on: the ``pending`` positions (ranges, a ``(k, 2)`` array of
    ``[start, stop)`` in order), then ``cursor`` onwards."""

    cursor: int = 0
    pending: np.ndarray = _NO_RANGES

    @property
    def held(self) -> int:
        """How many positions ``pending`` holds."""
        return int((self.pending[:, 1] - self.pending[:, 0]).sum()) if self.pending.shape[0] else 0

    def take(self, first: int, count: int) -> np.ndarray:
        """Items ``[first, first + count)`` of the stream: stream positions (O(count + pending ranges))."""
        held = self.held
        after = min(count, max(first + count - held, 0))  # the items past the pending positions
        shift = self.cursor + max(first - held, 0)  # the position of the first of them (Python ints: no wrap)
        if after and shift + after - 1 > MAX_POSITION:
            raise OptionError(
                f"stream items {first} to {first + count - 1} reach position "
                f"{shift + after - 1}, "
                f"beyond the int64 positions a stream has ({MAX_POSITION})"
            )
        if first >= held:
            return np.arange(count, dtype=np.int64) + np.int64(shift)
        items = np.arange(first, first + count, dtype=np.int64)
        lengths = self.pending[:, 1] - self.pending[:, 0]
        ends = np.cumsum(lengths)
        inside = items < held
        run = np.searchsorted(ends, items[inside], side="right")
        out = np.empty(count, dtype=np.int64)
        out[inside] = self.pending[run, 0] + items[inside] - (ends[run] - lengths[run])
        out[~inside] = np.arange(int((~inside).sum()), dtype=np.int64) + np.int64(self.cursor)
        return out

    def advance(self, count: int) -> Stream:
        """The stream after its first ``count`` items."""
        held = self.held
        if count >= held:
            return Stream(self.cursor + count - held, _NO_RANGES)
        ends = np.cumsum(self.pending[:, 1] - self.pending[:, 0])
        run = int(np.searchsorted(ends, count, side="right"))  # the run holding item `count`
        rest = self.pending[run:].copy()
        rest[0, 0] = rest[0, 1] - (int(ends[run]) - count)
        return Stream(self.cursor, rest)


def corpus_key(name: str) -> int:
    """A corpus's number in RNG keys: a hash of its name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def stream_samples(
    columns: tuple[np.ndarray, np.ndarray, int],
    keep: np.ndarray,
    ordering: Ordering,
    seed: int,
    name: str,
    positions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The local sample ids at stream ``positions`` of corpus ``name`` (``keep``: its eligible samples), and
    their shard windows (numbered on across passes)."""
    shard_ids, _, num_shards = columns
    size, width = int(keep.sum()), -(-max(num_shards, 1) // ordering.shuffle_shards)
    local = np.empty(positions.shape[0], dtype=np.int64)
    windows = np.empty(positions.shape[0], dtype=np.int64)
    passes = positions // size
    # Each pass's positions found once by a sort, not by a scan of every position per pass: a small corpus
    # drawn by a large epoch has as many passes as positions over its size (O(positions x passes) otherwise).
    by_pass = np.argsort(passes, kind="stable")
    cuts = (np.flatnonzero(np.diff(passes[by_pass])) + 1).tolist()
    key = corpus_key(name)
    for start, stop in zip([0, *cuts], [*cuts, positions.shape[0]]):
        at = by_pass[start:stop]
        if at.shape[0] == 0:  # no positions at all
            continue
        p = int(passes[at[0]])
        order, window = window_order(shard_ids, num_shards, ordering, (seed, p, MIX, key))
        local[at] = order[keep[order]][positions[at] - p * size]
        windows[at] = p * width + window[local[at]]
    return local, windows


def merge_places(keys: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Where each element of each strictly increasing key array lands when all are merged; ties go to the
    earlier array. Exact and the same on every machine (binary searches, no float sort)."""
    places = []
    for c, own in enumerate(keys):
        place = np.arange(own.shape[0], dtype=np.int64)
        for other, theirs in enumerate(keys):
            if other != c:
                place += np.searchsorted(theirs, own, side="right" if other < c else "left")
        places.append(place)
    return places
