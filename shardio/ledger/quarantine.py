"""Quarantine at resume: continue an epoch without some samples, keeping exactly-once for all the others.

:func:`quarantine` is surgery on a saved loader state (pure: it returns a new state dict, JSON-ready),
which then loads like any other state. The semantics:

- **What is left out.** The given ``keys`` (resolved to sample ids through the dataset's index; a key that
  several corpora of a mix share is left out in each) and the samples of every rank's batch at the given
  ``steps`` (epoch steps, counted as :mod:`shardio.ledger.trace` counts them: batches per rank since the epoch's
  start, across elastic segments). In a mix, every occurrence of a quarantined sample is left out.
- **From where.** From the state's position on: the position becomes a finished segment of the epoch's
  history (as an elastic resume does) and the rest of the epoch is re-planned without the quarantined
  samples, for the world that loads the state. Every sample the epoch still held that is not quarantined
  is consumed exactly once in the rest of it, and every rank keeps the same number of batches. Samples
  already consumed before the position (a step that was already trained on) stay consumed: quarantining
  them changes nothing in this epoch (the report says so), only later epochs with ``carry``.
- **Later epochs.** With ``carry=True`` the samples are left out of every later epoch too (from its
  start); by default they come back at the next epoch.
- **Record.** The state's ``extra["quarantine"]`` lists each quarantine: its epoch, segment number,
  ids, keys, steps and ``carry``; states saved later keep it. :func:`quarantine_report` lists it.

The same entries, marked ``ahead``, leave out of the rest of an epoch the samples that a state's DataLoader
workers consumed ahead of its position (:func:`leave_out_consumed`): consumed, not quarantined, so the report
leaves them out.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError, StateError, shown
from ..planning.plan import EpochPlan, Segment
from ..state import LoaderState, job_state
from ..checks.states import MAX_HISTORY

if TYPE_CHECKING:
    from ..dataset import ShardDataset

__all__ = ["quarantine", "quarantine_report", "exclusions", "check_extra", "leave_out_consumed", "consumed_ahead",
           "resolve_keys"]

_KEY = "quarantine"


def resolve_keys(keys: Sequence[str], dataset_keys: Sequence[str]) -> dict[str, list[int]]:
    """The sample ids of each of ``keys`` (several where a mix's corpora share a key), with an
    :class:`OptionError` naming the keys the index does not hold."""
    wanted: dict[str, list[int]] = {key: [] for key in keys}
    if len(wanted) <= 16 and isinstance(dataset_keys, list):  # a few keys: list.index scans in C
        for key, found in wanted.items():
            at = -1
            try:
                while True:
                    at = dataset_keys.index(key, at + 1)
                    found.append(at)
            except ValueError:
                pass
    else:
        for i, key in enumerate(dataset_keys):
            if key in wanted:
                wanted[key].append(i)
    missing = [key for key, ids in wanted.items() if not ids]
    if missing:
        raise OptionError(f"{len(missing)} keys are not in the dataset's index: {missing[:10]}")
    return wanted


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
        _check_entry(entry, number)
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


def quarantine(state: Mapping[str, Any], dataset: ShardDataset, *, keys: Iterable[str] = (),
               steps: tuple[int, int] | None = None, carry: bool = False) -> dict[str, Any]:
    """A copy of ``state`` that resumes without ``keys`` and the batches of ``steps`` (``(first, stop)``,
    every rank's) in the rest of the state's epoch, and in later ones with ``carry``.

    ``state`` is a shardio state (or a whole ``StatefulDataLoader`` state) saved from ``dataset``'s data
    and options. See the module docs for the exact semantics.
    """
    from .trace import Trace

    loaded = job_state(state)
    if isinstance(keys, (str, bytes)):
        raise OptionError(f"keys must be a list of keys, not one {type(keys).__name__} ({reprlib.repr(keys)})")
    keys = list(dict.fromkeys(keys))
    if not keys and steps is None:
        raise OptionError("quarantine needs keys or steps to leave out")
    if len(loaded.history) >= MAX_HISTORY:
        raise StateError(f"the state's epoch {loaded.epoch} already has {len(loaded.history)} history segments, "
                         f"the most a state keeps ({MAX_HISTORY}); a quarantine adds one: quarantine at a state of "
                         "a later epoch")
    trace = Trace(dataset, state)
    ids: list[int] = []
    first = stop = 0
    if keys:
        ids = [i for found in resolve_keys(keys, dataset.index.keys).values() for i in found]
    if steps is not None:
        pair = tuple(steps) if isinstance(steps, (tuple, list)) else ()
        if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair) \
                or not 0 <= pair[0] < pair[1]:
            raise OptionError(f"steps must be (first, stop) with 0 <= first < stop, not {reprlib.repr(steps)}")
        first, stop = pair
        for record in trace.steps(loaded.epoch, first, stop):
            ids.extend(int(i) for i in record.ids)
    unique = sorted(set(ids))
    segment = len(loaded.history) + 1
    entry: dict[str, Any] = {"epoch": loaded.epoch, "segment": segment, "ids": unique,
                             "keys": [dataset.index.keys[i] for i in unique],
                             "steps": [int(first), int(stop)] if steps is not None else None, "carry": bool(carry),
                             "from_step": trace.position_step(), "consumed": _consumed(trace, unique)}
    corpora = [dataset._fields(i).get("corpus") for i in unique]
    if any(corpora):
        entry["corpora"] = corpora
    extra = dict(loaded.extra)
    extra[_KEY] = [*extra.get(_KEY, []), entry]
    position = loaded.position
    history = (*loaded.history, Segment(loaded.world_size, position))
    return replace(loaded, history=history, start=0, yielded=0, extra=extra).to_dict()


def _consumed(trace: Any, ids: list[int]) -> list[int]:
    """Which of ``ids`` the epoch had already consumed at the state's position (they stay consumed)."""
    state = trace.state
    done: set[int] = set()
    segments = trace.segments(state.epoch)
    for number, (_, _, count) in enumerate(segments):
        consumed = count if number < len(segments) - 1 else state.position
        done.update(trace.plan(state.epoch, number).consumed_samples(consumed).tolist())
    for ahead in consumed_ahead(state.extra, state.epoch).values():
        done.update(ahead.tolist())
    return [i for i in ids if i in done]


def quarantine_report(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every quarantined sample of ``state``: key, id (and corpus, in a mix), epoch, the epoch step the
    quarantine took effect at, whether the epoch had already consumed it then, and whether it carries to
    later epochs."""
    loaded: LoaderState = job_state(state)
    entries = loaded.extra.get(_KEY, [])
    if not isinstance(entries, list):
        raise StateError(f"malformed loader state: extra.{_KEY} must be a list, not {type(entries).__name__}")
    rows = []
    for number, entry in enumerate(entries):
        _check_entry(entry, number)
        if entry.get("ahead"):
            continue
        consumed = set(entry.get("consumed") or [])
        corpora = entry.get("corpora") or [None] * len(entry["ids"])
        for key, sample_id, corpus in zip(entry["keys"], entry["ids"], corpora):
            rows.append({"key": key, "id": sample_id, **({"corpus": corpus} if corpus else {}),
                         "epoch": entry["epoch"], "from_step": entry.get("from_step"),
                         "already_consumed": sample_id in consumed, "steps": entry.get("steps"),
                         "carry": entry["carry"]})
    return rows


def _check_entry(entry: Any, number: int) -> None:
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
