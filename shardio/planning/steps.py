"""Steps: an epoch planned as optimizer steps of ``step_batches`` batches, the same on any number of ranks.

With ``Batching.step_batches = K`` an epoch's plan is first a sequence of *steps*: the batching pass of
:func:`shardio.planning.rounds.form_batches` run as for ``K`` ranks, each round of ``K`` batches one step (of
one bucket with ``sync_buckets``; the last partial step padded or dropped by ``remainder``, so an epoch holds
a whole number of steps). Nothing of it depends on the world size. Only then is each step *split* over ``W``
ranks (``W`` divides ``K``) of ``A = K / W`` batches each (:func:`split_steps`): the step's batches, most
costly first, are dealt in a snake (rank 0, 1, ..., W - 1, W - 1, ..., 0, ...) into ``W`` groups of ``A``,
which balances the groups' costs, and the groups go to ranks by :func:`~shardio.planning.rounds.balance` (the
ranks' audio stays even over the epoch). Rank ``r``'s batch ``s * A + a`` is micro-batch ``a`` of step ``s``.
With ``W = K`` the plan is the one planned for ``K`` ranks without steps.

An elastic resume (another world size) at a step boundary continues the same steps: the new segment is the
rest of the steps, split for the new world; a segment that consumed part of a step cannot be continued on
another world (an :class:`~shardio.errors.OptionError`). Only a quarantine (an ``exclude`` from a segment)
plans the rest of the epoch's samples again, as steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import OptionError
from .rounds import Formed, Segmented, balance, deal, step_efficiency

__all__ = [
    "Steps",
    "Split",
    "steps_of",
    "snake",
    "split_steps",
    "check_world",
    "mid_step",
    "loader_batching",
    "plan_steps",
]


class Steps(NamedTuple):
    """A segment's steps: ``rounds[s]`` the ``K`` global batch numbers of step ``s`` (into ``order`` and
    ``offsets``), each batch's ``costs`` and seconds of ``audio``; ``excluded``, ``dropped`` and ``padded``
    sample counts and the report."""

    order: np.ndarray
    offsets: np.ndarray
    rounds: np.ndarray
    costs: np.ndarray
    audio: np.ndarray
    excluded: int
    dropped: int
    padded: int
    report: dict[str, Any]


def steps_of(formed: Formed, step_batches: int, remainder: str) -> Steps:
    """The steps of a batching pass run for ``step_batches`` ranks: its rounds, in play order."""
    order, offsets, costs, audio, excluded, report = formed
    num_batches = offsets.shape[0] - 1
    if num_batches == 0:
        rounds = np.zeros((0, step_batches), dtype=np.int64)
        return Steps(order, offsets, rounds, costs, audio, excluded, 0, 0, report)
    by_slot, left_out = deal(num_batches, step_batches, remainder, audio)
    sizes = np.diff(offsets)
    dropped = int(sizes[left_out].sum())
    padded = int(sizes[by_slot.ravel()].sum() - sizes.sum() + dropped)
    return Steps(order, offsets, by_slot.T.copy(), costs, audio, excluded, dropped, padded, report)


def check_world(step_batches: int, world_size: int) -> int:
    """The accumulation ``step_batches / world_size``; an :class:`OptionError` naming both where
    ``world_size`` does not divide ``step_batches``."""
    if world_size < 1 or step_batches % world_size:
        raise OptionError(
            f"step_batches={step_batches} batches per optimizer step cannot be shared by {world_size} "
            "ranks: the number of ranks must divide step_batches (each rank accumulates "
            "step_batches / ranks batches per step)"
        )
    return step_batches // world_size


def mid_step(consumed: int, accumulation: int, world_size: int, step_batches: int) -> str:
    """The refusal of a segment that stopped inside a step: a resume on another world continues steps."""
    return (
        f"the state is at batch {consumed} per rank on {world_size} ranks, micro-batch "
        f"{consumed % accumulation} of optimizer step {consumed // accumulation} ({accumulation} batches "
        f"per rank per step, step_batches={step_batches}): a resume on another number of ranks continues "
        "whole steps, so save the state at an optimizer step's boundary (after the step's last batch), "
        "or resume on the same number of ranks"
    )


def loader_batching(step_batches: int, samples: int | None, seen: str) -> str:
    """The refusal of a DataLoader that batches an unbatched dataset's samples (``samples`` at a time, where
    known) with ``step_batches``, which ``seen`` names: each sample is a batch of the plan's steps, so the
    DataLoader's batches are no micro-batches of them (with workers, not even of plan order), and no
    optimizer step means the same samples on another world, or to the ledger."""
    how = f"{samples} samples at a time" if samples else "several samples at a time"
    return (
        f"step_batches={step_batches} counts the dataset's batches, and this dataset is unbatched (each "
        f"sample is one batch of an optimizer step), but {seen} shows a DataLoader batching its samples, "
        f"{how} (DataLoader(batch_size=N)): its batches are not the steps' batches, so no optimizer step "
        "would hold the same samples on another number of ranks or in the ledger. Batch in the dataset "
        "(Batching(batch_size=... or max_duration=..., step_batches=...)) and give the DataLoader "
        "batch_size=None, or hand the samples over one by one (DataLoader(batch_size=None))"
    )


def snake(step_batches: int, world_size: int) -> np.ndarray:
    """``[world_size, A]``: the positions (most costly first) of a step's batches in each rank's group,
    dealt 0, 1, ..., W - 1, W - 1, ..., 0, 0, 1, ...; a group's positions ascend."""
    positions = np.arange(step_batches)
    passes, at = positions // world_size, positions % world_size
    group = np.where(passes % 2 == 0, at, world_size - 1 - at)
    return np.argsort(group, kind="stable").reshape(world_size, step_batches // world_size)


def split_steps(steps: Steps, start: int, world_size: int) -> tuple[np.ndarray, float]:
    """Steps ``start`` onward split over ``world_size`` ranks: ``rank_batches`` (``[W, steps x A]``: rank
    ``r``'s batch ``s * A + a`` is micro-batch ``a`` of step ``s``), and the step efficiency of the split
    (each rank's cost a step: the sum of its ``A`` batches)."""
    rounds = steps.rounds[start:]
    count, step_batches = rounds.shape
    if world_size == step_batches:  # a batch a rank: the deal of steps_of balanced them already
        return rounds.T.copy(), step_efficiency(steps.costs[rounds.T])
    accumulation = step_batches // world_size
    by_cost = np.take_along_axis(rounds, np.argsort(-steps.costs[rounds], axis=1, kind="stable"), axis=1)
    grouped = by_cost[:, snake(step_batches, world_size)]  # [steps, W, A]
    group_costs = steps.costs[grouped].sum(axis=2)
    groups = np.broadcast_to(np.arange(world_size), (count, world_size))
    if world_size > 1 and count:
        groups = balance(np.ascontiguousarray(groups), steps.audio[grouped].sum(axis=2))
    chosen = np.take_along_axis(grouped, groups[:, :, None], axis=1)  # [steps, rank, A]
    rank_batches = chosen.transpose(1, 0, 2).reshape(world_size, count * accumulation)
    efficiency = step_efficiency(np.take_along_axis(group_costs, groups, axis=1).T)
    return np.ascontiguousarray(rank_batches), efficiency


class Split(NamedTuple):
    """A segment of steps split over ranks: its ``steps``, from step ``start`` on, as ``rank_batches``
    (:func:`split_steps`) of that ``efficiency``; ``earlier``: the batches of the steps before ``start``."""

    steps: Steps
    start: int
    rank_batches: np.ndarray
    efficiency: float
    earlier: np.ndarray | None
    accumulation: int

    def segmented(self) -> Segmented:
        """The split as an epoch plan's first fields (its report counts the segment's steps)."""
        found = self.steps
        report = {
            **found.report,
            "steps": int(found.rounds.shape[0] - self.start),
            "step_batches": int(found.rounds.shape[1]),
            "accumulation": self.accumulation,
            "step_efficiency": self.efficiency,
        }
        return Segmented(
            found.order,
            found.offsets,
            self.rank_batches,
            found.excluded,
            found.dropped,
            found.padded,
            report,
        )


def plan_steps(
    order: np.ndarray,
    num_ids: int,
    *,
    step_batches: int,
    remainder: str,
    world_size: int,
    history: Sequence[tuple[int, int]],
    form: Callable[[int, np.ndarray], Formed],
    exclude: Sequence[tuple[int, np.ndarray]] = (),
    limited: bool = False,
) -> Split:
    """The steps of an epoch's current segment after ``history`` (``(world_size, consumed)`` per finished
    segment), split over ``world_size`` ranks (see the module docs). ``form(number, ids)``: segment
    ``number``'s batching pass over ``ids`` for ``step_batches`` ranks; ``exclude``: ``(segment, ids)``
    pairs, the ids that segment and later ones leave out (the rest of the epoch is planned again as steps
    from that segment); ``limited``: segment 0's pass holds only some of ``order``
    (a fixed number of batches), and a later pass plans only what it held. ``num_ids``: ids are below it."""
    accumulation = check_world(step_batches, world_size)
    replanned = {at for at, _ in exclude}

    def excluding(number: int, ids: np.ndarray) -> np.ndarray:
        if number not in replanned:
            return ids
        mask = np.zeros(num_ids, dtype=bool)
        for at, gone in exclude:
            if at == number:
                mask[np.asarray(gone, dtype=np.int64)] = True
        return ids[~mask[ids]]

    order = excluding(0, order)
    steps = steps_of(form(0, order), step_batches, remainder)
    if limited:
        held = np.zeros(num_ids, dtype=bool)
        held[steps.order] = True
        order = order[held[order]]
    start, done = 0, np.zeros(num_ids, dtype=bool)
    for number, (size, consumed) in enumerate(history):
        each = check_world(step_batches, size)
        if consumed % each:
            raise OptionError(mid_step(consumed, each, size, step_batches))
        taken = consumed // each
        if not 0 <= taken <= steps.rounds.shape[0] - start:
            raise OptionError(
                f"a segment consumed {consumed} batches of a plan with "
                f"{(steps.rounds.shape[0] - start) * each}"
            )
        played = np.zeros(steps.offsets.shape[0] - 1, dtype=bool)
        played[steps.rounds[start : start + taken].ravel()] = True
        done[steps.order[np.repeat(played, np.diff(steps.offsets))]] = True
        start += taken
        if number + 1 in replanned:
            order = excluding(number + 1, order[~done[order]])
            steps, start = steps_of(form(number + 1, order), step_batches, remainder), 0
    rank_batches, efficiency = split_steps(steps, start, world_size)
    earlier = steps.rounds[:start].ravel() if start else None
    return Split(steps, start, rank_batches, efficiency, earlier, accumulation)
