"""Keys: every sample's key as one UTF-8 blob plus end offsets, decoded one at a time on demand.

A list of 10^7 Python strings costs about a gigabyte in every process that builds it; the blob is the
key bytes themselves (mapped read-only from the index file, so shared by every process on a node), and
the ends are 8 bytes a sample. ``keys[i]`` decodes one key; ``keys.index(key)`` finds one in C (a
substring search over the blob, checked against the key boundaries), without a dictionary of N entries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from ..errors import FormatError
from .spans import Spans, join_spans

__all__ = ["ChainedKeys", "Keys", "encode_keys"]


def encode_keys(keys: Sequence[str]) -> tuple[bytes, np.ndarray]:
    """The blob and end offsets (``uint64``) of ``keys``."""
    return join_spans([k.encode("utf-8") for k in keys])


class Keys(Spans, Sequence[str]):
    """A read-only sequence of keys over ``blob`` (any buffer with ``find``: bytes or a memory map) and
    ``ends`` (the end offset of each key in the blob). ``where`` names the file in errors."""

    _what = "key {}"

    @classmethod
    def of(cls, keys: Sequence[str]) -> Keys:
        """Keys held in memory (for an index being built)."""
        if isinstance(keys, Keys):
            return keys
        blob, ends = encode_keys(keys)
        return cls(blob, ends)

    def key(self, i: int) -> str:
        """Key number ``i`` (0 <= i < len)."""
        start, end = self._span(i)
        try:
            return bytes(self._blob[start:end]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{self._where}: key {i} is not valid UTF-8: the index is damaged") from None

    def keys_of(self, ids: np.ndarray) -> list[str]:
        """The keys of samples ``ids`` (a batch: their spans checked at once, then each decoded)."""
        ends = self._ends[ids].astype(np.int64)
        starts = np.where(ids > 0, self._ends[ids - 1], 0).astype(np.int64) if ids.size else ends
        if ids.size and not (0 <= starts.min() and (starts <= ends).all() and ends.max() <= len(self._blob)):
            for i in ids.tolist():
                self._span(i)  # names the damaged one
        blob = self._blob
        try:
            return [
                bytes(blob[start:end]).decode("utf-8") for start, end in zip(starts.tolist(), ends.tolist())
            ]
        except UnicodeDecodeError:
            for i in ids.tolist():
                self.key(i)  # names the key that is not UTF-8
            raise

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.key(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"key {i} of {n}")
        return self.key(i % n if n else i)

    def __iter__(self) -> Iterator[str]:
        return (self.key(i) for i in range(len(self)))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.find(key) is not None

    def find(self, key: str) -> int | None:
        """The number of the first sample with ``key``, or None: a substring search over the blob, each hit
        kept only where it starts and ends on key boundaries."""
        needle = key.encode("utf-8")
        size = len(self._blob)
        position = self._blob.find(needle, 0) if needle else -1
        while position >= 0:
            first = int(np.searchsorted(self._ends, position, side="right"))
            # the key holding byte `position`
            start = int(self._ends[first - 1]) if first else 0
            if start == position and first < len(self) and int(self._ends[first]) == position + len(needle):
                return first
            position = self._blob.find(needle, position + 1) if position + 1 < size else -1
        if not needle:  # the empty key: an empty span
            spans = np.flatnonzero(np.diff(self._ends, prepend=np.uint64(0)) == 0)
            return int(spans[0]) if spans.size else None
        return None

    def index(self, key: Any, start: int = 0, stop: int | None = None) -> int:
        """The number of the first sample with ``key`` (``ValueError`` when there is none)."""
        found = self.find(key) if isinstance(key, str) and start == 0 and stop is None else None
        if found is None:
            if start or stop is not None:
                return super().index(key, start, len(self) if stop is None else stop)
            raise ValueError(f"{key!r} is not a key of this index")
        return found

    def __eq__(self, other: object) -> bool:
        if type(other) is Keys and type(self) is Keys:
            return (
                len(self) == len(other)
                and bytes(self.blob) == bytes(other.blob)
                and bool(np.array_equal(self.ends, other.ends))
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(k) for k in self[:3])
        return f"Keys([{head}{', ...' if len(self) > 3 else ''}], {len(self)} keys)"


class ChainedKeys(Keys):
    """Several :class:`Keys` one after another (a mix of corpora), without copying any."""

    def __init__(self, parts: Sequence[Keys]) -> None:
        super().__init__(b"", np.zeros(0, np.uint64), "mix")
        self._parts = list(parts)
        self._offsets = np.cumsum([0, *map(len, self._parts)], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def key(self, i: int) -> str:
        """Key number ``i`` of the chain."""
        part = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return self._parts[part].key(i - int(self._offsets[part]))

    def keys_of(self, ids: np.ndarray) -> list[str]:
        """The keys of samples ``ids`` of the chain, each part's asked at once."""
        parts = np.searchsorted(self._offsets, ids, side="right") - 1
        found: list[str] = [""] * len(ids)
        for part in np.unique(parts).tolist():
            at = np.flatnonzero(parts == part)
            keys = self._parts[part].keys_of(ids[at] - self._offsets[part])
            for position, key in zip(at.tolist(), keys):
                found[position] = key
        return found

    def find(self, key: str) -> int | None:
        """The number of the first sample with ``key`` in the chain, or None."""
        for part, offset in zip(self._parts, self._offsets.tolist()):
            found = part.find(key)
            if found is not None:
                return offset + found
        return None
