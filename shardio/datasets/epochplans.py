"""EpochPlans: what a dataset keeps of its planner's answers for its rank, and the world they are for.

A :class:`~shardio.datasets.dataset.ShardDataset` holds one (not a base class): which rank and world the plans
are for (given, detected, or carried to a spawned worker), the whole plan of an epoch while this rank's share
is cut from it (logged when it leaves samples out), and the share, read from the node's plan files
(:mod:`shardio.runtime.planfiles`) where other processes may need it. Every planning decision is the planner's
(:class:`~shardio.planning.planner.Planner`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import OptionError, StateError
from ..planning.nodes import world_nodes
from ..planning.plan import EpochPlan, Segment
from ..planning.planner import Planner
from ..planning.rankplan import RankPlan, rank_plan
from ..planning.surgery import Surgery
from ..runtime import planfiles
from ..runtime.control import Instruction
from ..runtime.memory import WORTH_TRIMMING, trim
from ..runtime.progress import Progress
from ..runtime.sharing import shared
from ..world import Context, World

__all__ = ["EpochPlans", "extra_of"]

logger = logging.getLogger("shardio.datasets.dataset")  # the dataset's own logger: these are its messages


def extra_of(surgery: Surgery) -> dict[str, Any]:
    """``surgery`` as a state's ``extra`` (``{}`` without any, made here: nothing to serialise on the plain
    path)."""
    if not (surgery.quarantines or surgery.streams is not None or surgery.other):
        return {}
    return surgery.to_extra()


class EpochPlans:
    """The plans of ``planner`` for the rank of ``world`` (``None``: detected), as one process keeps them: the
    whole plan only while this rank's share is made from it. ``progress`` is the dataset's (whose control
    block says which training process it belongs to, and whether its workers have begun)."""

    def __init__(self, planner: Planner, world: World | None, progress: Progress) -> None:
        self.planner = planner
        self.explicit_world = world
        self.progress = progress
        self.carried: World | None = world  # carried to spawned workers by for_workers
        self.carried_by = 0  # the process that carried it
        self.plans: dict[tuple[Any, ...], EpochPlan] = {}
        self.shares: dict[tuple[Any, ...], RankPlan] = {}  # this rank's part of the current plan

    def ranks(self, context: Context | None = None) -> World:
        """Rank and world size: the explicit ``world``, else detected here (or carried to a spawned worker by
        the training process that owns the progress's control block)."""
        if self.explicit_world is not None:
            return replace(self.explicit_world, worker=0, num_workers=1)
        carried = self.carried if self.carried_by == self.progress.control.owner else None
        context = Context.detect() if context is None else context
        if carried is not None and context.in_worker:  # by this worker's training process
            return carried
        return World.detect(context=context)

    def nodes(self, world: World) -> int:
        """The nodes ``world``'s plans are made for (1 unless ``Ordering(node_stable=True)``)."""
        return world_nodes(self.planner.ordering, world.world_size, world.ranks_per_node)

    def plan(
        self, epoch: int, history: tuple[Segment, ...], world_size: int, surgery: Surgery, nodes: int = 1
    ) -> EpochPlan:
        """The whole plan of ``epoch`` after ``history`` (the last one asked for is kept)."""
        key = (epoch, history, world_size, nodes, json.dumps(extra_of(surgery), sort_keys=True))
        if key not in self.plans:
            self.plans = {key: self.planner.plan(epoch, world_size, history, surgery, nodes)}
            report = self.plans[key].report
            if any(report.get(name) for name in ("dropped", "padded", "excluded", "skipped", "repeated")):
                logger.info("epoch %d plan: %s", epoch, report)
            if report.get("excluded"):  # never yielded, this epoch or any: say so at the default level
                durations = self.planner.index.durations
                left_out = durations[~self.planner.planned_batching.eligible(durations)]
                logger.warning(
                    "epoch %d: %d samples (%.3f h) are left out of the plan: longer than max_duration "
                    "alone, or outside min_duration/max_sample_duration",
                    epoch,
                    len(left_out),
                    float(left_out.sum()) / 3600,
                )
        return self.plans[key]

    def share(self, at: Instruction, world: World, surgery: Surgery, context: Context) -> RankPlan:
        """The part of the plan of ``at``'s epoch and history for the rank of ``world`` (:meth:`ranks`), O(N /
        world); the whole plan is not kept. Where other processes may need it (``context`` is a worker's,
        there are other ranks, or the workers have begun) and the index's content is known (loaded or saved),
        it is planned once per node into plan files."""
        epoch, history = at.epoch, at.history
        extra = extra_of(surgery)
        nodes = self.nodes(world)
        key = (epoch, history, world.world_size, nodes, world.rank, json.dumps(extra, sort_keys=True))
        if key not in self.shares:
            index = self.planner.index
            others = context.in_worker or world.world_size > 1 or self.progress.control.workers_begun()
            if others and index.fingerprinted:
                job = {
                    "index": index.content_id,
                    "seed": self.planner.seed,
                    "options": self.planner.options,
                    "world": world.world_size,
                    "extra": extra,
                    **({"nodes": nodes} if nodes != 1 else {}),
                }
                found = planfiles.obtain(
                    planfiles.name(job, epoch, history),
                    world.rank,
                    len(index),
                    lambda: self.plan(epoch, history, world.world_size, surgery, nodes),
                )
            else:
                found = rank_plan(self.plan(epoch, history, world.world_size, surgery, nodes), world.rank)
            self.shares = {key: found}
            self.plans = {}
            if len(index) >= WORTH_TRIMMING:
                trim()  # planning's transient arrays, freed: their memory back to the system
        return self.shares[key]

    def check_position(
        self, at: Instruction, world_size: int, surgery: Surgery, share: Callable[[], RankPlan]
    ) -> None:
        """A :class:`StateError` unless ``at`` lies within its epoch's plan for ``world_size`` ranks.

        The planner counts the batches where the options make their number a function of the sample count
        (:meth:`~shardio.planning.planner.Planner.batch_count`): nothing is planned, the first iteration
        plans. Elsewhere the check is made on this rank's share, which ``share()`` makes and keeps for that
        iteration (read from the node's plan where there is one: its batch count is every rank's): the planner
        refuses an invalid history, and a plan file exists only where planning succeeded with the same
        inputs."""
        batches = self.planner.batch_count(world_size, at.history, surgery)
        if batches is None:
            try:
                batches = share().num_batches
            except OptionError as exc:  # the planner refuses a history segment beyond its plan
                raise StateError(f"state field history does not fit epoch {at.epoch}'s plan: {exc}") from None
        if at.start > batches:
            raise StateError(
                f"state field start: the state is at batch {at.start} of epoch {at.epoch}, which has "
                f"only {batches} batches per rank"
            )

    def for_workers(self, world: World | None) -> EpochPlans:
        """A copy to pickle, without the whole plan. Given ``world`` (the one known in the training process),
        for a spawn or forkserver worker: the shares in shared memory (by handle, not by value) and the world
        carried where none was given."""
        if world is not None:
            self.shares = {
                key: shared(plan) for key, plan in self.shares.items()
            }  # once: every worker the same
        copied = EpochPlans(self.planner, self.explicit_world, self.progress)
        copied.carried, copied.carried_by = self.carried, self.carried_by
        copied.shares = dict(self.shares)
        if self.explicit_world is None and world is not None:
            copied.carried, copied.carried_by = world, os.getpid()
        return copied

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # a share read from the node's plan travels as its name (workers.nodeplan): where its files are gone
        # it arrives as None, and this process obtains the plan again
        self.shares = {key: plan for key, plan in self.shares.items() if plan is not None}
