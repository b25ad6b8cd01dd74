"""The data ledger: which samples every rank's batch held at any step, answered offline from the plan.

Every decision of the loader is a pure function of the index, the seed and the options a saved state
records, so :class:`Trace` answers "which keys did rank 3 train on at step 41,207?" and "when was
utterance X seen?" without reading a byte of audio. It plans with the dataset's own planner
(``dataset.planner``, a :class:`~shardio.Planner`: mixes, quarantines and re-mixes included) and follows the
epoch's elastic history exactly as the loader played it.

**Steps.** ``step`` (the *epoch step*) counts batches per rank from 0 at the start of each epoch, across
elastic segments (a trainer's global step, counted across epochs, maps to one with :meth:`Trace.epoch_step`):
segment ``i`` of the state's history (``world_size``, ``consumed``) covers the steps after the earlier
segments' ``consumed``; the last (current) segment runs under the state's world size to the end of the epoch.
A yielded batch's ``batch_index`` is its index within its segment, so ``step = batch_index`` + the batches
of the earlier segments (the two agree when the world never changed). Epochs other than the state's are
traced as planned from their start under the state's world size: the state records the elastic history
of its own epoch only.

With ``Batching(step_batches=K)`` a step is an *optimizer step* (``K / world_size`` batches per rank, its
``micro_batch`` 0, 1, ...): step ``S`` names the same samples whichever world played it.

**Consumed ahead.** Where the state resumed one saved between rounds of DataLoader workers that batch samples
(:func:`~shardio.planning.exclusions.leave_out_consumed`), the batches its workers consumed beyond the
segment's position are records too, marked ``ahead``: their step is their place in that segment's plan, a
number the next segment's steps also use.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError
from ..jobstate import job_state
from ..planning.plan import EpochPlan
from ..planning.repeats import Repeats
from ..state import LoaderState
from .keyids import resolve_keys
from .segmentplans import SegmentPlans, check_epoch
from .steprecord import StepRecord, sample_marks

if TYPE_CHECKING:
    from ..datasets.dataset import ShardDataset

__all__ = ["Trace", "StepRecord", "MAX_FIND_EPOCHS"]

MAX_FIND_EPOCHS = 1000
"""The most epochs one :meth:`Trace.find` (``shardio trace --key --epochs N``) searches. Each epoch searched
is planned in full (a key is in every epoch, so nothing can be skipped, and each adds rows to the answer): the
work is N plans. A training run has tens to hundreds of epochs; 1000 covers any of them and bounds a question
to 1000 plans (not the hours and memory of ``--epochs 100000000``). Search further from
a later epoch's state."""


class Trace:
    """A dataset's ledger as the job that saved a state plays it: which samples every rank gets at every step.

    Args:
        dataset: The job's `ShardDataset` or `MixedDataset`, unchanged (only its planner answers), so a live
            dataset may be traced mid-run.
        state: A state the job saved (its world size and history say how the epochs were played).

    Raises:
        StateError: ``state`` was not saved from ``dataset`` (see
            :meth:`~shardio.planning.planner.Planner.check`).
    """

    def __init__(self, dataset: ShardDataset, state: Mapping[str, Any]) -> None:
        self.state: LoaderState = job_state(state)
        self.dataset = dataset
        self.planner = dataset.planner
        self.surgery = self.state.surgery
        self._segments = SegmentPlans(self.planner, self.state)
        self._stepped = self.planner.batching.step_batches is not None

    # -- the plan, segment by segment -----------------------------------------------------------------

    def segments(self, epoch: int) -> list[tuple[int, int, int]]:
        """`(world_size, first step, steps)` of each segment of an epoch, in order.

        Args:
            epoch: The epoch.
        """
        return self._segments.segments(epoch)

    def plan(self, epoch: int, segment: int) -> EpochPlan:
        """The loader's plan of one segment of an epoch.

        Args:
            epoch: The epoch.
            segment: The segment's number, from 0 (`segments` lists them).
        """
        return self._segments.plan(epoch, segment)

    def ahead(self, epoch: int, segment: int) -> np.ndarray:
        """The batch indices of a segment that its workers consumed ahead of its position.

        Args:
            epoch: The epoch.
            segment: The segment's number, from 0.
        """
        return self._segments.ahead(epoch, segment)

    def epoch_step(self, global_step: int) -> tuple[int, int]:
        """The ``(epoch, epoch step)`` of a trainer's global step: the batches every rank trained before it
        since epoch 0's first (Lightning's ``trainer.global_step`` while it trains that batch; a loop that
        adds 1 after each batch, from 0, holds it before the add). Each epoch's length is its plan's, which
        varies with duration batching, under the world sizes the state records for its epoch and the state's
        world size for the others: a run whose earlier epochs ran on another world size, or were cut
        short, is not described.

        Args:
            global_step: the trainer's step, from 0 across epochs.

        Returns:
            ``(epoch, step)``, the step counted from 0 at that epoch's start.

        Raises:
            OptionError: not an integer from 0, or beyond :data:`MAX_FIND_EPOCHS` epochs.
        """
        if isinstance(global_step, bool) or not isinstance(global_step, (int, np.integer)) or global_step < 0:
            raise OptionError(f"a global step is an integer from 0, not {global_step!r}"[:200])
        left = int(global_step)
        for epoch in range(MAX_FIND_EPOCHS):
            cached = self._segments.planned()
            length = sum(count for _, _, count in self.segments(epoch))
            if left < length:
                return epoch, left
            left -= length
            self._segments.forget_since(cached)  # one epoch's plans held at a time
        raise OptionError(f"global step {global_step} is beyond the first {MAX_FIND_EPOCHS} epochs")

    def global_step(self, epoch: int, step: int) -> int:
        """The global step of ``step`` of ``epoch``: the inverse of :meth:`epoch_step`, under its assumption.

        Args:
            epoch: the epoch.
            step: the epoch step, from 0.

        Returns:
            The batches per rank of the epochs before ``epoch``, plus ``step``.

        Raises:
            OptionError: ``epoch`` beyond :data:`MAX_FIND_EPOCHS` (each epoch before it is planned).
        """
        check_epoch(epoch)
        if epoch > MAX_FIND_EPOCHS:
            raise OptionError(
                f"epoch {epoch} is beyond the first {MAX_FIND_EPOCHS} epochs a global step maps"
            )
        before = 0
        for earlier in range(epoch):
            cached = self._segments.planned()
            before += sum(count for _, _, count in self.segments(earlier))
            self._segments.forget_since(cached)
        return before + int(step)

    def position_step(self) -> int:
        """The epoch step the state stands at (the next batch's; with ``step_batches`` an optimizer step)."""
        stepped = self.state.step
        return (
            stepped[0]
            if stepped is not None
            else sum(s.consumed for s in self.state.history) + self.state.position
        )

    # -- questions ------------------------------------------------------------------------------------

    def steps(
        self, epoch: int, first: int, stop: int | None = None, rank: int | None = None
    ) -> list[StepRecord]:
        """Every rank's (or one rank's) batch at a run of steps (steps or a rank that are not integers, or
        beyond the epoch, are an `OptionError`).

        Args:
            epoch: The epoch.
            first: The first step.
            stop: The step after the last (default: `first + 1`).
            rank: Only this rank (default: every rank).
        """
        stop = first + 1 if stop is None else stop
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in (first, stop, rank or 0)):
            raise OptionError(f"steps and rank must be integers, not {first!r}, {stop!r}, {rank!r}"[:200])
        if first < 0 or stop <= first:
            raise OptionError(f"steps must satisfy 0 <= first < stop, not {first} and {stop}")
        records = []
        for number, (world_size, start, count) in enumerate(self.segments(epoch)):
            dealt = self._segments.dealt(epoch, number, start, count, first, stop)
            if not dealt:
                continue
            if rank is not None and not 0 <= rank < world_size:
                raise OptionError(f"rank {rank} is not in segment {number}'s world of {world_size}")
            plan, each = self.plan(epoch, number), self._segments.accumulation(world_size)
            repeats = Repeats(plan)
            for j, ahead in dealt:
                for r in range(world_size) if rank is None else (rank,):
                    at = (epoch, start + j // each, number, j, r, world_size)
                    marks = sample_marks(plan, repeats, r, j)
                    records.append(StepRecord(*at, plan.batch(r, j), ahead, j % each, *marks))
        records.sort(key=lambda record: (record.step, record.ahead, record.rank, record.micro_batch))
        if not records:
            total = sum(count for _, _, count in self.segments(epoch))
            raise OptionError(f"epoch {epoch} has {total} steps; none in [{first}, {stop})")
        return records

    def epoch(self, epoch: int) -> Iterator[StepRecord]:
        """Every (step, rank) batch of an epoch, segment by segment in step order (a segment's batches
        consumed ahead after its others). A bad epoch is an `OptionError` here, before any record.

        Args:
            epoch: The epoch.
        """
        segments = self.segments(epoch)

        def records() -> Iterator[StepRecord]:
            for number, (world_size, start, count) in enumerate(segments):
                plan, each = self.plan(epoch, number), self._segments.accumulation(world_size)
                repeats = Repeats(plan)
                for j, ahead in self._segments.dealt(epoch, number, start, count):
                    for r in range(world_size):
                        at = (epoch, start + j // each, number, j, r, world_size)
                        marks = sample_marks(plan, repeats, r, j)
                        yield StepRecord(*at, plan.batch(r, j), ahead, j % each, *marks)

        return records()

    def find(self, keys: Sequence[str], epochs: Iterable[int]) -> list[dict[str, Any]]:
        """Every `(epoch, step, rank)` at which each key is (or was) in a batch.

        Args:
            keys: Sample keys (a list, not one string).
            epochs: The epochs to search (at most `MAX_FIND_EPOCHS`).
        """
        if isinstance(keys, (str, bytes)):
            raise OptionError(f"keys must be a list of keys, not one {type(keys).__name__} ({keys!r:.100})")
        chosen = list(islice(iter(epochs), MAX_FIND_EPOCHS + 1))  # never more than the limit is read
        if len(chosen) > MAX_FIND_EPOCHS:
            asked = len(epochs) if isinstance(epochs, Sized) else "more"
            raise OptionError(
                f"find searches at most {MAX_FIND_EPOCHS} epochs at a time (each is planned in "
                f"full), not {asked}: search fewer, or from a later epoch's state"
            )
        for epoch in chosen:  # every epoch checked before any is planned
            check_epoch(epoch)
        wanted = resolve_keys(keys, self.dataset.index.keys)
        key_of = {i: key for key, ids in wanted.items() for i in ids}
        ids = np.fromiter(key_of, dtype=np.int64)
        found = []
        cached = self._segments.planned()
        for epoch in chosen:
            self._segments.forget_since(cached)  # one epoch's plans held at a time
            for number, (world_size, start, steps) in enumerate(self.segments(epoch)):
                plan, each = self.plan(epoch, number), self._segments.accumulation(world_size)
                count = steps * each  # batches per rank
                positions = np.flatnonzero(np.isin(plan.samples, ids))
                if positions.shape[0] == 0:
                    continue
                batches = np.searchsorted(plan.offsets, positions, side="right") - 1
                ahead = self.ahead(epoch, number)
                dealt = plan.rank_batches[:, :count]
                order = np.argsort(dealt, axis=None, kind="stable")  # where each batch is dealt: O(n log n)
                flat = dealt.ravel()[order]
                lows = np.searchsorted(flat, batches, side="left").tolist()
                highs = np.searchsorted(flat, batches, side="right").tolist()
                for position, batch, low, high in zip(positions.tolist(), batches.tolist(), lows, highs):
                    places = [(at // count, at % count, False) for at in order[low:high].tolist()]
                    if ahead.shape[0]:
                        places += [
                            (r, int(ahead[k]), True)
                            for r, k in np.argwhere(plan.rank_batches[:, ahead] == batch).tolist()
                        ]
                    for r, j, early in places:
                        sample = int(plan.samples[position])
                        found.append(
                            {
                                "key": key_of[sample],
                                "epoch": epoch,
                                "step": start + j // each,
                                "rank": r,
                                "segment": number,
                                "batch_index": j,
                                **({"micro_batch": j % each} if self._stepped else {}),
                                **({"ahead": True} if early else {}),
                                **self.planner.fields(sample),
                            }
                        )  # a mix adds the corpus
        return sorted(found, key=lambda row: (row["epoch"], row["step"], row["rank"], row["key"]))

    def row(self, record: StepRecord) -> dict[str, Any]:
        """A step record as a JSON-ready dict: its place, and its samples' keys, durations (and corpora).

        Args:
            record: A record from `steps` or `epoch`.
        """
        index = self.dataset.index
        ids = record.ids.tolist()
        row: dict[str, Any] = {
            "epoch": record.epoch,
            "step": record.step,
            "rank": record.rank,
            "segment": record.segment,
            "batch_index": record.batch_index,
            **({"micro_batch": record.micro_batch} if self._stepped else {}),
            "world_size": record.world_size,
            "keys": [index.keys[i] for i in ids],
            "durations": [
                round(float(d), 4) for d in index.durations_of(np.asarray(record.ids, dtype=np.int64))
            ],
        }
        corpora = [self.planner.corpus(i) for i in ids]
        if any(c is not None for c in corpora):
            row["corpus"] = corpora
        if record.passes is not None:
            row["corpus_pass"] = record.passes.tolist()
        if record.repeat is not None and record.repeat.any():
            row["repeat"] = record.repeat.tolist()  # padding only (a mix's re-passes are corpus_pass)
        if record.ahead:
            row["ahead"] = True
        return row
