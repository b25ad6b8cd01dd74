"""EpochPlans: a dataset's plans of its epochs for its rank, planned once per node and kept as its rank's share.

What :class:`~shardio.datasets.dataset.ShardDataset` keeps of its planner's (:class:`~shardio.planning.planner.
Planner`) answers for the world it runs in: which world the plans are for, the whole plan of an epoch (logged
when it leaves samples out), and this rank's part of it, mapped from the node's plan files
(:mod:`shardio.runtime.planfiles`) where other processes may need it. Every planning decision is the planner's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

from ..errors import OptionError, StateError
from ..planning.plan import EpochPlan, Segment
from ..planning.planner import Planner
from ..planning.rankplan import RankPlan
from ..planning.surgery import Surgery
from ..shards.index import Index
from ..runtime import planfiles
from ..runtime.control import Instruction
from ..runtime.memory import trim
from ..runtime.progress import Progress
from ..world import Context, World

__all__ = ["EpochPlans"]

logger = logging.getLogger(__name__)


class EpochPlans:
    """Plans of a dataset's epochs for its rank (a base of :class:`~shardio.datasets.dataset.ShardDataset`, which sets the
    attributes below): the whole plan is kept only while this rank's share is made from it."""

    index: Index
    planner: Planner
    _explicit_world: World | None
    _world: World | None
    _world_of: int
    _surgery: Surgery
    _plans: dict[tuple[Any, ...], EpochPlan]
    _shares: dict[tuple[Any, ...], RankPlan]
    _progress: Progress

    def ranks(self, context: Context | None = None) -> World:
        """Rank and world size: the explicit ``world``, else detected here (or carried to a spawned worker);
        ``context`` is where this process runs (by default detected)."""
        if self._explicit_world is not None:
            return replace(self._explicit_world, worker=0, num_workers=1)
        carried = self._world if self._world_of == self._progress.control.owner else None
        context = Context.detect() if context is None else context
        if carried is not None and context.in_worker:  # by this worker's training process
            return carried
        return World.detect()

    @property
    def surgery(self) -> Surgery:
        """The quarantines and re-mix of the state this dataset loaded (carried into the states it saves)."""
        return self._surgery

    @property
    def options(self) -> dict[str, object]:
        """The options that shape the plan (a state records them)."""
        return self.planner.options

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the one the next or current iteration plays) for this world."""
        context = Context.detect()
        at = self._progress.live(context)
        if epoch is None or epoch == at.epoch:
            return self._plan_of(at.epoch, at.history, context)
        return self._plan_of(epoch, (), context)

    def _plan_of(self, epoch: int, history: tuple[Segment, ...], context: Context | None = None) -> EpochPlan:
        world_size = self.ranks(context).world_size
        key = (epoch, history, world_size, json.dumps(self._surgery.to_extra(), sort_keys=True))
        if key not in self._plans:
            batching = self.planner.planned_batching
            self._plans = {key: self.planner.plan(epoch, world_size, history, self._surgery)}
            report = self._plans[key].report
            if any(report.get(name) for name in ("dropped", "padded", "excluded", "skipped", "repeated")):
                logger.info("epoch %d plan: %s", epoch, report)
            if report.get("excluded"):  # never yielded, this epoch or any: say so at the default level
                left_out = self.index.durations[~batching.eligible(self.index.durations)]
                logger.warning("epoch %d: %d samples (%.3f h) are left out of the plan: longer than max_duration "
                               "alone, or outside min_duration/max_sample_duration", epoch, len(left_out),
                               float(left_out.sum()) / 3600)
        return self._plans[key]

    def __len__(self) -> int:
        """Batches (or samples, when unbatched) per rank in the epoch of its current iteration, or else its next
        one (the whole epoch, or segment after a world-size change: a resumed iteration yields the rest, from
        the state's ``start``, as trainers that count batches from the saved index expect)."""
        context = Context.detect()
        at = self._progress.live(context)
        return self._share(at.epoch, at.history, context).num_batches

    def _share(self, epoch: int, history: tuple[Segment, ...], context: Context | None = None) -> RankPlan:
        """This rank's part of an epoch's plan (O(N / world)); the whole plan is not kept. ``context`` is where
        this process runs (by default detected)."""
        context = Context.detect() if context is None else context
        world = self.ranks(context)
        extra = self._surgery.to_extra()
        key = (epoch, history, world.world_size, world.rank, json.dumps(extra, sort_keys=True))
        if key not in self._shares:
            others = context.in_worker or world.world_size > 1 or self._progress.control.workers_begun()
            job = {"index": self.index.content_id, "seed": self.seed, "options": self.options,
                   "world": world.world_size, "extra": extra}
            # once per node where others may need it and the index's content is known (loaded or saved)
            share = planfiles.share(job, epoch, history, world.rank, len(self.index),
                                    lambda: self._plan_of(epoch, history, context),
                                    others and self.index.fingerprinted)
            self._shares = {key: share}
            self._plans = {}
            trim()  # planning's transient arrays, freed: their memory back to the system
        return self._shares[key]

    def _check_position(self, at: Instruction, context: Context) -> None:
        """A :class:`StateError` unless ``at`` lies within its epoch's plan for this world.

        Checked on this rank's share (mapped from the node's plan where there is one: its batch count is every
        rank's): the planner refuses an invalid history, and a plan file exists only where planning succeeded
        with the same inputs."""
        try:
            share = self._share(at.epoch, at.history, context)
        except OptionError as exc:  # the planner refuses a history segment beyond its plan
            raise StateError(f"state field history does not fit epoch {at.epoch}'s plan: {exc}") from None
        if at.start > share.num_batches:
            raise StateError(f"state field start: the state is at batch {at.start} of epoch {at.epoch}, which has "
                             f"only {share.num_batches} batches per rank")
