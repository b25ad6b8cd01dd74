"""Progress: which iteration one process plays, and how many of its batches it has yielded.

A dataset's copy in each process (the training process, every DataLoader worker) holds one. Instructions
(``set_epoch``, ``load_state_dict``) reach it through the shared :class:`~shardio.runtime.control.Control`
block, or, inside a worker that ``StatefulDataLoader`` restores, as the worker's own instruction; a loaded
state becomes an instruction by :func:`resume_point`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from ..errors import StateError
from ..jobstate import split
from ..planning.plan import Segment
from ..state import LoaderState
from ..world import Context
from .control import MAX_HISTORY, Control, Instruction, slot_of

__all__ = ["Progress", "resume_point"]

logger = logging.getLogger(__name__)


class Progress:
    """One process's position: the instruction its next iteration plays, the iteration it plays (or last
    played) and the batches of that iteration it has yielded."""

    def __init__(self) -> None:
        self._control = Control()
        self._own: Instruction | None = None  # a worker's own instruction (a worker-level load_state_dict)
        self._skip = 0  # batches of this worker's share already yielded, from a worker-level state
        self._run: Instruction | None = None  # what this process's current (or last) iteration plays
        self._run_generation = 0
        self._finished = False
        self._begun = 0  # iterations this process has begun (a forked worker starts from its parent's count)
        self.yielded = 0

    @property
    def control(self) -> Control:
        """The control block, this training process's own (:meth:`Control.own`)."""
        self._control.own()
        return self._control

    @property
    def begun(self) -> int:
        """How many iterations this process has begun."""
        return self._begun

    @property
    def instructions(self) -> int:
        """How many instructions the job has been given (``set_epoch``, ``load_state_dict``)."""
        return self.control.generation

    @property
    def follows_control(self) -> bool:
        """Whether the next iteration plays the control block's instruction (not a worker's own)."""
        return self._own is None

    def give_own(self, instruction: Instruction, skip: int = 0) -> None:
        """Make ``instruction`` this worker's next iteration, ``skip`` of its batches already yielded."""
        self._own, self._skip = instruction, skip

    def slot(self, context: Context) -> int:
        """This process's slot in the control block."""
        return slot_of(context.worker, context.num_workers) if context.in_worker else 0

    def iteration(self, context: Context) -> int:
        """The DataLoader iteration this worker's next iteration is part of, the same in each of its workers
        (its ``base_seed``, drawn per iterator, its worker count, and how many iterations this process has
        begun); 0 outside a worker."""
        if not context.in_worker:
            return 0
        named = f"{context.seed - context.worker}:{context.num_workers}:{self._begun}".encode()
        return int.from_bytes(hashlib.blake2b(named, digest_size=7).digest(), "big") | 1

    def upcoming(self, context: Context) -> Instruction:
        """What the next iteration of this process plays."""
        if self._own is not None:
            return self._own
        return self.control.upcoming(self.slot(context), self.iteration(context))

    def upcoming_skip(self) -> int:
        """Batches of the next iteration already yielded (from a worker-level state)."""
        return self._skip if self._own is not None else 0

    def _standing_run(self) -> Instruction | None:
        """This process's current (or last) iteration, unless an instruction came since."""
        if self._own is None and self._run_generation == self.control.generation:
            return self._run
        return None

    def current(self, context: Context) -> tuple[Instruction, int]:
        """The iteration running in this process (or its last one) unless an instruction came since; and the
        batches of it yielded here."""
        run = self._standing_run()
        if run is not None:
            return run, self.yielded
        if self._own is None and not context.in_worker:
            return self.control.current(), 0  # the training process while its workers play (see live)
        return self.upcoming(context), self._skip

    def live(self, context: Context) -> Instruction:
        """The iteration this process is in the middle of, else the next one (the training process, while its
        workers play: the latest one begun until every worker has finished it)."""
        run = self._standing_run()
        if run is not None:
            return self.upcoming(context) if self._finished else run
        if self._own is None and not context.in_worker:
            return self.control.current()
        return self.upcoming(context)

    def begin(self, at: Instruction, skip: int, context: Context) -> None:
        """Record that this process begins playing ``at``, ``skip`` of its batches already yielded."""
        self._own, self._skip = None, 0
        self._run, self._run_generation = (
            at,
            self.control.begin(self.slot(context), at.epoch, self.iteration(context)),
        )
        self._begun += 1
        self.yielded, self._finished = skip, False

    def finish(self, context: Context) -> None:
        """Record that this process has yielded every batch of its iteration."""
        self._finished = True
        self.control.finish(self.slot(context))


def resume_point(
    states: Sequence[LoaderState], steps_after: int, world_size: int, context: Context, nodes: int = 1
) -> tuple[LoaderState, Instruction, int, tuple[int, ...]]:
    """What the next iteration of a process in a world of ``world_size`` plays after loading ``states``: the
    state they make, its instruction, the batches of it this process has already yielded, and the positions
    its workers consumed ahead of the state's position (:func:`~shardio.jobstate.split`).

    One worker's own state, loaded inside that worker (``StatefulDataLoader`` restoring it), resumes that
    worker; otherwise the states are combined into the job's (``steps_after``: batches consumed since they
    were saved). With another world size or number of ``nodes`` (``Ordering(node_stable=True)``), or with
    batches consumed ahead (which the dataset then leaves out), the rest of the epoch is planned anew, after a
    history segment that records the position.
    """
    worker_level = (
        len(states) == 1
        and states[0].num_workers > 1
        and context.in_worker
        and (states[0].worker, states[0].num_workers) == (context.worker, context.num_workers)
    )
    if worker_level:
        loaded = states[0]
        if (loaded.world_size, loaded.nodes) != (world_size, nodes):
            raise StateError(
                f"a worker's state from a world of {loaded.world_size} ranks on {loaded.nodes} node(s) "
                f"cannot resume a world of {world_size} on {nodes}: load the loader's whole state into a "
                "fresh dataset instead"
            )
        return loaded, Instruction(loaded.epoch, loaded.history, loaded.start, True), loaded.yielded, ()
    loaded, ahead = split(states, steps_after)
    same = (loaded.world_size, loaded.nodes) == (world_size, nodes)
    if same and not ahead:
        return loaded, Instruction(loaded.epoch, loaded.history, loaded.position, True), 0, ()
    if ahead and same:
        logger.warning(
            "the state's DataLoader workers consumed %d batches per rank out of plan order (a DataLoader "
            "batching samples): the rest of epoch %d is re-planned without them; with the same workers, "
            "the loader's own load_state_dict resumes its exact sequence instead",
            len(ahead),
            loaded.epoch,
        )
    if len(loaded.history) >= MAX_HISTORY:  # refused now, not after planning every segment
        raise StateError(
            f"state field history: resuming here adds a world-size change to the {len(loaded.history)} "
            f"of epoch {loaded.epoch}; at most {MAX_HISTORY} are kept"
        )
    history = (*loaded.history, Segment(loaded.world_size, loaded.position, loaded.nodes))
    return loaded, Instruction(loaded.epoch, history, 0, True), 0, ahead
