"""Planned: the planning face of a dataset (a base of :class:`~shardio.datasets.dataset.ShardDataset`, which
sets the attributes below): its rank and world, its plan, its length, the options and the surgery a state
records. Every answer comes from the dataset's planner through the
:class:`~shardio.datasets.epochplans.EpochPlans` it holds, which the dataset asks directly for this rank's
share of an epoch.
"""

from __future__ import annotations

from ..planning.plan import EpochPlan
from ..planning.planner import Planner
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
        self._epochs = EpochPlans(planner, self._epochs.explicit_world, self._progress)

    def ranks(self, context: Context | None = None) -> World:
        """Rank and world size: the explicit `world`, else detected here (or carried to a spawned worker).

        Args:
            context: Where this process runs (default: detected).
        """
        return self._epochs.ranks(context)

    @property
    def surgery(self) -> Surgery:
        """The quarantines and re-mix of the state this dataset loaded (carried into the states it saves)."""
        return self._surgery

    @property
    def accumulation(self) -> int | None:
        """Batches each rank accumulates per optimizer step: `Batching.step_batches / world size` (rank batch
        `s * accumulation + a` is micro-batch `a` of step `s`); `None` without `step_batches`.

        Raises:
            OptionError: The world size does not divide `step_batches` (naming both).
        """
        return self.planner.batching.accumulation(self.ranks().world_size)

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
        world = self.ranks(context)
        return self._epochs.plan(epoch, history, world.world_size, self._surgery, self._epochs.nodes(world))

    def __len__(self) -> int:
        """Batches (or samples, when unbatched) per rank in the epoch of its current iteration, or else its
        next one (the whole epoch, or segment after a world-size change: a resumed iteration yields the rest,
        from the state's ``start``, as trainers that count batches from the saved index expect)."""
        context = Context.detect()
        return self._epochs.share(
            self._progress.live(context), self._epochs.ranks(context), self._surgery, context
        ).num_batches
