"""Checks of the public planner's arguments (:class:`~shardio.Planner`, :func:`~shardio.plan_epoch`, the mix
planner): a seed, an epoch, a world size, a rank, an elastic history, each an
:class:`~shardio.errors.OptionError` naming the value where it cannot be planned, before anything is
allocated. The bounds are a state's (:mod:`shardio.checks.states`): whatever a plan accepts, a state of it can
record and load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import OptionError, shown
from .options import integer
from .states import MAX_COUNT, MAX_HISTORY, MAX_WORLD_SIZE

__all__ = ["columns_of", "epoch_of", "rank_of", "seed_of", "segments_of", "world_size_of"]


def seed_of(seed: object) -> int:
    """``seed``: an integer from 0 (any size: numpy's seed sequences take it whole)."""
    return integer("seed", seed, 0)


def epoch_of(epoch: object, least: int = 0) -> int:
    """``epoch``: an integer from ``least`` to :data:`~shardio.checks.states.MAX_COUNT` (a state's epoch)."""
    return integer("epoch", epoch, least, MAX_COUNT)


def world_size_of(world_size: object, name: str = "world_size") -> int:
    """``world_size``: an integer from 1 to :data:`~shardio.checks.states.MAX_WORLD_SIZE` (every plan deals at
    least one round of that many batches: an unbounded one would allocate without limit)."""
    return integer(name, world_size, 1, MAX_WORLD_SIZE)


def rank_of(rank: object, world_size: int) -> int:
    """``rank``: an integer from 0 to ``world_size - 1`` (a negative one would index from the end)."""
    return integer("rank", rank, 0, world_size - 1)


def segments_of(history: object) -> list[tuple[int, int, int]]:
    """``history`` as ``(world_size, consumed, nodes)`` triples: a sequence (not a string) of at most
    :data:`~shardio.checks.states.MAX_HISTORY` segments, each with an integer ``world_size`` (1 to
    :data:`~shardio.checks.states.MAX_WORLD_SIZE`), ``consumed`` (0 to
    :data:`~shardio.checks.states.MAX_COUNT`) and ``nodes`` (1 where it has none; 1 to ``world_size``)."""
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise OptionError(f"history must be a sequence of Segment values, not {shown(history)}")
    if len(history) > MAX_HISTORY:
        raise OptionError(
            f"history holds {len(history)} segments; an epoch records at most {MAX_HISTORY} world-size "
            "changes"
        )
    pairs = []
    for number, segment in enumerate(history):
        world_size: Any = getattr(segment, "world_size", None)
        consumed: Any = getattr(segment, "consumed", None)
        if world_size is None or consumed is None:
            raise OptionError(
                f"history[{number}] must be a Segment(world_size, consumed), not {shown(segment)}"
            )
        size = world_size_of(world_size, f"history[{number}].world_size")
        pairs.append(
            (
                size,
                integer(f"history[{number}].consumed", consumed, 0, MAX_COUNT),
                integer(f"history[{number}].nodes", getattr(segment, "nodes", 1), 1, size),
            )
        )
    return pairs


def columns_of(shard_ids: object, durations: object, num_shards: object) -> int:
    """``num_shards`` (an integer from 0), once ``shard_ids`` and ``durations`` are found to be columns (1-d
    arrays) of one length."""
    shapes = getattr(shard_ids, "shape", None), getattr(durations, "shape", None)
    if shapes[0] != shapes[1] or shapes[0] is None or len(shapes[0]) != 1:
        raise OptionError(
            f"shard_ids and durations must be arrays of the same length, not of shapes {shapes[0]} and "
            f"{shapes[1]}"
        )
    return integer("num_shards", num_shards, 0)
