"""The planner: pure functions from index metadata to every rank's batches for one epoch.

No I/O and no torch. Given per-sample shard ids and durations, ``seed``, ``epoch``, the world size and the
batching options, :func:`plan_epoch` decides the epoch order, the batches and which rank gets which batch.
Every rank computes the same global plan independently, so ranks agree without any communication.

The steps:

1. **Order** (:mod:`shardio.planning.order`): shards are permuted per epoch, then samples are shuffled
   within windows of ``shuffle_shards`` consecutive shards (reads stay local to a few shards at a time).
Steps 2 and 3 are one batching pass over a segment, run in one place
(:func:`shardio.planning.rounds.batch_segment`, with the batches' arithmetic in
:mod:`shardio.planning.batches`):

2. **Batches** (:func:`~shardio.planning.batches.batch_offsets`): consecutive samples of that order form
   batches, of a fixed ``batch_size`` or greedily up to ``max_duration`` padded seconds (count x longest
   sample's cost).
   With bucketing (``num_buckets`` or ``duration_bins``) each window's samples are first sorted by
   duration bucket (:mod:`shardio.planning.bucketing`), batches form within a bucket, and the batch order is
   shuffled within each window; with ``sync_buckets`` (the default when bucketing) the batches are instead
   ordered in rounds of ``world_size`` of one bucket and nearly equal cost (:mod:`shardio.planning.rounds`).
   Samples outside ``[min_duration, max_sample_duration]`` are left out.
3. **Deal** (:func:`~shardio.planning.rounds.deal`): batch ``j * world_size + r`` goes to rank ``r``. The
   last partial round is padded by repeating batches from the start of the epoch, or dropped (``remainder``);
   so every rank has exactly the same number of batches, by construction.

An elastic resume (a different world size mid-epoch) is a new *segment*: the samples that no rank has
consumed yet are batched and dealt again over the new world (:func:`plan_epoch` with ``history``).

Randomness comes from ``numpy.random.default_rng((seed, epoch, purpose))``: a function of the tuple,
never of ``seed + epoch`` and never a mutated counter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, fields, replace
from typing import Any

import numpy as np

from ..checks.options import integer
from ..checks.planargs import columns_of, epoch_of, seed_of, segments_of, world_size_of
from ..errors import OptionError
from . import bucketing, rounds, steps
from . import nodes as nodeplans
from .epochplan import EpochPlan, Segment
from .options import Batching, Ordering, check_options
from .order import BATCHES, narrow_window_order, rng

__all__ = [
    "Batching",
    "Ordering",
    "Segment",
    "EpochPlan",
    "plan_epoch",
    "plan_segments",
    "worker_batches",
    "options_of",
]


NodeSegment = Callable[[int, np.ndarray, int, int], "rounds.Segmented"]
"""``node_segment(number, ids, world_size, nodes)``: a segment planned node by node."""


def plan_segments(
    order: np.ndarray,
    durations: np.ndarray,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    batching: Batching,
    history: Sequence[Segment] = (),
    windows: np.ndarray | None = None,
    buckets: np.ndarray | None = None,
    shuffle: bool = True,
    purpose: tuple[int, ...] = (),
    limit: int | None = None,
    exclude: Sequence[tuple[int, np.ndarray]] = (),
    nodes: int = 1,
    node_segment: NodeSegment | None = None,
) -> EpochPlan:
    """Plan an explicit ``order`` of distinct ids (into ``durations``): the core of every planner.

    Each segment of ``history`` is re-planned as it was played and the samples it consumed are taken out
    of ``order``; the rest is planned for ``world_size``. With ``windows`` and ``buckets`` (per id), the
    order is sorted by (window, bucket) — stably, so the order within a bucket is kept —, batches form
    within buckets and, with ``shuffle``, the batch order is shuffled within windows by
    ``rng(seed, epoch, *purpose, 3, segment)``. ``limit``: the first segment has exactly that many batches
    (cut, or filled by repeating), and later segments plan only what it held. ``exclude``: pairs
    ``(segment number, ids)``; those ids are taken out of ``order`` before that segment is planned (a
    quarantine at resume, :mod:`shardio.ledger.quarantine`), so that segment and every later one leave them
    out. ``nodes``: the current segment's nodes; a segment on more than one node
    (``Ordering(node_stable=True)``) is planned by ``node_segment(number, ids, world_size, nodes)``
    (:mod:`shardio.planning.nodes`).
    """
    # no rank to deal to is a division by zero (or a silent empty plan), too many an unbounded allocation
    world_size = world_size_of(world_size)
    history = [Segment(*finished) for finished in segments_of(history)]

    def grouping(number: int) -> rounds.Grouping | None:
        if windows is None or buckets is None:
            return None
        generator = rng(seed, epoch, *purpose, BATCHES, number) if shuffle else None
        return rounds.Grouping(windows, buckets, generator)

    def segment(number: int, ids: np.ndarray, size: int, nodes: int = 1) -> EpochPlan:
        if nodes > 1:
            if node_segment is None:
                raise OptionError(f"a segment on {nodes} nodes needs Ordering(node_stable=True)")
            return EpochPlan(*node_segment(number, ids, size, nodes))
        return EpochPlan(
            *rounds.batch_segment(
                ids, durations, batching, size, grouping(number), limit if number == 0 else None
            )
        )

    def segment_formed(number: int, ids: np.ndarray) -> rounds.Formed:
        size = batching.step_batches or 1
        return rounds.form_batches(
            ids, durations, batching, size, grouping(number), limit if number == 0 else None
        )

    def excluding(number: int, ids: np.ndarray) -> np.ndarray:
        for at, gone in exclude:
            if at == number:
                mask = np.zeros(durations.shape[0], dtype=bool)
                mask[np.asarray(gone, dtype=np.int64)] = True
                ids = ids[~mask[ids]]
        return ids

    if batching.step_batches is not None:
        if nodes > 1 or any(finished.nodes > 1 for finished in history):
            raise OptionError("step_batches cannot plan a segment on several nodes (node_stable)")
        split = steps.plan_steps(
            order,
            durations.shape[0],
            step_batches=batching.step_batches,
            remainder=batching.remainder,
            world_size=world_size,
            history=[(finished.world_size, finished.consumed) for finished in history],
            form=segment_formed,
            exclude=exclude,
            limited=limit is not None,
        )
        return EpochPlan(*split.segmented(), split.accumulation, split.earlier)
    for number, finished in enumerate(history):
        order = excluding(number, order)
        plan = segment(number, order, finished.world_size, finished.nodes)
        if not 0 <= finished.consumed <= plan.num_batches:
            raise OptionError(
                f"a segment consumed {finished.consumed} batches of a plan with {plan.num_batches}"
            )
        if number == 0 and limit is not None:
            held = np.zeros(durations.shape[0], dtype=bool)
            held[plan.samples] = True
            order = order[held[order]]
        done = np.zeros(durations.shape[0], dtype=bool)
        done[plan.consumed_samples(finished.consumed)] = True
        order = order[~done[order]]
    return segment(len(history), excluding(len(history), order), world_size, nodes)


def plan_epoch(
    shard_ids: np.ndarray,
    durations: np.ndarray,
    num_shards: int,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    batching: Batching = Batching(),
    ordering: Ordering = Ordering(),
    history: Sequence[Segment] = (),
    exclude: Sequence[tuple[int, np.ndarray]] = (),
    nodes: int = 1,
) -> EpochPlan:
    """The plan of an epoch's next segment for every rank, after its finished segments (O(samples)).

    Args:
        shard_ids: Each sample's shard number (an index's `shard_ids`).
        durations: Each sample's duration in seconds.
        num_shards: How many shards there are.
        seed: The shuffle's seed (non-negative).
        epoch: The epoch to plan.
        world_size: The ranks to deal batches to.
        batching: How samples form batches.
        ordering: How the epoch's samples are ordered.
        history: The finished segments, oldest first: what they did not consume is planned again.
        exclude: `(segment, sample ids)` pairs: those samples are left out from that segment on.
        nodes: The nodes of the `world_size` ranks (contiguous blocks of `world_size / nodes`), with
            `ordering.node_stable`: each node plays its part of the corpus (:mod:`shardio.planning.nodes`).

    Raises:
        OptionError: A seed, epoch, world size, history, options or columns that are not one (each named,
            with its bounds), a history beyond the plan, nodes without `node_stable` or that do not divide
            the world size.
    """
    seed, epoch, world_size = seed_of(seed), epoch_of(epoch), world_size_of(world_size)
    history = [Segment(*finished) for finished in segments_of(history)]
    nodes = integer("nodes", nodes, 1, world_size)
    check_options(batching, ordering)
    if not ordering.node_stable and (nodes > 1 or any(finished.nodes > 1 for finished in history)):
        raise OptionError(f"a plan on {nodes} nodes needs Ordering(node_stable=True)")
    num_shards = columns_of(shard_ids, durations, num_shards)
    order, by_window = narrow_window_order(shard_ids, num_shards, ordering, (seed, epoch))
    buckets, extra = None, {}
    if batching.bucketed:
        edges = bucketing.bucket_edges(durations, batching)
        buckets, extra = bucketing.bucket_of(durations, edges), {"bucket_edges": edges.round(6).tolist()}
    elif batching.synchronised:
        buckets = np.zeros(durations.shape[0], dtype=np.int64)  # one bucket: steps balance cost only
    windows = by_window.astype(np.int64) if buckets is not None else None
    del by_window  # without buckets, freed before the segments are planned

    def node_segment(number: int, ids: np.ndarray, size: int, on: int) -> rounds.Segmented:
        return nodeplans.plan_node_segment(
            ids,
            shard_ids,
            durations,
            num_shards,
            seed=seed,
            epoch=epoch,
            number=number,
            world_size=size,
            nodes=on,
            batching=batching,
            ordering=ordering,
            buckets=buckets,
        )

    plan = plan_segments(
        order,
        durations,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        history=history,
        windows=windows,
        buckets=buckets,
        shuffle=ordering.shuffle,
        exclude=exclude,
        nodes=nodes,
        node_segment=node_segment if ordering.node_stable else None,
    )
    return with_report(plan, samples=int(shard_ids.shape[0]), **extra)


def with_report(plan: EpochPlan, **extra: Any) -> EpochPlan:
    """``plan`` with its report filled in: the counts and the padding ratio, plus ``extra`` entries."""
    report = {
        "samples": int(plan.samples.shape[0]),
        "planned": int(plan.samples.shape[0]),
        "batches_per_rank": plan.num_batches,
        "excluded": plan.excluded,
        "dropped": plan.dropped,
        "padded": plan.padded,
        **plan.report,
        **extra,
    }
    return replace(plan, report=report)


def worker_batches(num_batches: int, start: int, worker: int, num_workers: int) -> range:
    """The rank batches a DataLoader worker produces when iteration starts at batch ``start``.

    Worker ``w`` takes batches ``start + w``, ``start + w + num_workers``, ...: the DataLoader asks its
    workers in turn from worker 0, so the batches reach the trainer in plan order for any worker count.
    """
    return range(start + worker, num_batches, num_workers)


def options_of(batching: Batching, ordering: Ordering) -> dict[str, object]:
    """The options that shape a plan, as a JSON-ready dict (recorded in a state): the JSON round trip of
    the result compares equal to it (tuples become lists)."""
    options: dict[str, object] = {
        f.name: getattr(batching, f.name)
        for f in fields(batching)
        if f.name not in ("batch_cost", "batch_cost_name", "sync_buckets", "step_batches")
    }
    options.update(asdict(ordering))
    if not ordering.node_stable:  # recorded only when on: states saved without it load unchanged
        del options["node_stable"]
    if batching.duration_bins is not None:
        options["duration_bins"] = list(batching.duration_bins)
    # Recorded only when on, so a state saved before sync_buckets existed loads where the plan is the one it
    # was saved under (no buckets, or sync_buckets=False) and is refused where it changed (synchronised).
    if batching.synchronised:
        options["sync_buckets"] = True
    if batching.batch_cost_name is not None:
        options["batch_cost"] = batching.batch_cost_name
    if batching.step_batches is not None:  # recorded only when set: states saved without it load unchanged
        options["step_batches"] = batching.step_batches
    return options
