"""A node-stable segment (``Ordering(node_stable=True)``): each node's part planned for its own ranks, then
the nodes' batches lined up into the world's rounds.

Ranks are in contiguous blocks of ``R = world_size / nodes`` per node (torchrun's convention): node ``n``
holds ranks ``n * R`` to ``n * R + R - 1``. Each node's part of the segment's samples
(:mod:`shardio.planning.parts`) is batched by one batching pass for its ``R`` ranks
(:func:`~shardio.planning.rounds.form_batches`), so a node's batches hold only its part. Then:

1. **Alignment** (:func:`aligned`, with ``sync_buckets``): a world round takes one round of ``R`` batches
   from every node, so its batches must be of one bucket on every node. The ``k``-th round of bucket ``b``
   of every node form step ``k`` of bucket ``b``, for as many steps as the node with the fewest such rounds
   has, paired most costly first within chunks of :data:`PAIR_ROUNDS`; the steps are played in the order of
   their rounds' mean place in their nodes (ties shuffled). A node's underfull batches (each bucket's last,
   one per bucket and node) count as one bucket of their own, so that they line up with each other, by cost,
   not with full batches. A node's other batches (its bucket's extra rounds, its rounds that span buckets)
   come last, by bucket and most costly first, as the pooled leftovers of :mod:`shardio.planning.rounds`
   do.
2. **Deal** (:func:`~shardio.planning.rounds.deal`): every node's rounds go to its ranks, with the same
   number of batches per rank on every node: with ``remainder="pad"`` the most any node has (a node with
   fewer repeats its own batches from its start), with ``"drop"`` the fewest (a node with more drops its
   last ones; a node whose part has run out, after a late world change, repeats the world's batches).

Pure numpy; no I/O, no torch.
"""

from __future__ import annotations

import numpy as np

from ..errors import OptionError
from .batches import batch_audio, padding_of, reorder_batches, underfull
from .options import Batching, Ordering
from .order import BATCHES, NODES, rng
from .parts import index_parts, part_order
from .rounds import Formed, Grouping, Segmented, deal, form_batches, step_efficiency

__all__ = ["world_nodes", "ranks_per_node", "aligned", "plan_node_segment"]


def world_nodes(ordering: Ordering, world_size: int, ranks_per_node: int) -> int:
    """The nodes a world's plans are made for: ``world_size / ranks_per_node`` with
    ``Ordering(node_stable=True)``, else 1 (one global order, wherever the ranks run). Ranks are in contiguous
    blocks: ranks ``n * R`` to ``n * R + R - 1`` are node ``n``'s. An :class:`OptionError` where, with
    ``node_stable``, ``ranks_per_node`` does not divide ``world_size``."""
    if not ordering.node_stable:
        return 1
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise OptionError(
            f"Ordering(node_stable=True) needs nodes of the same number of ranks: {ranks_per_node} ranks "
            f"per node (LOCAL_WORLD_SIZE, or World(ranks_per_node=...)) do not divide the world's "
            f"{world_size} ranks"
        )
    return world_size // ranks_per_node


def ranks_per_node(world_size: int, nodes: int) -> int:
    """``world_size / nodes``; an :class:`OptionError` naming both where ``nodes`` does not divide it."""
    if nodes < 1 or world_size % nodes:
        raise OptionError(
            f"a world of {world_size} ranks cannot be {nodes} nodes of as many ranks each: "
            "Ordering(node_stable=True) needs every node to run the same number of ranks"
        )
    return world_size // nodes


def _rounds_of(kinds: np.ndarray, ranks: int) -> np.ndarray:
    """Per whole round of ``ranks`` batches, its bucket, or -1 where it spans buckets."""
    count = kinds.shape[0] // ranks
    by_round = kinds[: count * ranks].reshape(count, ranks)
    return np.where((by_round == by_round[:, :1]).all(axis=1), by_round[:, 0], -1)


PAIR_ROUNDS = 16
"""Rounds of one bucket a node's alignment sorts by cost together: pairs rounds of nearer cost across nodes
(more balances better, fewer keeps a node's reads nearer its windows)."""


def _by_cost(rounds: np.ndarray, costs: np.ndarray, ranks: int) -> np.ndarray:
    """``rounds`` (of one bucket, in play order) most costly first within chunks of :data:`PAIR_ROUNDS`."""
    round_costs = costs[(rounds[:, None] * ranks + np.arange(ranks))].max(axis=1)
    chunk = np.arange(rounds.shape[0]) // PAIR_ROUNDS
    return rounds[np.lexsort((np.arange(rounds.shape[0]), -round_costs, chunk))]


def aligned(
    kinds: list[np.ndarray], costs: list[np.ndarray], ranks: int, generator: np.random.Generator | None
) -> list[np.ndarray]:
    """Per node, a batch order in which round ``j`` of every node is of one bucket for as many rounds as the
    nodes share (see the module docs). ``kinds[n]`` and ``costs[n]``: node ``n``'s batches' buckets and
    costs, in its play order (rounds of ``ranks``)."""
    round_kinds = [_rounds_of(kind, ranks) for kind in kinds]
    steps: list[tuple[np.ndarray, list[np.ndarray]]] = []  # (places, per node: its rounds)
    for bucket in np.unique(np.concatenate(round_kinds)).tolist():
        if bucket < 0:
            continue
        found = [np.flatnonzero(kind == bucket) for kind in round_kinds]
        shared = min(rounds.shape[0] for rounds in found)
        if shared == 0:
            continue
        chosen = [_by_cost(rounds[:shared], cost, ranks) for rounds, cost in zip(found, costs)]
        places = np.mean(
            [rounds / max(kind.shape[0], 1) for rounds, kind in zip(chosen, round_kinds)], axis=0
        )
        steps.append((places, chosen))
    orders = []
    if steps:
        places = np.concatenate([found for found, _ in steps])
        ties = np.asarray(
            generator.random(places.shape[0]) if generator is not None else np.arange(places.shape[0])
        )
        play = np.lexsort((ties, places))
    for node, (kind, cost) in enumerate(zip(kinds, costs)):
        if steps:
            rounds = np.concatenate([chosen[node] for _, chosen in steps])[play]
            lined = (rounds[:, None] * ranks + np.arange(ranks)).ravel()
        else:
            lined = np.zeros(0, dtype=np.int64)
        taken = np.zeros(kind.shape[0], dtype=bool)
        taken[lined] = True
        rest = np.flatnonzero(~taken)
        rest = rest[np.lexsort((rest, -cost[rest], kind[rest]))]
        orders.append(np.concatenate([lined, rest]).astype(np.int64))
    return orders


def plan_node_segment(
    ids: np.ndarray,
    shard_ids: np.ndarray,
    durations: np.ndarray,
    num_shards: int,
    *,
    seed: int,
    epoch: int,
    number: int,
    world_size: int,
    nodes: int,
    batching: Batching,
    ordering: Ordering,
    buckets: np.ndarray | None,
) -> Segmented:
    """Segment ``number`` of an epoch over the samples ``ids`` (distinct, any order), planned node by node
    for ``world_size`` ranks on ``nodes`` nodes (see the module docs).

    Raises:
        OptionError: ``nodes`` that does not divide ``world_size``, or more nodes than shards.
    """
    ranks = ranks_per_node(world_size, nodes)
    shard_part = index_parts(shard_ids, durations, num_shards, seed, nodes)
    order, windows, starts = part_order(ids, shard_ids, shard_part, nodes, ordering, (seed, epoch))
    formed: list[Formed] = []
    for node in range(nodes):
        grouping = None
        if buckets is not None:
            generator = rng(seed, epoch, NODES, BATCHES, number, node) if ordering.shuffle else None
            grouping = Grouping(windows, buckets, generator)
        formed.append(
            form_batches(order[starts[node] : starts[node + 1]], durations, batching, ranks, grouping)
        )
    if buckets is not None and batching.synchronised:
        # a node's underfull batches (its buckets' last) are a bucket of their own: they line up by cost
        top = int(buckets.max(initial=0)) + 1
        kinds = [
            np.where(
                underfull(durations[part.order], part.offsets, batching),
                top,
                buckets[part.order[part.offsets[:-1]]],
            )
            for part in formed
        ]
        generator = rng(seed, epoch, NODES, number) if ordering.shuffle else None
        formed = [
            _reordered(part, perm)
            for part, perm in zip(formed, aligned(kinds, [p.costs for p in formed], ranks, generator))
        ]
    return _dealt(formed, durations, ranks, batching.remainder)


def _reordered(part: Formed, perm: np.ndarray) -> Formed:
    order, offsets = reorder_batches(part.order, part.offsets, perm)
    return part._replace(order=order, offsets=offsets, costs=part.costs[perm], audio=part.audio[perm])


def _dealt(formed: list[Formed], durations: np.ndarray, ranks: int, remainder: str) -> Segmented:
    """The nodes' batches dealt to their ranks, the same number per rank on every node, as one segment."""
    counts = [int(part.offsets.shape[0]) - 1 for part in formed]
    if remainder == "drop":  # a node whose part ran out (a late world change) repeats others' instead
        per_rank = min((count // ranks for count in counts if count), default=0)
    else:
        per_rank = max(-(-count // ranks) for count in counts)
    firsts = np.cumsum([0, *counts]).astype(np.int64)
    total = int(firsts[-1])
    order = np.concatenate([part.order for part in formed])
    sample_firsts = np.cumsum([0, *(int(part.offsets[-1]) for part in formed)])
    offsets = np.concatenate([[0], *(part.offsets[1:] + first for part, first in zip(formed, sample_firsts))])
    offsets = offsets.astype(np.int64)
    dealt, left_out = [], []
    for node, (part, count) in enumerate(zip(formed, counts)):
        if count == 0:  # nothing of this node's part is left: its ranks repeat the world's batches
            chosen = np.arange(per_rank * ranks, dtype=np.int64) % max(total, 1)
            dealt.append(chosen.reshape(per_rank, ranks).T)
            continue
        batches, dropped = deal(count, ranks, remainder, part.audio, per_rank=per_rank)
        dealt.append(batches + firsts[node])
        left_out.append(dropped + firsts[node])
    rank_batches = np.concatenate(dealt).astype(np.int64)
    sizes = np.diff(offsets)
    dropped_samples = int(sizes[np.concatenate([np.zeros(0, np.int64), *left_out])].sum())
    padded = int(sizes[rank_batches.ravel()].sum() - sizes.sum() + dropped_samples)
    costs = np.concatenate([part.costs for part in formed])
    audio, padded_seconds = batch_audio(durations[order], offsets)
    report = {
        "padding_ratio": round(padding_of(audio, padded_seconds), 6),
        "nodes": len(formed),
        "step_efficiency": step_efficiency(costs[rank_batches]),
    }
    excluded = sum(part.excluded for part in formed)
    return Segmented(order, offsets, rank_batches, excluded, dropped_samples, padded, report)
