"""The planner's stable argsorts: of (group, tie) keys as SIMD sorts of packed values (the window order), and
of small keys by radix (buckets, batch costs).

Pure numpy. The planner orders every sample of an epoch by (shard window, random tie, id); a stable argsort
of N int64 keys is the slowest and largest step of planning, so the keys and ids are packed into uint64s and
sorted with numpy's (SIMD) sort instead, in chunks so that no temporary is of size N.
"""

from __future__ import annotations

import numpy as np

__all__ = ["radix_order", "stable_order"]

_LOW = np.uint64(0xFFFFFFFF)
_CHUNK = 1 << 20
_PACKED_LIMIT = 1 << 32


def stable_order(groups: np.ndarray, ties: np.ndarray | None = None) -> np.ndarray:
    """``argsort((groups << 32) | ties, kind="stable")`` as int64 (``groups`` and ``ties`` in ``[0, 2**32)``).

    Stable: equal keys keep id order (numpy's default argsort orders them differently per CPU). Done as
    sorts of distinct packed values (a key and an index in one uint64), which numpy sorts with SIMD several
    times faster than a stable argsort and in less memory; the result is the same on every machine.
    """
    n = groups.shape[0]
    if n >= _PACKED_LIMIT:  # an index no longer fits beside a key
        keys = groups.astype(np.int64) << 32 if ties is None else (groups.astype(np.int64) << 32) | ties
        return np.argsort(keys, kind="stable").astype(np.int64)
    packed = (
        ties.view(np.uint64)
        if ties is not None and ties.dtype == np.int64
        else np.asarray(groups if ties is None else ties).astype(np.uint64)
    )  # the caller's int64 ties are overwritten
    ids: np.ndarray | None = None
    for at in range(0, n, _CHUNK):  # in chunks, so no temporary is of size n
        packed[at : at + _CHUNK] <<= np.uint64(32)
        packed[at : at + _CHUNK] |= np.arange(at, min(at + _CHUNK, n), dtype=np.uint64)
    packed.sort()
    if ties is not None:  # sorted by (tie, id): now stably by group, for (group, tie, id)
        ids = packed.astype(np.uint32)  # the low halves: ids in (tie, id) order
        for at in range(0, n, _CHUNK):
            chunk = packed[at : at + _CHUNK]
            chunk[:] = groups[ids[at : at + _CHUNK]]
            chunk <<= np.uint64(32)
            chunk |= np.arange(at, at + chunk.shape[0], dtype=np.uint64)
        packed.sort()
    packed &= _LOW
    order = packed.view(np.int64)
    if ids is not None:
        for at in range(0, n, _CHUNK):
            order[at : at + _CHUNK] = ids[order[at : at + _CHUNK]]
    return order


def radix_order(keys: np.ndarray) -> np.ndarray:
    """``argsort(keys, kind="stable")`` on the narrowest unsigned type that holds ``keys`` (non-negative):
    numpy sorts 16-bit keys by radix, several times faster than 64-bit ones."""
    top = int(keys.max(initial=0))
    narrow = np.uint16 if top < 1 << 16 else np.uint32 if top < 1 << 32 else np.int64
    return np.argsort(keys.astype(narrow, copy=False), kind="stable")
