"""A saved state's quarantine entries (``extra["quarantine"]``) as the planner reads them: checked when a state
loads, the ``exclude`` of an epoch's plan, and the entries that leave out samples a state's DataLoader workers
consumed ahead of its position. The ledger (:mod:`shardio.ledger.quarantine`) writes the entries; the datasets
and the ledger read them from here, so that the datasets import nothing from the ledger.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import StateError
from .plan import EpochPlan

__all__ = ["QUARANTINE", "check_extra", "exclusions", "leave_out_consumed", "consumed_ahead"]

QUARANTINE = "quarantine"
"""The key of a state's ``extra`` that holds its quarantine entries."""
_KEY = QUARANTINE


def check_extra(extra: Mapping[str, Any], num_samples: int) -> dict[str, Any]:
    """``extra`` of a loaded state, its quarantine entries checked (a :class:`StateError` if malformed)."""
    entries = extra.get(_KEY, [])
    if not isinstance(entries, list):
        raise StateError(f"malformed loader state: extra.{_KEY} must be a list, not {type(entries).__name__}")
    for number, entry in enumerate(entries):
        try:
            ids = [int(i) for i in entry["ids"]]
            fields_ok = (int(entry["epoch"]) >= 0 and int(entry["segment"]) >= 0
                         and isinstance(entry["carry"], bool))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise StateError(f"malformed loader state: quarantine entry {number}: {exc!r}") from None
        if not fields_ok or any(not 0 <= i < num_samples for i in ids):
            raise StateError(f"malformed loader state: quarantine entry {number} has a negative field or an "
                             f"id outside the dataset's {num_samples} samples")
    return dict(extra)


def exclusions(extra: Mapping[str, Any], epoch: int) -> list[tuple[int, np.ndarray]]:
    """The planner's ``exclude`` for ``epoch``: ``(segment number, ids)`` pairs (see the module docs), one per
    segment: the planner does O(epoch) work per pair, so a state's many entries (each a few values of
    ``extra``) must not each cost a pass over the epoch."""
    found: dict[int, list[np.ndarray]] = {}
    for entry in extra.get(_KEY, []):
        if int(entry["epoch"]) == epoch:
            found.setdefault(int(entry["segment"]), []).append(np.asarray(entry["ids"], dtype=np.int64))
        elif entry["carry"] and int(entry["epoch"]) < epoch:
            found.setdefault(0, []).append(np.asarray(entry["ids"], dtype=np.int64))
    return [(segment, np.unique(np.concatenate(parts))) for segment, parts in sorted(found.items())]


def leave_out_consumed(extra: Mapping[str, Any], plan: EpochPlan, positions: Sequence[int], *, position: int,
                       epoch: int, segment: int, keys: Sequence[str]) -> dict[str, Any]:
    """``extra`` with an entry that leaves out of ``epoch``, from history segment ``segment`` on, the samples of
    every rank's batches at ``positions`` of ``plan`` (the segment before it), which workers consumed ahead of
    a state at ``position`` (:func:`shardio.state.split`). Such entries of earlier epochs are dropped.

    An entry leaves out every occurrence of its samples, so one that also occurs in a batch not yet consumed (a
    mix's sample drawn twice in the epoch) is a :class:`StateError`, not a lost sample."""
    if max(positions) >= plan.num_batches:
        raise StateError(f"the workers' states consumed batch {max(positions)} of epoch {epoch}, whose plan has "
                         f"{plan.num_batches} batches per rank")
    ahead = np.zeros(plan.num_batches, dtype=bool)
    ahead[list(positions)] = True
    pending = ~ahead
    pending[:position] = False
    ids, later = _samples_of(plan, plan.rank_batches[:, ahead]), _samples_of(plan, plan.rank_batches[:, pending])
    again = np.intersect1d(ids, later)
    if again.shape[0]:
        raise StateError(f"the workers' states consumed {len(again)} samples ahead of their position (e.g. "
                         f"{reprlib.repr(keys[int(again[0])])}) that epoch {epoch} draws again later, so they cannot "
                         "be left out of the rest: load the state with the loader's own load_state_dict, or use a "
                         "state saved after a whole round of workers")
    ids = ids.tolist()
    entry = {"epoch": epoch, "segment": segment, "ids": ids, "keys": [keys[i] for i in ids], "steps": None,
             "carry": False, "consumed": ids, "ahead": True}
    kept = [e for e in extra.get(_KEY, []) if not (e.get("ahead") and int(e["epoch"]) < epoch)]
    return {**extra, _KEY: [*kept, entry]}


def consumed_ahead(extra: Mapping[str, Any], epoch: int) -> dict[int, np.ndarray]:
    """The samples of ``epoch`` that workers consumed ahead of a state's position (:func:`leave_out_consumed`),
    by the history segment that consumed them (the one before the segment their entry leaves them out of)."""
    found: dict[int, list[int]] = {}
    for entry in extra.get(_KEY, []):
        if entry.get("ahead") and int(entry["epoch"]) == epoch:
            found.setdefault(int(entry["segment"]) - 1, []).extend(int(i) for i in entry["ids"])
    return {segment: np.unique(np.asarray(ids, dtype=np.int64)) for segment, ids in found.items()}


def _samples_of(plan: EpochPlan, batches: np.ndarray) -> np.ndarray:
    """The sample ids of global batches ``batches`` of ``plan``, each once, sorted."""
    taken = np.zeros(plan.offsets.shape[0] - 1, dtype=bool)
    taken[batches.ravel()] = True
    return np.unique(plan.samples[np.repeat(taken, np.diff(plan.offsets))])
