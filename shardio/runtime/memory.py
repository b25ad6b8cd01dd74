"""Memory: hand the allocator's free memory back to the system after a large transient (planning an epoch).

Planning an epoch allocates and frees several arrays of size N. glibc's ``malloc`` keeps freed memory of the
sizes it served from its heap (every array under its mmap threshold, which rises to 32 MiB once a larger
one has been freed), so a training process's resident memory would stay at its planning peak for the whole
epoch, and DataLoader workers forked from it would inherit those pages. ``malloc_trim(0)`` returns them.
Elsewhere (another C library, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

__all__ = ["WORTH_TRIMMING", "trim"]

WORTH_TRIMMING = 1 << 16
"""Samples from which planning an epoch is worth a trim: a smaller plan's arrays total a few MiB, less than a
trim costs in a training process whose heap is large (``malloc_trim`` walks all of it)."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        library = ctypes.CDLL(None)  # the process's own symbols: no file opened, no ldconfig run
        function: Callable[[int], int] = library.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return function


def trim() -> bool:
    """Return the C heap's free memory to the system; whether that could be asked (glibc)."""
    function = _malloc_trim()
    if function is None:
        return False
    function(0)
    return True
