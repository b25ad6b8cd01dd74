"""The planner's options: how an epoch's samples are ordered (:class:`Ordering`) and batched
(:class:`Batching`), their validation, and the per-sample cost model that both the planner and the
bucketing helpers use. Nothing here imports the planner, so :mod:`shardio.planning.plan` and
:mod:`shardio.planning.bucketing` both build on it.
"""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..checks.options import MAX_INT64, flag, integer, real
from ..errors import OptionError, shown
from .batches import eligible, sample_cost

__all__ = ["Batching", "Ordering", "MAX_BUCKETS", "MAX_STEP_BATCHES", "REMAINDERS", "sample_cost", "eligible"]

REMAINDERS = ("pad", "drop")
MAX_STEP_BATCHES = 2**16
"""The most batches per optimizer step (``step_batches``): ranks x accumulation of any real job."""
MAX_BUCKETS = 2**16
"""The most duration buckets (``num_buckets``, or ``len(duration_bins) + 1``): far beyond the tens that
balance padding, and planning allocates per bucket."""


@dataclass(frozen=True)
class Ordering:
    """How an epoch's samples are ordered. Part of the plan: a saved state records it.

    Args:
        shuffle: Shuffle every epoch (default `True`): shards permuted, samples shuffled within windows of
            shards, all a function of `(seed, epoch)`. `False`: index order, the same every epoch.
        shuffle_shards: Samples mix across windows of this many consecutive (permuted) shards (default 16).
            Larger windows mix more; each worker then reads from more shards at once (more open files, more
            scattered reads).
        node_stable: Each node reads the same part of the corpus every epoch (default `False`: every epoch
            deals the whole corpus over all ranks). The shards are dealt once to the nodes, in parts of about
            equal audio that depend on the seed and the number of nodes only; every epoch shuffles each part
            (shards permuted, samples within windows of `shuffle_shards` of the part's shards) and batches
            and deals it to that node's ranks, so a node-local cache (`Reading(decoded_cache=...)`) holds
            its part from the second epoch on. Nodes are contiguous blocks of `World.ranks_per_node` ranks
            (torchrun's `LOCAL_WORLD_SIZE`); with one node the plan is the global one. Not with
            `Batching(step_batches=...)` (steps the same on any world cannot keep parts on nodes) nor in a
            mix.

    Raises:
        OptionError: A value of the wrong type or out of range.
    """

    shuffle: bool = True
    shuffle_shards: int = 16
    node_stable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "shuffle", flag("shuffle", self.shuffle))
        object.__setattr__(self, "node_stable", flag("node_stable", self.node_stable))
        object.__setattr__(
            self, "shuffle_shards", integer("shuffle_shards", self.shuffle_shards, 1, MAX_INT64)
        )


@dataclass(frozen=True)
class Batching:
    """How samples form batches, and what happens to the last partial round of batches. Part of the plan: a
    saved state records every field (`batch_cost` by its name).

    With neither `batch_size` nor `max_duration`, a dataset yields single samples.

    Args:
        batch_size: Samples per batch. Memory: a batch is this many times the longest sample's audio.
        max_duration: Padded seconds per batch: batch size x the longest sample's cost (its duration, or see
            `quadratic_duration`). Bounds a batch's memory whatever the durations; not with `batch_size`.
        max_batch_size: At most this many samples in a `max_duration` batch (short samples would make very
            large ones).
        remainder: `"pad"` (the default): the last round of `world_size` batches is filled by repeating
            batches from the epoch's start (flagged in the batch's `repeat`); `"drop"`: that round is dropped.
        num_buckets: Batches form within this many duration buckets of about equal total duration (estimated
            from the index): far less padding; the batch order is shuffled per epoch. Planning allocates per
            bucket (at most 65,536).
        duration_bins: Explicit bucket edges in seconds (increasing): `len(duration_bins) + 1` buckets; not
            with `num_buckets`.
        quadratic_duration: `Q`: a sample of `d` seconds costs `d + d**2 / Q` toward `max_duration` (as in
            Lhotse): fewer long samples a batch, for attention's quadratic memory. Needs `max_duration`.
        min_duration: Leave out samples shorter than this many seconds (never yielded; counted in the plan's
            report).
        max_sample_duration: Leave out samples longer than this many seconds.
        sync_buckets: Step-synchronised batches: at every step all ranks get batches of one bucket and of
            nearly equal cost, so DDP does not wait on one rank's long bucket. `None` (the default): on when
            bucketing; `True` without buckets balances cost only (all samples are one bucket).
        batch_cost: What a batch costs, `batch_cost(durations) -> float` (deterministic; a module-level
            function, so that spawned workers can pickle it), for balancing synchronised steps. Default:
            padded seconds, or the quadratic cost with `quadratic_duration`. Called per batch when planning.
        batch_cost_name: The name a state records for `batch_cost` (required with it): a state saved under
            another name does not load. Give a new name whenever the function changes.
        step_batches: `K`: batches per optimizer step for the whole job. The epoch is then planned as a
            sequence of steps of `K` batches (of one bucket with `sync_buckets`) that is the same on any
            number of ranks `W` dividing `K`; each rank gets `K / W` of a step's batches (its gradient
            accumulation, `ds.accumulation`), balanced by cost. A resume on another `W` continues the same
            steps. `None` (the default): batches are dealt per rank, as without steps.

    Raises:
        OptionError: A value of the wrong type or out of range, or options that cannot work together.
    """

    batch_size: int | None = None
    max_duration: float | None = None
    max_batch_size: int | None = None
    remainder: str = "pad"
    num_buckets: int | None = None
    duration_bins: tuple[float, ...] | None = None
    quadratic_duration: float | None = None
    min_duration: float | None = None
    max_sample_duration: float | None = None
    sync_buckets: bool | None = None
    batch_cost: Callable[[np.ndarray], float] | None = field(default=None, compare=False, repr=False)
    batch_cost_name: str | None = None
    step_batches: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.max_duration is not None:
            raise OptionError("give batch_size or max_duration, not both")
        for name in ("batch_size", "max_batch_size"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, integer(name, getattr(self, name), 1, MAX_INT64))
        if self.max_duration is not None:
            seconds = real("max_duration", self.max_duration, "a positive, finite number of seconds")
            object.__setattr__(self, "max_duration", seconds)  # a float: what a state records
            if not self.max_duration > 0:
                raise OptionError(
                    f"max_duration must be a positive, finite number of seconds, not {self.max_duration}"
                )
        if self.max_batch_size is not None and self.max_duration is None:
            raise OptionError(
                "max_batch_size caps duration batches: give it with max_duration, not batch_size"
            )
        if self.remainder not in REMAINDERS:
            raise OptionError(f"remainder must be one of {REMAINDERS}, not {shown(self.remainder)}")
        _check_buckets_and_filters(self)
        _check_sync(self)
        if self.step_batches is not None:
            object.__setattr__(
                self, "step_batches", integer("step_batches", self.step_batches, 1, MAX_STEP_BATCHES)
            )

    @property
    def bucketed(self) -> bool:
        """Whether batches form within duration buckets (and the batch order is shuffled)."""
        return self.num_buckets is not None or self.duration_bins is not None

    @property
    def synchronised(self) -> bool:
        """Whether every step's batches come from one bucket, at nearly equal cost (``sync_buckets``)."""
        return self.sync_buckets is True or (self.bucketed and self.sync_buckets is None)

    @property
    def filters(self) -> bool:
        """Whether some samples may be left out: a duration filter, or ``max_duration`` (a sample alone above
        it)."""
        return (
            self.max_duration is not None
            or self.min_duration is not None
            or self.max_sample_duration is not None
        )

    @property
    def padded_cost(self) -> bool:
        """Whether a batch costs its padded seconds (count x longest): no quadratic cost, no
        ``batch_cost``."""
        return self.quadratic_duration is None and self.batch_cost is None

    def accumulation(self, world_size: int) -> int | None:
        """Batches each of ``world_size`` ranks accumulates per optimizer step: ``step_batches / world_size``.

        Args:
            world_size: The number of ranks.

        Returns:
            ``step_batches // world_size``; ``None`` without ``step_batches``.

        Raises:
            OptionError: ``world_size`` does not divide ``step_batches``, naming both.
        """
        if self.step_batches is None:
            return None
        if world_size < 1 or self.step_batches % world_size:
            raise OptionError(
                f"step_batches={self.step_batches} batches per optimizer step cannot be shared by "
                f"{world_size} ranks: the number of ranks must divide step_batches (every rank accumulates "
                "step_batches / ranks batches per step)"
            )
        return self.step_batches // world_size

    def eligible(self, durations: np.ndarray) -> np.ndarray:
        """Which samples can be planned: within the duration filters, and alone within `max_duration`.

        Args:
            durations: Each sample's duration in seconds.

        Returns:
            A boolean array, `True` where the sample can be planned.
        """
        return eligible(durations, self)


def _check_buckets_and_filters(b: Batching) -> None:
    """Raise :class:`OptionError` for bucketing, cost and filter options that cannot work (and store
    ``duration_bins`` as a tuple of floats)."""
    if b.num_buckets is not None and b.duration_bins is not None:
        raise OptionError("give num_buckets or duration_bins, not both")
    if b.num_buckets is not None:
        object.__setattr__(b, "num_buckets", integer("num_buckets", b.num_buckets, 1, MAX_BUCKETS))
    if b.duration_bins is not None:
        if isinstance(b.duration_bins, (str, bytes, Mapping)) or not isinstance(b.duration_bins, Iterable):
            raise OptionError(
                f"duration_bins must be a sequence of bucket edges in seconds, not {shown(b.duration_bins)}"
            )
        edges = list(itertools.islice(b.duration_bins, MAX_BUCKETS))  # no more read
        for edge in edges:
            real("duration_bins", edge, f"positive, finite numbers of seconds (an edge is {shown(edge)})")
        if not edges:
            raise OptionError(
                "duration_bins is empty: give at least one bucket edge in seconds, or num_buckets=1 "
                "for a single bucket"
            )
        bins = tuple(float(edge) for edge in edges)
        if len(bins) >= MAX_BUCKETS:
            raise OptionError(
                f"duration_bins holds {MAX_BUCKETS} edges or more; at most {MAX_BUCKETS - 1} "
                f"({MAX_BUCKETS} buckets)"
            )
        if any(not (e > 0 and np.isfinite(e)) for e in bins) or any(e >= f for e, f in zip(bins, bins[1:])):
            raise OptionError(
                f"duration_bins must be positive, finite and strictly increasing, not {reprlib.repr(bins)}"
            )
        object.__setattr__(b, "duration_bins", bins)
    if b.quadratic_duration is not None:
        quadratic = real("quadratic_duration", b.quadratic_duration, "a positive, finite number")
        object.__setattr__(b, "quadratic_duration", quadratic)
        if not b.quadratic_duration > 0:  # finite: real() saw to it
            raise OptionError(
                f"quadratic_duration must be a positive, finite number, not {b.quadratic_duration}"
            )
        if b.max_duration is None:
            raise OptionError("quadratic_duration weighs samples toward max_duration: give max_duration too")
    for name in ("min_duration", "max_sample_duration"):
        value = getattr(b, name)
        if value is not None:
            value = real(name, value, "a non-negative, finite number of seconds")
            object.__setattr__(b, name, value)
            if not value >= 0:
                raise OptionError(f"{name} must be a non-negative number of seconds, not {value}")
    if (
        b.min_duration is not None
        and b.max_sample_duration is not None
        and b.min_duration > b.max_sample_duration
    ):
        raise OptionError(
            f"min_duration ({b.min_duration}) is above max_sample_duration "
            f"({b.max_sample_duration}): every sample would be left out"
        )


def _check_sync(b: Batching) -> None:
    if b.sync_buckets is not None and not isinstance(
        b.sync_buckets, (bool, np.bool_)
    ):  # 1 == True: not in (...)
        raise OptionError(
            f"sync_buckets must be True, False or None (on when bucketing), not {shown(b.sync_buckets)}"
        )
    if b.sync_buckets is not None:
        object.__setattr__(b, "sync_buckets", bool(b.sync_buckets))
    if b.batch_cost is not None and not callable(b.batch_cost):
        raise OptionError(f"batch_cost must be a function of a batch's durations, not {b.batch_cost!r}")
    if (b.batch_cost is None) != (b.batch_cost_name is None):
        raise OptionError(
            "give batch_cost and batch_cost_name together: a state records the cost by its name"
        )
    if b.batch_cost_name is not None and not (isinstance(b.batch_cost_name, str) and b.batch_cost_name):
        raise OptionError(f"batch_cost_name must be a non-empty string, not {b.batch_cost_name!r}")
    if b.batch_cost is not None and not b.synchronised:
        raise OptionError(
            "batch_cost balances step-synchronised batches: it needs sync_buckets on (the default "
            "with num_buckets or duration_bins)"
        )


def check_options(batching: object, ordering: object, mixed: bool = False) -> None:
    """An :class:`OptionError` unless ``batching`` is a :class:`Batching` and ``ordering`` an
    :class:`Ordering` (their own constructors check their fields) that work together (and in a mix, where
    ``mixed``)."""
    if not isinstance(batching, Batching):
        raise OptionError(f"batching must be a shardio.Batching, not {shown(batching)}")
    if not isinstance(ordering, Ordering):
        raise OptionError(f"ordering must be a shardio.Ordering, not {shown(ordering)}")
    if ordering.node_stable and batching.step_batches is not None:
        raise OptionError(
            f"Ordering(node_stable=True) and Batching(step_batches={batching.step_batches}) cannot work "
            "together: step_batches plans the same optimizer steps on any number of ranks, while a node's "
            "part of the corpus depends on the number of nodes; give one of them"
        )
    if ordering.node_stable and mixed:
        raise OptionError(
            "Ordering(node_stable=True) is not available in a mix (MixedDataset): a mix draws every "
            "corpus's passes over the whole world; give node_stable to a ShardDataset"
        )
