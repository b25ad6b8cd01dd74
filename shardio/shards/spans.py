"""Spans: entries stored as one byte blob plus each entry's end offset, the layout of keys and metadata.

The blob is bytes in memory or a read-only map of the index file; the ends are ``uint64``. An entry is sliced
out only when asked for, after checking its span lies inside the blob (a damaged index is a ``FormatError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import FormatError

__all__ = ["Spans", "join_spans"]


def join_spans(encoded: Sequence[bytes]) -> tuple[bytes, np.ndarray]:
    """The blob and end offsets (``uint64``) of ``encoded`` entries, back to back."""
    ends = np.cumsum([len(e) for e in encoded], dtype=np.uint64) if encoded else np.zeros(0, np.uint64)
    return b"".join(encoded), ends


class Spans:
    """Entries over ``blob`` (bytes or a memory map) and ``ends`` (each entry's end offset in it); ``where``
    names the file in errors."""

    _what = "entry"  # how errors name one entry: "key 3", "the metadata of sample 3"

    def __init__(self, blob: Any, ends: np.ndarray, where: str = "index") -> None:
        self._blob = blob
        self._ends = ends
        self._where = where

    @property
    def blob(self) -> Any:
        """Every entry's bytes, back to back."""
        return self._blob

    @property
    def ends(self) -> np.ndarray:
        """Each entry's end offset in :attr:`blob`."""
        return self._ends

    def __len__(self) -> int:
        return int(self._ends.shape[0])

    def _span(self, i: int, limit: int | None = None) -> tuple[int, int]:
        """Entry ``i``'s start and end in the blob, checked (and at most ``limit`` bytes long)."""
        start = int(self._ends[i - 1]) if i else 0
        end = int(self._ends[i])
        if not 0 <= start <= end <= len(self._blob) or (limit is not None and end - start > limit):
            raise FormatError(
                f"{self._where}: {self._what.format(i)} spans bytes {start} to {end} of a "
                f"{len(self._blob)}-byte blob: the index is damaged"
            )
        return start, end
