"""A saved state's quarantine entries (``extra["quarantine"]``) as the planner reads them: checked when a state
loads, the ``exclude`` of an epoch's plan, and the entries that leave out samples a state's DataLoader workers
consumed ahead of its position. The ledger (:mod:`shardio.ledger.quarantine`) writes the entries; the datasets
and the ledger read them from here, so that the datasets import nothing from the ledger.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import StateError, shown
from .plan import EpochPlan

__all__ = ["QUARANTINE", "check_entry", "check_extra", "exclusions", "leave_out_consumed", "consumed_ahead"]

QUARANTINE = "quarantine"
"""The key of a state's ``extra`` that holds its quarantine entries."""
_KEY = QUARANTINE


def check_extra(extra: Mapping[str, Any], num_samples: int, key_of: Callable[[int], str] | None = None,
                corpus_of: Callable[[int], str | None] | None = None) -> dict[str, Any]:
    """``extra`` of a loaded state, its quarantine entries checked against the dataset of ``num_samples``
    samples whose key of an id is ``key_of(id)`` (and corpus, in a mix, ``corpus_of(id)``; called only for the
    ids of entries, so a state without any costs no key lookup): a :class:`StateError` naming the entry
    and what is wrong with it, where a field is malformed, an id is outside the dataset, or an id is not the
    sample its key (and corpus) names: an entry's ids are what the planner leaves out, its keys what the
    report names, so a hand-edited entry whose two disagree would leave out another sample than the one
    reported."""
    entries = extra.get(_KEY, [])
    if not isinstance(entries, list):
        raise StateError(f"malformed loader state: extra.{_KEY} must be a list, not {type(entries).__name__}")
    for number, entry in enumerate(entries):
        check_entry(entry, number)
        problem = None
        for at, (sample_id, key) in enumerate(zip(entry["ids"], entry["keys"])):
            if not 0 <= sample_id < num_samples:
                problem = f"id {sample_id} is outside the dataset's {num_samples} samples"
            elif key_of is not None and key_of(sample_id) != key:
                problem = (f"id {sample_id} is the dataset's sample {shown(key_of(sample_id), 80)}, but the "
                           f"entry's key {at} is {shown(key, 80)}: its ids and keys must name the same "
                           "samples")
            elif corpus_of is not None and entry.get("corpora") is not None \
                    and corpus_of(sample_id) != entry["corpora"][at]:
                problem = (f"id {sample_id} is of corpus {shown(corpus_of(sample_id), 80)}, but the entry's "
                           f"corpus {at} is {shown(entry['corpora'][at], 80)}: its ids and corpora must "
                           "agree")
            if problem is not None:
                raise StateError(f"malformed loader state: quarantine entry {number}: {problem}")
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


def check_entry(entry: Any, number: int) -> None:
    """A :class:`StateError` saying what is wrong where quarantine entry ``number`` is not an object with ids
    (integers), keys (strings, one per id), corpora (in a mix, one per id), an epoch and a segment (integers
    >= 0), carry (true or false) and consumed (ids, or null)."""
    if not isinstance(entry, dict):
        raise StateError(f"malformed loader state: quarantine entry {number} must be an object, not "
                         f"{type(entry).__name__}")
    ids, keys, corpora = entry.get("ids"), entry.get("keys"), entry.get("corpora")
    problem = None
    if not (isinstance(ids, list) and all(type(i) is int for i in ids)):
        problem = f"'ids' must be a list of integers, not {shown(ids, 80)}"
    elif not (isinstance(keys, list) and len(keys) == len(ids) and all(isinstance(k, str) for k in keys)):
        problem = f"'keys' must be a list of {len(ids)} strings, one per id"
    elif corpora is not None and not (isinstance(corpora, list) and len(corpora) == len(ids)
                                      and all(isinstance(c, str) for c in corpora)):
        problem = f"'corpora' must be a list of {len(ids)} corpus names, one per id"
    else:
        for name in ("epoch", "segment"):
            value = entry.get(name)
            if type(value) is not int or value < 0:
                problem = f"'{name}' must be an integer >= 0, not {shown(value, 80)}"
                break
        else:
            if not isinstance(entry.get("carry"), bool):
                problem = f"'carry' must be true or false, not {shown(entry.get('carry'), 80)}"
            elif not (isinstance(consumed := entry.get("consumed") or [], list)
                      and all(type(i) is int for i in consumed)):
                problem = f"'consumed' must be a list of ids, not {shown(consumed, 80)}"
    if problem is not None:
        raise StateError(f"malformed loader state: quarantine entry {number}: {problem}")
