"""The planner's options: how an epoch's samples are ordered (:class:`Ordering`) and batched
(:class:`Batching`), their validation, and the per-sample cost model that both the planner and the
bucketing helpers use. Nothing here imports the planner, so :mod:`shardio.plan` and
:mod:`shardio.bucketing` both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import OptionError

__all__ = ["Batching", "Ordering", "REMAINDERS", "sample_cost", "eligible"]

REMAINDERS = ("pad", "drop")


@dataclass(frozen=True)
class Ordering:
    """How an epoch's samples are ordered."""

    shuffle: bool = True
    shuffle_shards: int = 16
    """Samples mix across windows of this many consecutive (permuted) shards."""

    def __post_init__(self) -> None:
        if self.shuffle_shards < 1:
            raise OptionError(f"shuffle_shards must be at least 1, not {self.shuffle_shards}")


@dataclass(frozen=True)
class Batching:
    """How samples are grouped into batches, and what happens to the last partial round of batches."""

    batch_size: int | None = None
    max_duration: float | None = None
    """Padded seconds per batch: batch size x the longest sample's cost (its duration, or see
    ``quadratic_duration``)."""
    max_batch_size: int | None = None
    remainder: str = "pad"
    """``pad``: repeat batches from the epoch start to fill the last round; ``drop``: drop that round."""
    num_buckets: int | None = None
    """Bucket by duration into this many buckets of about equal total duration (estimated from the index)."""
    duration_bins: tuple[float, ...] | None = None
    """Explicit bucket edges in seconds (increasing): ``len(duration_bins) + 1`` buckets."""
    quadratic_duration: float | None = None
    """``Q``: a sample of ``d`` seconds costs ``d + d**2 / Q`` toward ``max_duration`` (as in Lhotse)."""
    min_duration: float | None = None
    """Leave out samples shorter than this many seconds."""
    max_sample_duration: float | None = None
    """Leave out samples longer than this many seconds."""

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.max_duration is not None:
            raise OptionError("give batch_size or max_duration, not both")
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.max_duration is not None and not self.max_duration > 0:
            raise OptionError(f"max_duration must be positive, not {self.max_duration}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise OptionError(f"max_batch_size must be at least 1, not {self.max_batch_size}")
        if self.max_batch_size is not None and self.max_duration is None:
            raise OptionError("max_batch_size caps duration batches: give it with max_duration, not batch_size")
        if self.remainder not in REMAINDERS:
            raise OptionError(f"remainder must be one of {REMAINDERS}, not {self.remainder!r}")
        _check_buckets_and_filters(self)

    @property
    def bucketed(self) -> bool:
        """Whether batches form within duration buckets (and the batch order is shuffled)."""
        return self.num_buckets is not None or self.duration_bins is not None

    def eligible(self, durations: np.ndarray) -> np.ndarray:
        """Which samples can be planned: within the duration filters, and alone within ``max_duration``."""
        return eligible(durations, self)


def _check_buckets_and_filters(b: Batching) -> None:
    """Raise :class:`OptionError` for bucketing, cost and filter options that cannot work (and store
    ``duration_bins`` as a tuple of floats)."""
    if b.num_buckets is not None and b.duration_bins is not None:
        raise OptionError("give num_buckets or duration_bins, not both")
    if b.num_buckets is not None and (not isinstance(b.num_buckets, int) or b.num_buckets < 1):
        raise OptionError(f"num_buckets must be an integer of at least 1, not {b.num_buckets!r}")
    if b.duration_bins is not None:
        bins = tuple(float(edge) for edge in b.duration_bins)
        if any(not (e > 0 and np.isfinite(e)) for e in bins) or any(e >= f for e, f in zip(bins, bins[1:])):
            raise OptionError(f"duration_bins must be positive, finite and strictly increasing, not {bins}")
        object.__setattr__(b, "duration_bins", bins)
    if b.quadratic_duration is not None:
        if not b.quadratic_duration > 0:
            raise OptionError(f"quadratic_duration must be positive, not {b.quadratic_duration}")
        if b.max_duration is None:
            raise OptionError("quadratic_duration weighs samples toward max_duration: give max_duration too")
    for name in ("min_duration", "max_sample_duration"):
        value = getattr(b, name)
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise OptionError(f"{name} must be a non-negative number of seconds, not {value}")
    if b.min_duration is not None and b.max_sample_duration is not None and b.min_duration > b.max_sample_duration:
        raise OptionError(f"min_duration ({b.min_duration}) is above max_sample_duration "
                          f"({b.max_sample_duration}): every sample would be left out")


def sample_cost(durations: np.ndarray, quadratic: float | None) -> np.ndarray:
    """What a sample of ``d`` seconds costs in a batch: ``d``, or ``d + d**2 / quadratic`` (attention-like)."""
    durations = np.asarray(durations, dtype=np.float64)
    return durations if quadratic is None else durations + durations * durations / quadratic


def eligible(durations: np.ndarray, batching: Batching) -> np.ndarray:
    """Which samples ``batching`` can plan: within its duration filters, and alone within ``max_duration``."""
    keep = np.ones(durations.shape[0], dtype=bool)
    if batching.min_duration is not None:
        keep &= durations >= batching.min_duration
    if batching.max_sample_duration is not None:
        keep &= durations <= batching.max_sample_duration
    if batching.max_duration is not None:
        keep &= sample_cost(durations, batching.quadratic_duration) <= batching.max_duration * (1 + 1e-9)
    return keep
