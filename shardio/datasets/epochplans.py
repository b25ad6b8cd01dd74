"""EpochPlans: a dataset's plans of its epochs for its rank, planned once per node and kept as its rank's share.

The planning half of :class:`~shardio.datasets.dataset.ShardDataset` (and :class:`~shardio.datasets.mixed.MixedDataset`, which
replaces :meth:`EpochPlans._make_plan`): which world the plans are for, the whole plan of an epoch (pure
:mod:`shardio.planning` code over the index's columns, logged when it leaves samples out), and this rank's part
of it, read from the node's plan files (:mod:`shardio.runtime.planfiles`) where other processes may need it.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import OptionError, StateError
from ..planning.exclusions import exclusions
from ..planning.plan import Batching, EpochPlan, Ordering, Segment, options_of, plan_epoch
from ..planning.rankplan import RankPlan
from ..shards.index import Index
from ..runtime import planfiles
from ..runtime.control import Instruction
from ..runtime.memory import trim
from ..runtime.progress import Progress
from ..world import Context, World

if TYPE_CHECKING:
    from typing import Self  # Python 3.11

__all__ = ["EpochPlans"]

logger = logging.getLogger(__name__)


class EpochPlans:
    """Plans of a dataset's epochs for its rank (a base of :class:`~shardio.datasets.dataset.ShardDataset`, which sets the
    attributes below): the whole plan is kept only while this rank's share is made from it."""

    index: Index
    seed: int
    batching: Batching
    ordering: Ordering
    batched: bool
    _explicit_world: World | None
    _world: World | None
    _world_of: int
    _extra: dict[str, Any]
    _plans: dict[tuple[Any, ...], EpochPlan]
    _shares: dict[tuple[Any, ...], RankPlan]
    _progress: Progress

    def ranks(self, context: Context | None = None) -> World:
        """Rank and world size: the explicit `world`, else detected here (or carried to a spawned worker).

        Args:
            context: Where this process runs (default: detected).
        """
        if self._explicit_world is not None:
            return replace(self._explicit_world, worker=0, num_workers=1)
        carried = self._world if self._world_of == self._progress.control.owner else None
        context = Context.detect() if context is None else context
        if carried is not None and context.in_worker:  # by this worker's training process
            return carried
        return World.detect()

    def _copy_for(self, world_size: int) -> Self:
        """A copy that plans for rank 0 of ``world_size`` with a progress of its own, for the ledger to load a
        state into: this dataset's instructions (and its workers') stay as they are."""
        copied = copy.copy(self)
        copied._explicit_world = copied._world = World(0, world_size)
        copied._progress = Progress()
        return copied

    @property
    def options(self) -> dict[str, object]:
        """The options that shape the plan (a state records them)."""
        return options_of(self.batching, self.ordering)

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """An epoch's plan for this world (every rank's batches; O(samples) memory).

        Args:
            epoch: The epoch (default: the one the current or next iteration plays).
        """
        context = Context.detect()
        at = self._progress.live(context)
        if epoch is None or epoch == at.epoch:
            return self._plan_of(at.epoch, at.history, context)
        return self._plan_of(epoch, (), context)

    def _plan_of(self, epoch: int, history: tuple[Segment, ...], context: Context | None = None) -> EpochPlan:
        world_size = self.ranks(context).world_size
        key = (epoch, history, world_size, json.dumps(self._extra, sort_keys=True))
        if key not in self._plans:
            batching = self._planned_batching
            self._plans = {key: self._make_plan(epoch, history, world_size, batching)}
            report = self._plans[key].report
            if any(report.get(name) for name in ("dropped", "padded", "excluded", "skipped", "repeated")):
                logger.info("epoch %d plan: %s", epoch, report)
            if report.get("excluded"):  # never yielded, this epoch or any: say so at the default level
                left_out = self.index.durations[~batching.eligible(self.index.durations)]
                logger.warning("epoch %d: %d samples (%.3f h) are left out of the plan: longer than max_duration "
                               "alone, or outside min_duration/max_sample_duration", epoch, len(left_out),
                               float(left_out.sum()) / 3600)
        return self._plans[key]

    @property
    def _planned_batching(self) -> Batching:
        """The batching of the plan: a sample per batch when unbatched."""
        return self.batching if self.batched else replace(self.batching, batch_size=1)

    def _make_plan(self, epoch: int, history: tuple[Segment, ...], world_size: int, batching: Batching) -> EpochPlan:
        """Plan an epoch (the one step a dataset over other index layouts, such as a mix, replaces)."""
        return plan_epoch(self.index.shard_ids, self.index.durations, len(self.index.shards), seed=self.seed,
                          epoch=epoch, world_size=world_size, batching=batching, ordering=self.ordering,
                          history=history, exclude=exclusions(self._extra, epoch))

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
        key = (epoch, history, world.world_size, world.rank, json.dumps(self._extra, sort_keys=True))
        if key not in self._shares:
            others = context.in_worker or world.world_size > 1 or self._progress.control.workers_begun()
            job = {"index": self.index.content_id, "seed": self.seed, "options": self.options,
                   "world": world.world_size, "extra": self._extra}
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

        Checked on this rank's share (read from the node's plan where there is one: its batch count is every
        rank's): the planner refuses an invalid history, and a plan file exists only where planning succeeded
        with the same inputs."""
        try:
            share = self._share(at.epoch, at.history, context)
        except OptionError as exc:  # the planner refuses a history segment beyond its plan
            raise StateError(f"state field history does not fit epoch {at.epoch}'s plan: {exc}") from None
        if at.start > share.num_batches:
            raise StateError(f"state field start: the state is at batch {at.start} of epoch {at.epoch}, which has "
                             f"only {share.num_batches} batches per rank")
