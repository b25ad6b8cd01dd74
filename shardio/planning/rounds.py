"""Step-synchronised rounds: at every step all ranks get batches of one bucket and of nearly equal cost.

DDP waits for the slowest rank at every step, so a step costs the *most* expensive of its ``world_size``
batches. The deal (:func:`shardio.planning.plan.deal`) gives round ``j`` (batches ``j * world_size`` to
``j * world_size + world_size - 1``) one batch per rank; with ``Batching.sync_buckets`` the planner orders
the batches so that every round is made of batches of the same bucket and of nearly equal cost (the idea
of Lhotse's ``sync_buckets``: all ranks draw the same bucket at a step). Pure numpy, as the planner:

1. **Compaction** (:func:`compact`): batching within (shard window, bucket) groups leaves a partly filled
   batch at the end of every group, of any cost. Their samples are pooled and batched again per bucket
   (across windows), so nearly every batch is full and batches of one bucket cost nearly the same.
2. **Rounds** (:func:`synchronised_order`): each bucket's batches, in window order (shuffled within a
   window), are cut into chunks of ``CHUNK_ROUNDS * world_size``; a chunk is sorted by cost and cut into
   rounds of ``world_size``, so a round holds batches of neighbouring cost. A bucket's last, partial round
   (its cheapest batches) goes to a pool kept in bucket order and cut into rounds too: such a round spans
   neighbouring buckets (there are at most as many such rounds as buckets). Full rounds are shuffled within their
   window (the last window any of their batches comes from) and keep window order; pooled rounds come last,
   so the epoch's last partial round (padded or dropped by ``remainder``) is made of leftovers.

The cost of a batch is the cost model in use: padded seconds (``count x longest``), with
``quadratic_duration`` the quadratic ``count x (d + d**2 / Q)`` of the longest ``d``, or the user's
``batch_cost(durations)``. Reads stay local within a batch; consecutive steps of a rank may move between
shard windows as far as a bucket's chunk reaches.
"""

from __future__ import annotations

import numpy as np

from ..errors import OptionError
from .bucketing import batch_audio, batch_offsets, group_starts, stable_order
from .options import Batching, sample_cost

__all__ = ["CHUNK_ROUNDS", "batch_costs", "underfull", "compact", "synchronised_order", "step_efficiency"]

CHUNK_ROUNDS = 2
"""Rounds of one bucket sorted by cost together: more balances better, fewer keeps a rank's reads nearer."""


def batch_costs(durations: np.ndarray, offsets: np.ndarray, batching: Batching) -> np.ndarray:
    """Each batch's cost under ``batching``'s cost model; ``durations`` in batched order."""
    if offsets.shape[0] < 2:
        return np.zeros(0)
    if batching.batch_cost is not None:
        costs = np.array([float(batching.batch_cost(durations[offsets[b]:offsets[b + 1]]))
                          for b in range(offsets.shape[0] - 1)], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(costs) | (costs < 0))
        if bad.shape[0]:
            raise OptionError(f"batch_cost {batching.batch_cost_name!r} returned {costs[bad[0]]} for a batch of "
                              f"{int(offsets[bad[0] + 1] - offsets[bad[0]])} samples: it must return a finite, "
                              "non-negative number")
        return costs
    if batching.quadratic_duration is None:
        return batch_audio(durations, offsets)[1]
    longest = np.maximum.reduceat(sample_cost(durations, batching.quadratic_duration), offsets[:-1])
    return longest * np.diff(offsets)


def underfull(durations: np.ndarray, offsets: np.ndarray, batching: Batching) -> np.ndarray:
    """Per batch: whether one more sample as costly as its longest would still fit (``durations`` in
    batched order)."""
    sizes = np.diff(offsets)
    if batching.max_duration is None:
        return sizes < (batching.batch_size or 1)
    longest = np.maximum.reduceat(sample_cost(durations, batching.quadratic_duration), offsets[:-1])
    fits = (sizes + 1) * longest <= batching.max_duration * (1 + 1e-9)
    return fits & (sizes < (batching.max_batch_size or np.iinfo(np.int64).max))


def compact(order: np.ndarray, offsets: np.ndarray, durations: np.ndarray, buckets: np.ndarray,
            batching: Batching) -> tuple[np.ndarray, np.ndarray]:
    """Batch the samples of underfull batches again, per bucket: ``(order, offsets)`` with the full batches
    first, as they were, then the new ones. ``durations`` and ``buckets`` are per id."""
    partial = underfull(durations[order], offsets, batching)
    if int(partial.sum()) < 2:
        return order, offsets
    pooled = np.repeat(partial, np.diff(offsets))
    kept_offsets = np.cumsum(np.concatenate([[0], np.diff(offsets)[~partial]])).astype(np.int64)
    loose = order[pooled]
    loose = loose[stable_order(buckets[loose])]  # stable: window order is kept within a bucket
    loose_offsets = batch_offsets(durations[loose], batching, group_starts(buckets[loose]))
    new_order = np.concatenate([order[~pooled], loose])
    return new_order, np.concatenate([kept_offsets[:-1], kept_offsets[-1] + loose_offsets]).astype(np.int64)


def synchronised_order(windows: np.ndarray, buckets: np.ndarray, costs: np.ndarray, world_size: int,
                       generator: np.random.Generator | None) -> np.ndarray:
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
