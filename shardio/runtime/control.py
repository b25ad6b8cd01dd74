"""Control: the training process's instructions to its DataLoader workers, in a small shared-memory block.

A DataLoader worker holds the copy of the dataset it was started with (a persistent worker keeps it for every
epoch), so what the training process decides afterwards (``set_epoch``, ``load_state_dict``) would never reach
it through that copy. The decisions live instead in one int64 tensor that the training process puts in shared
memory when the dataset is made. Torch's DataLoader carries a shared tensor to fork, forkserver and spawn
workers alike (by handle, never by value), and every process that iterates reads it at the start of each
iteration. No files and no locks: the training process is the only writer of the instruction (it writes the
fields, then bumps the generation), and each iterating process writes only its own slot.

A block belongs to the training process that made it. Another training process that receives the dataset
(a rank that ``torch.multiprocessing.spawn`` or a fork starts with it, as Lightning's ``ddp_spawn`` and
``ddp_fork`` do) takes a copy of its own (:meth:`Control.own`) before it reads the block, pickles it for its
workers or forks them: ranks sharing one block would play one another's epochs.

Semantics of an iteration (every configuration agrees): the first iteration after an instruction plays it
(an epoch from its start, or a loaded position); each further iteration without a new instruction plays the
epoch after the latest one begun, from its start (even when that one was left with ``break``, and whether it
was played by workers, of any count, or by the training process). An iteration is the training process
iterating itself, or one DataLoader iterator's workers, which recognise one another by the iterator's seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..checks.states import MAX_COUNT, MAX_HISTORY, MAX_WORKERS
from ..errors import OptionError, StateError, shown
from ..planning.plan import Segment
from ..world import Context

__all__ = ["MAX_HISTORY", "MAX_WORKERS", "Control", "Instruction", "extra_mark", "slot_of"]

_GENERATION, _LOADED, _EPOCH, _START, _HISTORY_LENGTH, _EXTRA = range(6)
_HISTORY = 6
_SEGMENT = 3  # a history segment's fields: world size, consumed, nodes
_SLOTS = (
    _HISTORY + _SEGMENT * MAX_HISTORY
)  # then per iterating process: generation seen, epoch last begun, finished,
_WIDTH = 4  # and the iteration that began it (see Control.upcoming)
_SEEN, _EPOCH_BEGUN, _FINISHED, _ITERATION = range(_WIDTH)  # a slot's fields
_SIZE = _SLOTS + _WIDTH * (1 + MAX_WORKERS)


@dataclass(frozen=True)
class Instruction:
    """What an iteration plays: ``epoch`` after its finished ``history`` segments, from batch ``start`` per
    rank.

    ``loaded`` marks a position from a loaded state (a ``set_epoch`` of the same epoch keeps it); ``extra`` is
    :func:`extra_mark` of the state's ``extra`` (quarantines, re-mixes) the training process plans with.
    """

    epoch: int
    history: tuple[Segment, ...] = ()
    start: int = 0
    loaded: bool = False
    extra: int = 0


class Control:
    """The shared block: the current instruction, its generation, and what each iterating process last played.

    Slot 0 is the training process iterating itself (``num_workers=0``); slot ``1 + w`` is DataLoader worker
    ``w``.
    """

    def __init__(self) -> None:
        self._block = torch.zeros(_SIZE, dtype=torch.int64).share_memory_()
        self._values = self._block.numpy()  # the same memory, read and written through numpy: ~50x cheaper
        self.owner = os.getpid()
        """The training process whose block this is (its workers read it too)."""
        self._worker = 0  # the process found to be a DataLoader worker, which never owns the block
        _LIVE.add(self)
        self.give(Instruction(0))

    def __getstate__(self) -> dict[str, Any]:
        self.own()
        return {"_block": self._block, "owner": self.owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        block = state["_block"]
        # a worker receives the shared block itself; a deepcopy or a plain unpickle gets a block of its own
        shared = block.is_shared()
        self._block = block if shared else block.clone().share_memory_()
        self._values = self._block.numpy()
        self.owner = int(state.get("owner", 0)) if shared else os.getpid()
        self._worker = 0
        _LIVE.add(self)

    def own(self) -> None:
        """In a training process (not a DataLoader worker) that did not make this block: continue on a copy of
        it, this process's own, so that its instructions and its workers' iterations stay its own."""
        pid = os.getpid()
        if self.owner == pid or self._worker == pid:
            return
        if Context.detect().in_worker:  # pickled or forked: no caller to ask; a worker stays one
            self._worker = pid
            return
        self._block = self._block.clone().share_memory_()
        self._values = self._block.numpy()
        self.owner = os.getpid()

    @property
    def shared(self) -> bool:
        """Whether the block is in shared memory (where DataLoader workers can see it)."""
        return bool(self._block.is_shared())

    @property
    def generation(self) -> int:
        """How many instructions have been given (the first, epoch 0, when the block was made)."""
        return int(self._values[_GENERATION])

    def give(self, instruction: Instruction) -> None:
        """Make ``instruction`` what the next iteration of every process plays."""
        if len(instruction.history) > MAX_HISTORY:
            raise StateError(
                f"state field history: {len(instruction.history)} world-size changes in one epoch; "
                f"at most {MAX_HISTORY} are kept"
            )
        values = {
            "epoch": instruction.epoch,
            "start": instruction.start,
            **{f"history[{i}]": max(s.world_size, s.consumed) for i, s in enumerate(instruction.history)},
        }
        for name, value in values.items():
            if not 0 <= value <= MAX_COUNT:  # a state is bounded when parsed; set_epoch's argument is not
                error = StateError if instruction.loaded else OptionError
                raise error(
                    f"{'state field ' if instruction.loaded else ''}{name} is {shown(value)}, beyond the "
                    f"{MAX_COUNT} the control block holds"
                )
        block = self._values
        block[_LOADED], block[_EPOCH], block[_START] = (
            int(instruction.loaded),
            instruction.epoch,
            instruction.start,
        )
        block[_HISTORY_LENGTH], block[_EXTRA] = len(instruction.history), instruction.extra
        for i, segment in enumerate(instruction.history):
            at = _HISTORY + _SEGMENT * i
            block[at], block[at + 1], block[at + 2] = segment.world_size, segment.consumed, segment.nodes
        block[_GENERATION] = (
            self.generation + 1
        )  # last: a reader that sees the new generation sees its fields

    def instruction(self) -> Instruction:
        """The last instruction given."""
        values = self._values[:_SLOTS].tolist()
        end = _HISTORY + _SEGMENT * values[_HISTORY_LENGTH]
        history = tuple(
            map(
                Segment,
                values[_HISTORY:end:3],
                values[_HISTORY + 1 : end : 3],
                values[_HISTORY + 2 : end : 3],
            )
        )
        return Instruction(values[_EPOCH], history, values[_START], bool(values[_LOADED]), values[_EXTRA])

    def started(self) -> bool:
        """Whether some process has begun an iteration since the last instruction."""
        return bool((self._slots()[:, _SEEN] == self.generation).any())

    def workers_begun(self) -> bool:
        """Whether some DataLoader worker has begun an iteration (persistent ones wait for the next)."""
        return bool(self._slots()[1:, _SEEN].any())

    def workers_playing(self) -> bool:
        """Whether a DataLoader worker has begun an iteration since the last instruction and not finished
        it."""
        workers = self._slots()[1:]
        return bool(((workers[:, _SEEN] == self.generation) & (workers[:, _FINISHED] == 0)).any())

    def upcoming(self, slot: int, iteration: int = 0) -> Instruction:
        """What the next iteration of ``slot`` plays. ``iteration`` names the DataLoader iteration a worker's
        slot is part of (0: the training process, whose every iteration is its own).

        A worker whose siblings (other slots of the same ``iteration``) have begun the latest epoch begun, one
        this slot has not played, plays what they play. Any other iteration is a new one: the instruction when
        nothing has begun under it, else the epoch after the latest begun, whichever process began it (workers
        of another count, or the training process without workers). The conditions on siblings keep apart two
        iterators whose workers draw the same seed (a DataLoader given a freshly seeded generator each time).
        """
        generation = self.generation
        slots = self._slots()
        begun = np.flatnonzero(slots[:, _SEEN] == generation)
        given = self.instruction()
        if not begun.size:
            return given
        epochs = slots[begun, _EPOCH_BEGUN]
        latest = int(epochs.max())
        played = int(slots[slot, _EPOCH_BEGUN]) if slots[slot, _SEEN] == generation else -1
        siblings = (slots[begun, _ITERATION] == iteration) & (begun != slot) & (epochs == latest)
        if iteration and latest > played and siblings.any():
            return given if latest == given.epoch else Instruction(latest)
        return Instruction(latest + 1)

    def current(self) -> Instruction:
        """The job's iteration as the training process sees it when workers play it: the latest epoch begun
        under this instruction (the instruction itself before any), or the epoch after it once every process
        that began it has finished its share."""
        slots = self._slots()
        begun = slots[slots[:, _SEEN] == self.generation]
        if not begun.shape[0]:
            return self.instruction()
        latest = int(begun[:, _EPOCH_BEGUN].max())
        if begun[begun[:, _EPOCH_BEGUN] == latest, _FINISHED].all():
            return Instruction(latest + 1)
        given = self.instruction()
        return given if latest == given.epoch else Instruction(latest)

    def begin(self, slot: int, epoch: int, iteration: int = 0) -> int:
        """Record that ``slot`` begins playing ``epoch`` under the current instruction, in ``iteration`` (see
        :meth:`upcoming`); that generation."""
        generation = self.generation
        at = _SLOTS + _WIDTH * slot
        self._values[at + _EPOCH_BEGUN], self._values[at + _FINISHED] = epoch, 0
        self._values[at + _ITERATION] = iteration
        self._values[at + _SEEN] = generation  # last: a slot seen under this generation has its other fields
        return generation

    def finish(self, slot: int) -> None:
        """Record that ``slot`` has played its share of the epoch it began."""
        self._values[_SLOTS + _WIDTH * slot + _FINISHED] = 1

    def _slots(self) -> np.ndarray:
        """A copy of every slot, one row each: generation seen, epoch begun, finished, iteration."""
        return self._values[_SLOTS:].reshape(-1, _WIDTH).copy()


_LIVE: weakref.WeakSet[Control] = weakref.WeakSet()


def _own_before_fork() -> None:
    # a process forking DataLoader workers before it used a block it received: the workers inherit its own
    # copy
    for control in list(_LIVE):
        control.own()


os.register_at_fork(before=_own_before_fork)


def extra_mark(extra: dict[str, Any]) -> int:
    """A 63-bit hash of a state's ``extra`` (0 for none), so a worker can tell whether it plans with the
    same."""
    if not extra:
        return 0
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def slot_of(worker: int | None, num_workers: int) -> int:
    """The slot of DataLoader worker ``worker`` (``None``: the training process iterating itself)."""
    if worker is None:
        return 0
    if num_workers > MAX_WORKERS:
        raise OptionError(
            f"{num_workers} DataLoader workers per rank; shardio supports at most {MAX_WORKERS}"
        )
    return 1 + worker
