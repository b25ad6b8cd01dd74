"""ReadStats: the counters of one process's loading (samples, skips by error type, retries, requests)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["ReadStats"]


@dataclass
class ReadStats:
    """Counters of one process's loading: samples loaded, samples skipped (by error type) and retries."""

    samples: int = 0
    skipped: int = 0
    retries: int = 0
    requests: int = 0
    """Remote read requests made (each coalesced read-ahead request counts once)."""
    bytes_fetched: int = 0
    """Bytes those requests asked for."""
    errors: Counter[str] = field(default_factory=Counter)
    """Skipped samples by error type (``FormatError``, ``DecodeError``, ...)."""

    def skip(self, exc: BaseException) -> None:
        """Count one sample skipped because of ``exc``."""
        self.skipped += 1
        self.errors[type(exc).__name__] += 1
