"""SegmentPlans: the loader's plan of each segment of each epoch as a saved state played them (its elastic
history, the batches its workers consumed ahead), planned on demand and cached; what :class:`~shardio.Trace`
answers from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks.states import MAX_COUNT
from ..errors import OptionError
from ..planning.plan import EpochPlan
from ..state import LoaderState

if TYPE_CHECKING:
    from ..planning.planner import Planner

__all__ = ["SegmentPlans", "check_epoch"]


class SegmentPlans:
    """The plans of a state's epochs, segment by segment, under the world sizes the state records.

    Args:
        planner: The dataset's planner.
        state: The state (its world size, history and quarantines say how each epoch is played).

    Raises:
        StateError: ``state`` was not saved from the planner's dataset (see
            :meth:`~shardio.planning.planner.Planner.check`).
    """

    def __init__(self, planner: Planner, state: LoaderState) -> None:
        self.planner = planner
        self.state = state
        self.surgery = state.surgery
        current = planner.check(state)
        self._plans: dict[tuple[int, int], EpochPlan] = {(state.epoch, len(state.history)): current}
        self._ahead = self.surgery.consumed_ahead(state.epoch)

    def accumulation(self, world_size: int) -> int:
        """Batches per rank per step on ``world_size`` ranks: ``step_batches / world_size``, else 1."""
        return self.planner.batching.accumulation(world_size) or 1

    def world_size(self, epoch: int, segment: int) -> int:
        """The ranks of a segment of an epoch."""
        history = self.state.history if epoch == self.state.epoch else ()
        return history[segment].world_size if segment < len(history) else self.state.world_size

    def segments(self, epoch: int) -> list[tuple[int, int, int]]:
        """``(world_size, first step, steps)`` of each segment of an epoch, in order (with ``step_batches`` a
        step is an optimizer step: ``step_batches / world_size`` batches per rank)."""
        check_epoch(epoch)
        history = self.state.history if epoch == self.state.epoch else ()
        found, first = [], 0
        for finished in history:
            steps = finished.consumed // self.accumulation(finished.world_size)
            found.append((finished.world_size, first, steps))
            first += steps
        last = self.plan(epoch, len(history))
        found.append(
            (self.state.world_size, first, last.num_batches // self.accumulation(self.state.world_size))
        )
        return found

    def plan(self, epoch: int, segment: int) -> EpochPlan:
        """The loader's plan of one segment of an epoch (an :class:`OptionError` for a segment it lacks)."""
        if (epoch, segment) not in self._plans:
            check_epoch(epoch)
            history = self.state.history if epoch == self.state.epoch else ()
            if type(segment) is not int or not 0 <= segment <= len(history):
                raise OptionError(f"epoch {epoch} has segments 0 to {len(history)}, not {segment!r}"[:200])
            world_size = history[segment].world_size if segment < len(history) else self.state.world_size
            nodes = history[segment].nodes if segment < len(history) else self.state.nodes
            planned = self.planner.plan(epoch, world_size, history[:segment], self.surgery, nodes)
            self._plans[(epoch, segment)] = planned
        return self._plans[(epoch, segment)]

    def ahead(self, epoch: int, segment: int) -> np.ndarray:
        """The batch indices of a segment that its workers consumed ahead of its position."""
        ids = self._ahead.get(segment) if epoch == self.state.epoch else None
        if ids is None:
            return np.zeros(0, dtype=np.int64)
        plan = self.plan(epoch, segment)
        held = np.zeros(plan.offsets.shape[0] - 1, dtype=bool)
        positions = np.flatnonzero(np.isin(plan.samples, ids))
        held[np.searchsorted(plan.offsets, positions, side="right") - 1] = True
        consumed = self.state.history[segment].consumed
        return np.flatnonzero(held[plan.rank_batches].any(axis=0)[consumed:]) + consumed

    def dealt(
        self, epoch: int, segment: int, start: int, count: int, first: int = 0, stop: int | None = None
    ) -> list[tuple[int, bool]]:
        """``(batch index, ahead)`` of the batches ``segment`` of ``epoch`` (its first step ``start``,
        ``count`` steps) consumed or plans at steps ``first`` to ``stop - 1`` (default: all), in order."""
        each = self.accumulation(self.world_size(epoch, segment))
        window = range(max(first, start) - start, count if stop is None else min(stop - start, count))
        return [(s * each + a, False) for s in window for a in range(each)] + [
            (j, True)
            for j in self.ahead(epoch, segment).tolist()
            if first <= start + j // each and (stop is None or start + j // each < stop)
        ]

    def planned(self) -> set[tuple[int, int]]:
        """The ``(epoch, segment)`` plans held now (pass it to :meth:`forget_since`)."""
        return set(self._plans)

    def forget_since(self, planned: set[tuple[int, int]]) -> None:
        """Drop the plans made since :meth:`planned` returned ``planned``: a search over many epochs holds
        one epoch's plans at a time, not one per epoch searched."""
        for key in [key for key in self._plans if key not in planned]:
            del self._plans[key]


def check_epoch(epoch: Any) -> None:
    """An :class:`OptionError` unless ``epoch`` is an epoch a state can reach (an integer in 0..MAX_COUNT)."""
    if (
        isinstance(epoch, bool)
        or not isinstance(epoch, (int, np.integer))
        or not 0 <= int(epoch) <= MAX_COUNT
    ):
        raise OptionError(f"an epoch must be an integer from 0 to {MAX_COUNT}, not {epoch!r}"[:200])
