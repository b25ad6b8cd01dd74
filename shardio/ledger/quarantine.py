"""Quarantine at resume: continue an epoch without some samples, keeping exactly-once for all the others.

:func:`quarantine` is surgery on a saved loader state (pure: it returns a new state dict, JSON-ready),
which then loads like any other state. The semantics:

- **What is left out.** The given ``keys`` (resolved to sample ids through the dataset's index; a key that
  several corpora of a mix share is left out in each) and the samples of every rank's batch at the given
  ``steps`` (epoch steps, counted as :mod:`shardio.ledger.trace` counts them: batches per rank since the
  epoch's start, across elastic segments). In a mix, every occurrence of a quarantined sample is left out.
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
workers consumed ahead of its position (:func:`~shardio.planning.exclusions.leave_out_consumed`): consumed,
not quarantined, so the report leaves them out.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks.states import MAX_HISTORY
from ..errors import OptionError, StateError
from ..jobstate import job_state
from ..planning.plan import Segment
from ..planning.surgery import Quarantine
from ..state import LoaderState
from .keyids import resolve_keys
from .trace import Trace

if TYPE_CHECKING:
    from ..datasets.dataset import ShardDataset

__all__ = ["quarantine", "quarantine_report"]


def quarantine(
    state: Mapping[str, Any],
    dataset: ShardDataset,
    *,
    keys: Iterable[str] = (),
    steps: tuple[int, int] | None = None,
    carry: bool = False,
) -> dict[str, Any]:
    """A copy of a state that resumes without some samples, in the rest of its epoch (and later ones with
    `carry`). See the module docs for the exact semantics.

    Args:
        state: A shardio state (or a whole `StatefulDataLoader` state) saved from the dataset's data and
            options.
        dataset: The dataset the state was saved from.
        keys: Sample keys to leave out (a list, not one string).
        steps: `(first, stop)`: the batches of these steps, every rank's, are left out too (with
            `Batching(step_batches=K)`, optimizer steps: every batch of each).
        carry: Leave the samples out of later epochs too (default: the rest of the state's epoch only).

    Returns:
        The new state, to load instead of `state`.

    Raises:
        OptionError: Nothing to leave out, one string for `keys`, a key not in the dataset, or bad steps.
        StateError: A state that does not fit the dataset, one with too many segments already, or (with
            `step_batches`) one inside an optimizer step: the rest is planned again as whole steps.
    """
    loaded = job_state(state)
    if isinstance(keys, (str, bytes)):
        raise OptionError(
            f"keys must be a list of keys, not one {type(keys).__name__} ({reprlib.repr(keys)})"
        )
    keys = list(dict.fromkeys(keys))
    if not keys and steps is None:
        raise OptionError("quarantine needs keys or steps to leave out")
    if len(loaded.history) >= MAX_HISTORY:
        raise StateError(
            f"the state's epoch {loaded.epoch} already has {len(loaded.history)} history segments, "
            f"the most a state keeps ({MAX_HISTORY}); a quarantine adds one: quarantine at a state of "
            "a later epoch"
        )
    stepped = loaded.step if loaded.num_workers == 1 else None
    if stepped is not None and stepped[1]:
        raise StateError(
            f"the state is at micro-batch {stepped[1]} of optimizer step {stepped[0]} of epoch "
            f"{loaded.epoch}: with step_batches the rest of the epoch is planned again as whole steps, so "
            "quarantine at a state saved at a step's boundary"
        )
    trace = Trace(dataset, state)
    ids: list[int] = []
    first = stop = 0
    if keys:
        ids = [i for found in resolve_keys(keys, dataset.index.keys).values() for i in found]
    if steps is not None:
        pair = tuple(steps) if isinstance(steps, (tuple, list)) else ()
        if (
            len(pair) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair)
            or not 0 <= pair[0] < pair[1]
        ):
            raise OptionError(
                f"steps must be (first, stop) with 0 <= first < stop, not {reprlib.repr(steps)}"
            )
        first, stop = pair
        for record in trace.steps(loaded.epoch, first, stop):
            ids.extend(int(i) for i in record.ids)
    unique = sorted(set(ids))
    corpora = [trace.planner.corpus(i) for i in unique]
    entry = Quarantine(
        loaded.epoch,
        len(loaded.history) + 1,
        tuple(unique),
        carry=bool(carry),
        keys=tuple(dataset.index.keys[i] for i in unique),
        steps=(int(first), int(stop)) if steps is not None else None,
        from_step=trace.position_step(),
        consumed=tuple(_consumed(trace, unique)),
        corpora=tuple(c or "" for c in corpora) if any(corpora) else None,
    )
    surgery = trace.surgery.with_quarantines((*trace.surgery.quarantines, entry))
    history = (*loaded.history, Segment(loaded.world_size, loaded.position, loaded.nodes))
    return replace(loaded, history=history, start=0, yielded=0, extra=surgery.to_extra()).to_dict()


def _consumed(trace: Trace, ids: list[int]) -> list[int]:
    """Which of ``ids`` the epoch had already consumed at the state's position (they stay consumed)."""
    state = trace.state
    done: set[int] = set()
    for number in range(len(trace.segments(state.epoch))):
        consumed = state.history[number].consumed if number < len(state.history) else state.position
        done.update(trace.plan(state.epoch, number).consumed_samples(consumed).tolist())
    for ahead in trace.surgery.consumed_ahead(state.epoch).values():
        done.update(ahead.tolist())
    return [i for i in ids if i in done]


def quarantine_report(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every quarantined sample of a state.

    Args:
        state: A state `quarantine` returned (or one saved after it was loaded).

    Returns:
        One row a sample: key, id (and corpus, in a mix), epoch, the epoch step the quarantine took effect
        at, whether the epoch had already consumed it then, and whether it carries to later epochs.

    Raises:
        StateError: A malformed state.
    """
    loaded: LoaderState = job_state(state)
    rows = []
    for number, entry in enumerate(loaded.surgery.quarantines):
        if entry.ahead:
            continue
        if entry.keys is None:
            raise StateError(
                f"malformed loader state: quarantine entry {number}: 'keys' must be a list of "
                f"{len(entry.ids)} strings, one per id"
            )
        consumed = set(entry.consumed or ())
        corpora = entry.corpora or (None,) * len(entry.ids)
        for key, sample_id, corpus in zip(entry.keys, entry.ids, corpora):
            rows.append(
                {
                    "key": key,
                    "id": sample_id,
                    **({"corpus": corpus} if corpus else {}),
                    "epoch": entry.epoch,
                    "from_step": entry.from_step,
                    "already_consumed": sample_id in consumed,
                    "steps": None if entry.steps is None else list(entry.steps),
                    "carry": entry.carry,
                }
            )
    return rows
