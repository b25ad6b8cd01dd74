"""Surgery: what a saved state changes in its plans, as typed values: its quarantines and its re-mix.

A state's ``extra`` (JSON) holds them: ``extra["quarantine"]``, a list of :class:`Quarantine` entries (samples
left out of an epoch from a history segment on, by :func:`shardio.quarantine`, or consumed ahead of a state's
position by its DataLoader workers), and ``extra["remix"]``, the current mix's streams
(:class:`~shardio.planning.mixstreams.Streams`, by :func:`shardio.remix`). :meth:`Surgery.of` parses and
bounds them when a state is read (:class:`~shardio.state.LoaderState`); the planner
(:class:`~shardio.planning.planner. Planner`) consumes them; the ledger writes them
(:meth:`Surgery.to_extra`). The JSON form is unchanged from the states shardio wrote before these types, so
every saved state reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..checks.states import MAX_COUNT
from ..errors import OptionError, StateError, shown
from .mixstreams import REMIX, Streams

__all__ = ["QUARANTINE", "Quarantine", "Surgery", "check_surgery"]

QUARANTINE = "quarantine"
"""The key of a state's ``extra`` that holds its quarantine entries."""


@dataclass(frozen=True)
class Quarantine:
    """Samples left out of epoch ``epoch`` from history segment ``segment`` on (and of every later epoch, from
    its start, with ``carry``). ``ahead``: samples a state's DataLoader workers consumed ahead of its
    position, not a quarantine (reports leave them out). The other fields are what the report shows."""

    epoch: int
    segment: int
    ids: tuple[int, ...]
    carry: bool = False
    ahead: bool = False
    keys: tuple[str, ...] | None = None
    steps: tuple[int, ...] | None = None
    """``(first, stop)``: the epoch steps whose batches a quarantine left out (only shown in its report)."""
    from_step: int | None = None
    consumed: tuple[int, ...] | None = None
    corpora: tuple[str, ...] | None = None

    @classmethod
    def of(cls, entry: Any, number: int) -> Quarantine:
        """Entry ``number`` of ``extra["quarantine"]``.

        Args:
            entry: The entry as the state holds it (JSON).
            number: Its place in the list, for messages.

        Returns:
            The typed entry.

        Raises:
            StateError: Naming the entry and what is wrong with it, where it is not an object with ids
                (integers), keys (strings, one per id), corpora (in a mix, one per id), an epoch and a segment
                (integers >= 0), carry (true or false) and consumed (ids, or null).
        """
        if not isinstance(entry, Mapping):
            raise StateError(
                f"malformed loader state: quarantine entry {number} must be an object, not "
                f"{type(entry).__name__}"
            )

        def problem(text: str) -> StateError:
            return StateError(f"malformed loader state: quarantine entry {number}: {text}")

        ids, keys, corpora = entry.get("ids"), entry.get("keys"), entry.get("corpora")
        if not (isinstance(ids, list) and all(type(i) is int for i in ids)):
            raise problem(f"'ids' must be a list of integers, not {shown(ids, 80)}")
        if not (isinstance(keys, list) and len(keys) == len(ids) and all(isinstance(k, str) for k in keys)):
            raise problem(f"'keys' must be a list of {len(ids)} strings, one per id")
        if corpora is not None and not (
            isinstance(corpora, list)
            and len(corpora) == len(ids)
            and all(isinstance(c, str) for c in corpora)
        ):
            raise problem(f"'corpora' must be a list of {len(ids)} corpus names, one per id")
        for name in ("epoch", "segment"):
            if not _count(entry.get(name)):
                raise problem(f"'{name}' must be an integer >= 0, not {shown(entry.get(name), 80)}")
        epoch, segment, carry = entry["epoch"], entry["segment"], entry.get("carry")
        if not isinstance(carry, bool):
            raise problem(f"'carry' must be true or false, not {shown(carry, 80)}")
        consumed, steps = entry.get("consumed"), entry.get("steps")
        if consumed is not None and not (
            isinstance(consumed, list) and all(type(i) is int for i in consumed)
        ):
            raise problem(f"'consumed' must be a list of ids, not {shown(consumed, 80)}")
        if steps is not None and not (
            isinstance(steps, list) and len(steps) <= 2 and all(map(_count, steps))
        ):
            raise problem("'steps' must be [first, stop] integers, or null")
        from_step = entry.get("from_step")
        if from_step is not None and not _count(from_step):
            raise problem("'from_step' must be an integer from 0, or null")
        return cls(
            epoch,
            segment,
            tuple(ids),
            carry,
            bool(entry.get("ahead")),
            tuple(keys),
            None if steps is None else tuple(steps),
            from_step,
            None if consumed is None else tuple(consumed),
            None if corpora is None else tuple(corpora),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready entry."""
        entry: dict[str, Any] = {"epoch": self.epoch, "segment": self.segment, "ids": list(self.ids)}
        if self.keys is not None:
            entry["keys"] = list(self.keys)
        entry.update(steps=None if self.steps is None else list(self.steps), carry=self.carry)
        if self.from_step is not None:
            entry["from_step"] = self.from_step
        if self.consumed is not None:
            entry["consumed"] = list(self.consumed)
        if self.corpora is not None:
            entry["corpora"] = list(self.corpora)
        if self.ahead:
            entry["ahead"] = True
        return entry


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


@dataclass(frozen=True)
class Surgery:
    """A state's quarantines and re-mix (``streams``: ``None`` where it has none), and any other entries of
    its ``extra`` (``other``, kept as they are)."""

    quarantines: tuple[Quarantine, ...] = ()
    streams: Streams | None = None
    other: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, extra: Mapping[str, Any]) -> Surgery:
        """Parse a state's ``extra``, with a :class:`StateError` for anything malformed."""
        if not isinstance(extra, Mapping):
            raise StateError(
                f"malformed loader state: field extra must be an object, not {type(extra).__name__}"
            )
        entries = extra.get(QUARANTINE, [])
        if not isinstance(entries, list):
            raise StateError(
                f"malformed loader state: extra.{QUARANTINE} must be a list, not {type(entries).__name__}"
            )
        quarantines = tuple(Quarantine.of(entry, number) for number, entry in enumerate(entries))
        streams = Streams.of(extra) if extra.get(REMIX) is not None else None
        other = {name: value for name, value in extra.items() if name not in (QUARANTINE, REMIX)}
        return cls(quarantines, streams, other)

    def to_extra(self) -> dict[str, Any]:
        """The JSON-ready ``extra`` of a state."""
        extra = dict(self.other)
        if self.quarantines:
            extra[QUARANTINE] = [entry.to_dict() for entry in self.quarantines]
        if self.streams is not None:
            extra[REMIX] = self.streams.to_extra()
        return extra

    def __bool__(self) -> bool:
        return bool(self.quarantines or self.streams is not None or self.other)

    @property
    def mix_streams(self) -> Streams:
        """The current mix's streams (every stream at 0 from epoch 0 where the state has no re-mix)."""
        return self.streams if self.streams is not None else Streams.of({})

    def with_quarantines(self, entries: tuple[Quarantine, ...]) -> Surgery:
        """This surgery with ``entries`` as its quarantines."""
        return replace(self, quarantines=entries)

    def check_ids(
        self,
        num_samples: int,
        key_of: Callable[[int], str] | None = None,
        corpus_of: Callable[[int], str | None] | None = None,
    ) -> None:
        """Check the quarantines' ids against a dataset: an entry's ids are what the planner leaves out, its
        keys what the report names, so a hand-edited entry whose two disagree would leave out another sample
        than the one reported.

        Args:
            num_samples: The dataset's number of samples.
            key_of: The key of a sample id (called only for the ids of entries, so a state without any costs
                no key lookup); ``None``: keys not checked.
            corpus_of: In a mix, the corpus of a sample id; ``None``: corpora not checked.

        Raises:
            StateError: Naming the entry, where an id is outside the dataset or is not the sample its key
                (and corpus) names.
        """
        for number, entry in enumerate(self.quarantines):
            problem = None
            for at, sample_id in enumerate(entry.ids):
                if not 0 <= sample_id < num_samples:
                    problem = f"id {sample_id} is outside the dataset's {num_samples} samples"
                elif key_of is not None and entry.keys is not None and key_of(sample_id) != entry.keys[at]:
                    problem = (
                        f"id {sample_id} is the dataset's sample {shown(key_of(sample_id), 80)}, but the "
                        f"entry's key {at} is {shown(entry.keys[at], 80)}: its ids and keys must name "
                        "the same samples"
                    )
                elif (
                    corpus_of is not None
                    and entry.corpora is not None
                    and corpus_of(sample_id) != entry.corpora[at]
                ):
                    problem = (
                        f"id {sample_id} is of corpus {shown(corpus_of(sample_id), 80)}, but the entry's "
                        f"corpus {at} is {shown(entry.corpora[at], 80)}: its ids and corpora must agree"
                    )
                if problem is not None:
                    raise StateError(f"malformed loader state: quarantine entry {number}: {problem}")

    def exclusions(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """The planner's ``exclude`` for ``epoch``: ``(segment number, ids)`` pairs, one per segment (the
        planner does O(epoch) work per pair, so many entries must not each cost a pass over the epoch)."""
        found: dict[int, list[np.ndarray]] = {}
        for entry in self.quarantines:
            if entry.epoch == epoch:
                found.setdefault(entry.segment, []).append(np.asarray(entry.ids, dtype=np.int64))
            elif entry.carry and entry.epoch < epoch:
                found.setdefault(0, []).append(np.asarray(entry.ids, dtype=np.int64))
        return [(segment, np.unique(np.concatenate(parts))) for segment, parts in sorted(found.items())]

    def consumed_ahead(self, epoch: int) -> dict[int, np.ndarray]:
        """The samples of ``epoch`` that workers consumed ahead of a state's position, by the history segment
        that consumed them (the one before the segment their entry leaves them out of)."""
        found: dict[int, list[int]] = {}
        for entry in self.quarantines:
            if entry.ahead and entry.epoch == epoch:
                found.setdefault(entry.segment - 1, []).extend(entry.ids)
        return {segment: np.unique(np.asarray(ids, dtype=np.int64)) for segment, ids in found.items()}


def check_surgery(surgery: object) -> None:
    """An :class:`~shardio.errors.OptionError` unless ``surgery`` is a :class:`Surgery` (a planner's
    argument: a loaded state's :attr:`~shardio.LoaderState.surgery`)."""
    if not isinstance(surgery, Surgery):
        raise OptionError(f"surgery must be a loaded state's Surgery, not {shown(surgery)}")
