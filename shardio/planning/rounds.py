"""One batching pass over a segment (:func:`batch_segment`), its step-synchronised rounds, and the deal to
ranks.

:func:`batch_segment` runs the pass in one place: samples filtered, grouped by (window, bucket), batched
(:mod:`shardio.planning.batches`), ordered in rounds, dealt (:func:`deal`) and reported. With
``Batching.sync_buckets`` every step gives all ranks batches of one bucket and of nearly equal cost. DDP waits
for the slowest rank at every step, so a step costs the *most* expensive of its ``world_size`` batches. The
deal (:func:`deal`) gives round ``j`` (batches ``j * world_size`` to ``j * world_size + world_size - 1``) one
batch per rank; with ``Batching.sync_buckets`` the planner orders the batches so that every round is made of
batches of the same bucket and of nearly equal cost (the idea of Lhotse's ``sync_buckets``: all ranks draw the
same bucket at a step). Pure numpy, as the planner:

1. **Compaction** (:func:`compact`): batching within (shard window, bucket) groups leaves a partly filled
   batch at the end of every group, of any cost. Their samples are pooled and batched again per bucket
   (across windows), so nearly every batch is full and batches of one bucket cost nearly the same.
2. **Rounds** (:func:`synchronised_order`): each bucket's batches, in window order (shuffled within a
   window), are cut into chunks of ``CHUNK_ROUNDS * world_size``; a chunk is sorted by cost and cut into
   rounds of ``world_size``, so a round holds batches of neighbouring cost. A bucket's last, partial round
   (its cheapest batches) goes to a pool kept in bucket order and cut into rounds too: such a round spans
   neighbouring buckets (there are at most as many such rounds as buckets). Full rounds are shuffled within
   their window (the last window any of their batches comes from) and keep window order; pooled rounds come
   last, so the epoch's last partial round (padded or dropped by ``remainder``) is made of leftovers.

The cost of a batch is the cost model in use: padded seconds (``count x longest``), with
``quadratic_duration`` the quadratic ``count x (d + d**2 / Q)`` of the longest ``d``, or the user's
``batch_cost(durations)``. Reads stay local within a batch; consecutive steps of a rank may move between
shard windows as far as a bucket's chunk reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .batches import (
    batch_audio,
    batch_costs,
    batch_offsets,
    eligible,
    group_starts,
    padding_of,
    reorder_batches,
    shuffle_batches,
    underfull,
)
from .options import Batching
from .stablesort import radix_order

__all__ = [
    "CHUNK_ROUNDS",
    "Grouping",
    "Segmented",
    "batch_costs",
    "underfull",
    "compact",
    "synchronised_order",
    "step_efficiency",
    "deal",
    "balance",
    "Formed",
    "form_batches",
    "batch_segment",
]

CHUNK_ROUNDS = 2
"""Rounds of one bucket sorted by cost together: more balances better, fewer keeps a rank's reads nearer."""


def compact(
    order: np.ndarray, offsets: np.ndarray, durations: np.ndarray, buckets: np.ndarray, batching: Batching
) -> tuple[np.ndarray, np.ndarray]:
    """Batch the samples of underfull batches again, per bucket: ``(order, offsets)`` with the full batches
    first, as they were, then the new ones. ``durations`` and ``buckets`` are per id."""
    partial = underfull(durations[order], offsets, batching)
    if int(partial.sum()) < 2:
        return order, offsets
    pooled = np.repeat(partial, np.diff(offsets))
    kept_offsets = np.cumsum(np.concatenate([[0], np.diff(offsets)[~partial]])).astype(np.int64)
    loose = order[pooled]
    loose = loose[radix_order(buckets[loose])]  # stable: window order is kept within a bucket
    loose_offsets = batch_offsets(durations[loose], batching, group_starts(buckets[loose]))
    new_order = np.concatenate([order[~pooled], loose])
    return new_order, np.concatenate([kept_offsets[:-1], kept_offsets[-1] + loose_offsets]).astype(np.int64)


def synchronised_order(
    windows: np.ndarray,
    buckets: np.ndarray,
    costs: np.ndarray,
    world_size: int,
    generator: np.random.Generator | None,
) -> np.ndarray:
    """A batch order in which every ``world_size`` consecutive batches (a round) are of one bucket and of
    neighbouring cost, except the pooled leftover rounds at the end (see the module docs).

    Per batch: ``windows`` (its shard window), ``buckets`` and ``costs``. ``generator`` shuffles batches
    within a window and rounds within a window; ``None`` keeps them in order.
    """
    n = costs.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ties = _ties(n, generator)
    by_bucket = np.lexsort((ties, windows, buckets))
    sorted_buckets = buckets[by_bucket]
    first = np.flatnonzero(group_starts(sorted_buckets))
    counts = np.diff(np.append(first, n))
    position = np.arange(n) - np.repeat(first, counts)  # position within the bucket
    chunk = position // (CHUNK_ROUNDS * world_size)
    # Within a (bucket, chunk), most costly first: a bucket's partial round takes its cheapest batches. The
    # (bucket, chunk) runs stay in place, so slot i keeps its position within the bucket.
    ranked = by_bucket[np.lexsort((position, -costs[by_bucket], chunk, sorted_buckets))]
    full = position < np.repeat(counts // world_size * world_size, counts)
    rounds = ranked[full].reshape(-1, world_size)
    # Full rounds are played at the last window any of their batches comes from, shuffled within it.
    round_windows = windows[rounds].max(axis=1)
    played = rounds[np.lexsort((_ties(rounds.shape[0], generator), round_windows))]
    leftovers = ranked[~full]
    # Leftovers by bucket, so a pooled round spans neighbouring buckets (of similar lengths: balanced under
    # any cost that grows with length, not only the one in use); most costly first within a bucket.
    leftovers = leftovers[np.lexsort((np.arange(leftovers.shape[0]), -costs[leftovers], buckets[leftovers]))]
    return np.concatenate([played.ravel(), leftovers]).astype(np.int64)


def step_efficiency(costs: np.ndarray) -> float:
    """Mean over steps of (mean rank cost / max rank cost), from ``costs[rank, step]`` (1.0 without steps):
    the share of a step that ranks spend working rather than waiting for the slowest."""
    if costs.size == 0:
        return 1.0
    most = costs.max(axis=0)
    ratio = np.divide(costs.mean(axis=0), most, out=np.ones(costs.shape[1]), where=most > 0)
    return round(float(ratio.mean()), 6)


def _ties(n: int, generator: np.random.Generator | None) -> np.ndarray:
    """Random tie-breakers (or the identity order without a generator)."""
    return np.asarray(generator.random(n)) if generator is not None else np.arange(n, dtype=np.float64)


def deal(
    num_batches: int,
    world_size: int,
    remainder: str,
    seconds: np.ndarray | None = None,
    per_rank: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Global batch numbers per rank, ``[world_size, per_rank]``, and the batch numbers left out.

    Round ``j`` (batches ``j * world_size`` to ``j * world_size + world_size - 1``) gives one batch to each
    rank. Given each batch's audio ``seconds``, a round's batches go longest first to the ranks with the
    least audio so far, so the ranks' audio totals stay within about one batch of each other over an
    epoch (a loop over rounds, not samples); without it, batch ``j * world_size + r`` goes to rank ``r``.
    ``per_rank``: that many batches per rank (repeating from the start, or leaving out the last), instead
    of those ``remainder`` makes of ``num_batches`` (at least one batch, then).
    """
    if per_rank is None:
        per_rank = num_batches // world_size if remainder == "drop" else -(-num_batches // world_size)
    used = per_rank * world_size
    if used <= num_batches:
        chosen = np.arange(used, dtype=np.int64)
    else:
        chosen = np.concatenate([np.arange(num_batches), np.arange(used - num_batches) % num_batches])
    left_out = np.arange(used, num_batches, dtype=np.int64)
    rounds = chosen.reshape(per_rank, world_size)
    if seconds is not None and world_size > 1 and per_rank > 0:
        rounds = balance(rounds, seconds[rounds])
    return rounds.T.copy(), left_out


def balance(rounds: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """``rounds`` (``[rounds, ranks]``, with each entry's ``seconds``) with each round's entries permuted
    so that column ``r`` is rank ``r``'s: longest first to the ranks with the least seconds so far, so the
    ranks' totals stay within about one entry of each other (a loop over rounds, not entries)."""
    count, world_size = rounds.shape
    by_length = np.argsort(-seconds, axis=1, kind="stable")
    longest_first = np.take_along_axis(rounds, by_length, axis=1)
    ordered_seconds = np.take_along_axis(seconds, by_length, axis=1).tolist()
    totals = [0.0] * world_size
    ranks = list(range(world_size))
    receivers = []
    for round_seconds in ordered_seconds:
        ranks.sort(key=totals.__getitem__)  # stable: ties keep the previous order
        for rank, batch_seconds in zip(ranks, round_seconds):
            totals[rank] += batch_seconds
        receivers.append(list(ranks))
    dealt = np.empty_like(rounds)
    dealt[np.arange(count)[:, None], np.array(receivers, dtype=np.int64).reshape(count, world_size)] = (
        longest_first
    )
    return dealt


@dataclass(frozen=True)
class Grouping:
    """How a segment's samples group: per id its shard window and bucket, and the batch shuffle."""

    windows: np.ndarray  # per id: its window (batches never span windows; batch order shuffles within)
    buckets: np.ndarray  # per id: its bucket key (batches never span buckets)
    generator: np.random.Generator | None  # shuffles batches within windows; None keeps them in order


class Segmented(NamedTuple):
    """A segment planned for all ranks: the fields of :class:`~shardio.planning.plan.EpochPlan`, in its
    order."""

    samples: np.ndarray
    offsets: np.ndarray
    rank_batches: np.ndarray
    excluded: int
    dropped: int
    padded: int
    report: dict[str, Any]


class Formed(NamedTuple):
    """A segment's batches before the deal: ``order`` and ``offsets`` (batch ``b`` is
    ``order[offsets[b]:offsets[b + 1]]``), per batch its ``costs`` and seconds of ``audio``, the samples the
    filters ``excluded`` and the report so far."""

    order: np.ndarray
    offsets: np.ndarray
    costs: np.ndarray
    audio: np.ndarray
    excluded: int
    report: dict[str, Any]


def form_batches(
    order: np.ndarray,
    durations: np.ndarray,
    batching: Batching,
    world_size: int,
    grouping: Grouping | None = None,
    limit: int | None = None,
) -> Formed:
    """The batches of one batching pass over a segment's samples in ``order``: filtered, grouped, batched
    and ordered in rounds of ``world_size`` (see :mod:`shardio.planning.plan`); ``limit``: exactly that many
    batches."""
    seconds = durations[order]  # per position: gathered once for every step that needs it
    excluded = 0
    if batching.filters:
        fits = eligible(seconds, batching)
        excluded = int(order.shape[0] - fits.sum())
        order, seconds = (order[fits], seconds[fits]) if excluded else (order, seconds)
        del fits
    starts = None
    if grouping is not None:
        runs = np.cumsum(group_starts(grouping.windows[order])) - 1  # windows arrive in runs
        key = runs * (int(grouping.buckets.max(initial=0)) + 1) + grouping.buckets[order]
        sort = radix_order(key)
        order, seconds, starts = order[sort], seconds[sort], group_starts(key[sort])
    offsets = batch_offsets(seconds, batching, starts)
    costs = None
    if grouping is not None and offsets.shape[0] > 1:
        if batching.synchronised:
            order, offsets = compact(order, offsets, durations, grouping.buckets, batching)
            first = order[offsets[:-1]]
            costs = batch_costs(durations[order], offsets, batching)
            perm = synchronised_order(
                grouping.windows[first], grouping.buckets[first], costs, world_size, grouping.generator
            )
            costs = costs[perm]
        else:
            perm = shuffle_batches(grouping.windows[order[offsets[:-1]]], grouping.generator)
        order, offsets = reorder_batches(order, offsets, perm)
        seconds = durations[order]
    audio, padded_seconds = batch_audio(seconds, offsets)
    if costs is None:
        costs = padded_seconds if batching.padded_cost else batch_costs(seconds, offsets, batching)
    del seconds
    report: dict[str, Any] = {"padding_ratio": round(padding_of(audio, padded_seconds), 6)}
    num_batches = offsets.shape[0] - 1
    if limit is not None and num_batches:
        # An epoch of `limit` batches: cut the plan there, or fill it by repeating batches from the start.
        kept = int(offsets[min(limit, num_batches)])
        report.update(skipped=int(order.shape[0]) - kept, repeated=0)
        kept_batches = np.arange(limit, dtype=np.int64) % num_batches
        order, offsets = reorder_batches(order, offsets, kept_batches)
        report["repeated"], costs = max(0, int(order.shape[0]) - kept), costs[kept_batches]
        audio = audio[kept_batches]
    return Formed(order, offsets, costs, audio, excluded, report)


def batch_segment(
    order: np.ndarray,
    durations: np.ndarray,
    batching: Batching,
    world_size: int,
    grouping: Grouping | None = None,
    limit: int | None = None,
) -> Segmented:
    """One batching pass over a segment's samples in ``order`` (:func:`form_batches`), dealt to
    ``world_size`` ranks (:func:`deal`) and reported; ``limit``: exactly that many batches."""
    order, offsets, costs, audio, excluded, report = form_batches(
        order, durations, batching, world_size, grouping, limit
    )
    num_batches = offsets.shape[0] - 1
    if num_batches == 0:
        return Segmented(order, offsets, np.zeros((world_size, 0), np.int64), excluded, 0, 0, report)
    rank_batches, left_out = deal(num_batches, world_size, batching.remainder, audio)
    sizes = np.diff(offsets)
    dropped = int(sizes[left_out].sum())
    padded = int(sizes[rank_batches.ravel()].sum() - sizes.sum() + dropped)
    report["step_efficiency"] = step_efficiency(costs[rank_batches])
    return Segmented(
        order, offsets, rank_batches, excluded=excluded, dropped=dropped, padded=padded, report=report
    )
