"""ChainedColumn: one index column of several corpora in global id order, read from each corpus's own column.

A mix (:class:`shardio.datasets.mixed.MixIndex`) numbers samples ``offsets[c] + i`` over corpora ``c``.
Concatenating the corpora's columns would give every process a private copy of all of them (34 bytes a
sample); a chained column keeps the corpora's columns as they are (mapped read-only from their index files,
shared through the page cache) and answers what readers ask of a column, a sample or a batch of samples, from
the right corpus. Any other use (numpy functions, operators, slices) sees the concatenation, made for
that use and then dropped.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = ["ChainedColumn"]


class ChainedColumn(NDArrayOperatorsMixin):
    """Corpus ``c``'s column ``parts[c]`` holds global ids ``offsets[c]`` to ``offsets[c + 1] - 1``; its
    values are shifted by ``shifts[c]`` (shard numbers) or mapped through ``tables[c]``
    (format numbers), if given."""

    def __init__(
        self,
        parts: Sequence[np.ndarray],
        offsets: np.ndarray,
        dtype: Any,
        *,
        shifts: Sequence[int] | None = None,
        tables: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.parts, self.offsets, self.dtype = (
            list(parts),
            np.asarray(offsets, dtype=np.int64),
            np.dtype(dtype),
        )
        self.shifts, self.tables = shifts, tables
        self._starts = self.offsets.tolist()

    @property
    def shape(self) -> tuple[int]:
        """``(samples,)``."""
        return (int(self.offsets[-1]),)

    @property
    def size(self) -> int:
        """Samples."""
        return int(self.offsets[-1])

    ndim = 1

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _lift(self, c: int, values: np.ndarray) -> np.ndarray:
        if self.shifts is not None:
            values = values.astype(np.int64) + self.shifts[c]
        elif self.tables is not None:
            values = self.tables[c][values]
        return np.asarray(values).astype(self.dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            sample = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= sample < len(self):
                raise IndexError(f"sample {int(key)} is out of bounds for {len(self)} samples")
            c = bisect.bisect_right(self._starts, sample) - 1  # a sample at a time: what readers ask most
            value = self.parts[c][sample - self._starts[c]]
            if self.shifts is not None:
                return self.dtype.type(int(value) + self.shifts[c])
            return self.dtype.type(value if self.tables is None else self.tables[c][value])
        ids = np.asarray(key) if isinstance(key, (list, tuple, np.ndarray)) else None
        if ids is None or ids.dtype.kind not in "iu" or ids.ndim != 1:
            return np.asarray(self)[key]  # a slice, a mask: the concatenation
        ids = np.where(ids < 0, ids + len(self), ids).astype(np.int64)
        if ids.size and not (0 <= int(ids.min()) and int(ids.max()) < len(self)):
            raise IndexError(f"sample ids out of bounds for {len(self)} samples")
        out = np.empty(ids.shape[0], dtype=self.dtype)
        corpus = np.searchsorted(self.offsets, ids, side="right") - 1
        for c in np.unique(corpus).tolist():
            mine = corpus == c
            out[mine] = self._lift(c, self.parts[c][ids[mine] - self.offsets[c]])
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        whole = (
            np.concatenate([self._lift(c, np.asarray(part)) for c, part in enumerate(self.parts)])
            if self.parts
            else np.zeros(0, dtype=self.dtype)
        )
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        inputs = tuple(np.asarray(x) if isinstance(x, ChainedColumn) else x for x in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        """The concatenated column as ``dtype``."""
        return np.asarray(self).astype(dtype, copy=False)

    def max(self, initial: Any = None) -> Any:
        """The largest value (``initial`` for no samples, if given)."""
        return np.asarray(self).max(**({} if initial is None else {"initial": initial}))

    def tolist(self) -> list[Any]:
        """The values as Python numbers."""
        return np.asarray(self).tolist()
