"""Planned: the planning face of a dataset (a base of :class:`~shardio.datasets.dataset.ShardDataset`, which sets
the attributes below): its rank and world, its plan and this rank's share of it, its length, the options and the
surgery a state records. Every answer comes from the dataset's planner through the
:class:`~shardio.datasets.epochplans.EpochPlans` it holds.
"""

from __future__ import annotations

from ..planning.plan import EpochPlan, Segment
from ..planning.planner import Planner
from ..planning.rankplan import RankPlan
from ..planning.surgery import Surgery
from ..runtime.progress import Progress
from ..world import Context, World
from .epochplans import EpochPlans

__all__ = ["Planned"]


class Planned:
    """A dataset's plans for its rank, from its ``planner`` (see the module docs)."""

    planner: Planner
    _epochs: EpochPlans
    _surgery: Surgery
    _progress: Progress

    def _use(self, planner: Planner) -> None:
        """Plan with ``planner`` (a mix's, made once its index is)."""
        self.planner = planner
        self._epochs = EpochPlans(planner, self._epochs.explicit_world)

    def ranks(self, context: Context | None = None) -> World:
        """Rank and world size: the explicit `world`, else detected here (or carried to a spawned worker).

        Args:
            context: Where this process runs (default: detected).
        """
        return self._epochs.ranks(self._progress, context)

    @property
    def surgery(self) -> Surgery:
        """The quarantines and re-mix of the state this dataset loaded (carried into the states it saves)."""
        return self._surgery

    @property
    def options(self) -> dict[str, object]:
        """The options that shape the plan (a state records them)."""
        return self.planner.options

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """An epoch's plan for this world (every rank's batches; O(samples) memory).

        Args:
            epoch: The epoch (default: the one the current or next iteration plays).
        """
        context = Context.detect()
        at = self._progress.live(context)
        epoch, history = (at.epoch, at.history) if epoch is None or epoch == at.epoch else (epoch, ())
        return self._epochs.plan(epoch, history, self.ranks(context).world_size, self._surgery)

    def __len__(self) -> int:
        """Batches (or samples, when unbatched) per rank in the epoch of its current iteration, or else its next
        one (the whole epoch, or segment after a world-size change: a resumed iteration yields the rest, from
        the state's ``start``, as trainers that count batches from the saved index expect)."""
        context = Context.detect()
        at = self._progress.live(context)
        return self._share(at.epoch, at.history, context).num_batches

    def _share(self, epoch: int, history: tuple[Segment, ...], context: Context | None = None) -> RankPlan:
        """This rank's part of an epoch's plan (O(N / world)), planned once per node where others may need it."""
        context = Context.detect() if context is None else context
        world = self.ranks(context)
        return self._epochs.share(epoch, history, world, self._surgery, lambda: context.in_worker or
                                  world.world_size > 1 or self._progress.control.workers_begun())
