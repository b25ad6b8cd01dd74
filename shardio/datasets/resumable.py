"""Resumable: the state face of a dataset (a base of :class:`~shardio.datasets.dataset.ShardDataset`): where
it stands (``state_dict``, ``state_after``) and continuing from a saved state (``load_state_dict``).

A state is checked when it is loaded, before anything plans with it: parsed with exact types and bounds
(:class:`~shardio.state.LoaderState`), compared with the planner's index, seed and options, its quarantines
with this index, its position with the epoch's batch count (counted by the planner where the options allow,
else on this rank's share of the plan, which the first iteration then plays). It becomes an instruction
(:func:`~shardio.runtime.progress.resume_point`) in the shared control block, or a worker's own.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ..errors import OptionError, StateError
from ..jobstate import find_states, loader_batch_size, steps_after_snapshot
from ..planning.exclusions import leave_out_consumed
from ..planning.steps import loader_batching
from ..planning.surgery import Surgery
from ..runtime.control import Instruction, extra_mark
from ..runtime.progress import resume_point
from ..runtime.yieldlog import recorder
from ..shards.index import Index
from ..state import LoaderState, batch_position
from ..world import Context
from .epochplans import extra_of
from .planned import Planned

__all__ = ["Resumable"]

logger = logging.getLogger("shardio.datasets.dataset")  # the dataset's own logger: these are its messages


class Resumable(Planned):
    """A dataset's saved and loaded states (see the module docs)."""

    index: Index
    seed: int
    _surgery_mark: int

    def _set_surgery(self, surgery: Surgery) -> None:
        """Plan with ``surgery`` (a loaded state's quarantines and re-mix) from now on, and carry it into the
        states saved; its mark (:func:`~shardio.runtime.control.extra_mark`) is what an instruction carries,
        so that a worker can tell whether it plans with the same."""
        self._surgery, self._surgery_mark = surgery, extra_mark(extra_of(surgery))

    def _state(self, at: Instruction, context: Context, **fields: Any) -> LoaderState:
        world = self.ranks(context)
        return LoaderState(
            epoch=at.epoch,
            seed=self.seed,
            index=self.index.fingerprint,
            options=self.options,
            world_size=world.world_size,
            nodes=self._epochs.nodes(world),
            history=at.history,
            start=at.start,
            extra=extra_of(self._surgery),
            **fields,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where this process stands: exact in the process that iterates (see the module docs).

        Returns:
            The state (a small JSON-ready dict): a worker's own inside a DataLoader worker.
        """
        context = Context.detect()
        at, yielded = self._progress.current(context)
        if not context.in_worker and self._progress.control.workers_playing():
            logger.warning(
                "ds.state_dict() in the training process cannot see how far its DataLoader workers have "
                "got in epoch %d: the state starts it again; save ds.state_after(batch) of the last batch "
                "trained on, or use a StatefulDataLoader's state",
                at.epoch,
            )
        return self._state(
            at, context, yielded=yielded, worker=context.worker, num_workers=context.num_workers
        ).to_dict()

    def state_after(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The job state to save once a batch and every batch before it have been consumed.

        A DataLoader must hand the batches over in order (its default `in_order=True`).

        Args:
            batch: A batch this dataset yielded (its `epoch` and `batch_index` say where it is).

        Returns:
            The state (a small JSON-ready dict) that `load_state_dict` continues from, after that batch.

        Raises:
            OptionError: A batch without its position (one a DataLoader batched from samples; with
                `step_batches`, naming it).
        """
        step_batches = self.planner.batching.step_batches
        if step_batches is not None and not self.planner.batched and isinstance(batch, dict):
            many = batch.get("batch_index")
            if isinstance(many, (list, tuple)):
                raise OptionError(loader_batching(step_batches, len(many), "the batch given to state_after"))
        epoch, index = batch_position(batch)
        given = self._progress.control.instruction()
        history = given.history if epoch == given.epoch else ()
        return self._state(Instruction(epoch, history, index + 1), Context.detect()).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: a shardio state, or a whole ``StatefulDataLoader`` state dict.

        It applies to the next iteration only (in every DataLoader worker, persistent ones too). With the
        same world size the job continues onto exactly the batches an uninterrupted run would have seen; with
        another world size (or worker count) every sample not yet consumed in the epoch is consumed exactly
        once in the rest of it.

        Args:
            state: A shardio state (`state_dict()`, `state_after(batch)`), or a `StatefulDataLoader`'s.

        Raises:
            StateError: A state that does not fit this dataset (another index, seed or plan options) or
                is malformed.
            OptionError: With `step_batches`, an unbatched dataset's state whose DataLoader batched its
                samples (`StatefulDataLoader(batch_size=N)`): its batches are no steps' batches.
        """
        context = Context.detect()
        world = self._epochs.ranks(context)
        step_batches = self.planner.batching.step_batches
        stepped_samples = step_batches is not None and not self.planner.batched
        batched_by = loader_batch_size(state) if stepped_samples else None
        if step_batches is not None and batched_by:  # its DataLoader batched samples: a state of no step
            raise OptionError(loader_batching(step_batches, batched_by, "the loaded state"))
        nodes = self._epochs.nodes(world)
        loaded, instruction, skip, ahead = resume_point(
            find_states(state), steps_after_snapshot(state), world.world_size, context, nodes
        )
        if step_batches is not None and stepped_samples and ahead:  # workers' samples out of plan order
            raise OptionError(loader_batching(step_batches, None, "the loaded state"))
        problems = self.planner.differences(loaded)
        if problems:
            raise StateError(
                "the saved loader state does not fit this dataset:\n  - " + "\n  - ".join(problems)
            )
        surgery = loaded.surgery
        if surgery.quarantines:
            surgery.check_ids(len(self.index), lambda i: self.index.keys[i], self.planner.corpus)
        previous = self._surgery
        self._set_surgery(surgery)
        try:
            if ahead:  # batches its workers consumed ahead of its position: left out of the rest of the epoch
                plan = self.planner.plan(
                    loaded.epoch, loaded.world_size, loaded.history, surgery, loaded.nodes
                )
                self._set_surgery(
                    leave_out_consumed(
                        surgery,
                        plan,
                        ahead,
                        position=loaded.position,
                        epoch=loaded.epoch,
                        segment=len(loaded.history) + 1,
                        keys=self.index.keys,
                    )
                )
            self._epochs.check_position(
                instruction,
                world.world_size,
                self._surgery,
                lambda: self._epochs.share(instruction, world, self._surgery, context),
            )
        except StateError:
            self._set_surgery(previous)
            raise
        if (loaded.world_size, loaded.nodes) != (world.world_size, nodes):
            share = self._epochs.share(instruction, world, self._surgery, context)
            repeated = 0 if share.repeats is None else int(share.repeats.sum())
            # the nodes are named only where node-stable parts make them count
            worlds = (
                f"from {loaded.world_size} to {world.world_size}"
                if loaded.nodes == nodes == 1
                else f"from {loaded.world_size} ranks on {loaded.nodes} node(s) to {world.world_size} on "
                f"{nodes}"
            )
            logger.info(
                "world size changed %s at batch %d of epoch %d: the rest of the epoch is re-planned, %d "
                "batches per rank, %d samples repeated on rank %d to even the ranks (padding)",
                worlds,
                loaded.position,
                loaded.epoch,
                share.num_batches,
                repeated,
                world.rank,
            )
        after_iter = self._progress.begun > 0 if context.in_worker else self._progress.control.started()
        if context.in_worker:
            self._progress.give_own(instruction, skip)
        else:
            self._progress.control.give(replace(instruction, extra=self._surgery_mark))
        log = recorder()
        if log is not None:
            log.loaded(
                src=log.source(self.index.fingerprint, self.seed),
                rank=world.rank,
                world=world.world_size,
                epoch=loaded.epoch,
                position=loaded.position,
                from_world=loaded.world_size,
                after_iter=after_iter,
            )
