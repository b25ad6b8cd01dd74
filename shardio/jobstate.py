"""The job's state in a checkpoint: every shardio state it holds, combined into where the job stands.

A shardio state (:class:`~shardio.state.LoaderState`) may sit inside a ``StatefulDataLoader``'s state or a
trainer's checkpoint: :func:`find_states` finds each (a checkpoint that holds itself is walked, not looped
over). Inside a DataLoader worker ``yielded`` counts that worker's batches only; :func:`combine` adds up the
workers' states into the job position, where what they consumed together is the plan's first batches (it is
not when a DataLoader batches an unbatched dataset's samples with several workers, between rounds, and such
states are refused; :func:`split` describes them, for a dataset to resume without what they consumed ahead),
and :func:`job_state` adds the batches a ``StatefulDataLoader`` yielded after its last snapshot of them
(:func:`steps_after_snapshot`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .checks.states import MAX_COUNT
from .errors import StateError, shown
from .state import STATE_FORMAT, LoaderState

__all__ = ["combine", "find_states", "job_state", "loader_batch_size", "split", "steps_after_snapshot"]

_MAX_AHEAD = 1 << 20  # batches per rank that workers' states may have consumed beyond their common prefix


def _mappings(container: Any) -> Iterator[Mapping[Any, Any]]:
    """Every mapping inside ``container`` (nested in mappings, lists and tuples), each once: a checkpoint that
    holds itself (pickle allows it) is walked, not looped over. A shardio state's own fields are not
    entered."""
    seen: set[int] = set()
    stack = [container]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Mapping):
            yield item
            if item.get("format") != STATE_FORMAT:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def find_states(container: Any) -> list[LoaderState]:
    """Every shardio state inside ``container`` (a state, or a StatefulDataLoader's nested state dict).

    The container is a dict: a state, a ``StatefulDataLoader``'s state or a checkpoint holding one. A list at
    the top (``[state]``, say, a list of ranks' states) is a :class:`StateError`: one state describes the
    whole job, and which of several to take is not for the loader to guess."""
    if not isinstance(container, Mapping):
        raise StateError(
            f"not a shardio loader state: a saved state is a dict (a shardio state, a "
            f"StatefulDataLoader's state or a checkpoint dict holding one), not a "
            f"{type(container).__name__}"
        )
    return [
        LoaderState.from_dict(item) for item in _mappings(container) if item.get("format") == STATE_FORMAT
    ]


def combine(states: Iterable[LoaderState], steps_after: int = 0) -> LoaderState:
    """The job-level state from one job-level state, or from the states of all workers of one loader; plus
    ``steps_after`` batches the loader yielded after those states (:func:`steps_after_snapshot`).

    Workers take the plan's batches in turn (worker ``w`` those ``start + w``, ``start + w + num_workers``,
    ...), so the workers' states describe a position only where what they yielded together is the plan's
    first batches; anything else (a DataLoader that batches an unbatched dataset's samples, several at a time
    from one worker, between rounds of its workers) is a :class:`StateError` here. :func:`split` describes
    such states, for a dataset to resume without what they consumed ahead."""
    loaded, ahead = split(states, steps_after)
    if ahead:
        raise StateError(
            f"the workers' states do not describe a position of epoch {loaded.epoch}: beyond its first "
            f"{loaded.position} batches per rank they consumed {len(ahead)} more, out of plan order (a "
            "DataLoader that batches an unbatched dataset's samples takes them from one worker at a "
            "time). ds.load_state_dict resumes it; for the ledger, save ds.state_dict() after loading "
            "it there, or use a state saved after a whole round of workers"
        )
    return loaded


def split(states: Iterable[LoaderState], steps_after: int = 0) -> tuple[LoaderState, tuple[int, ...]]:
    """The job-level state at the longest prefix of the plan that ``states`` consumed (see :func:`combine`),
    and the positions beyond it that they consumed too (batches per rank of the state's segment, ascending).

    Workers' states consume a prefix of the plan when the DataLoader takes a batch from each worker in turn. A
    DataLoader that batches an unbatched dataset's samples takes several from one worker, so between rounds of
    its workers some have consumed samples that are ahead of others' (each rank alike: ranks consume the same
    number of batches from their workers in the same turn)."""
    states = list(states)
    if not states:
        raise StateError("not a shardio loader state: found no dict with format 'shardio-state' in it")
    first = states[0]
    if steps_after and first.options.get("batch_size") is None and first.options.get("max_duration") is None:
        raise StateError(
            f"this StatefulDataLoader state was saved {steps_after} step(s) after its last snapshot "
            "(snapshot_every_n_steps > 1) and its dataset is unbatched, so how many samples those "
            "steps took is not in it: save it at a snapshot step, or load it with the loader's own "
            "load_state_dict"
        )
    if len(states) == 1 and first.num_workers == 1:
        return (_at(first, first.position + steps_after) if steps_after else first), ()
    by_worker = {s.worker: s for s in states}
    shape = {(s.epoch, s.start, s.num_workers, s.history) for s in states}
    if len(shape) != 1 or len(by_worker) != first.num_workers or len(states) != first.num_workers:
        raise StateError(
            f"worker states do not describe one loader: {len(states)} states for "
            f"{first.num_workers} workers, epochs/starts {sorted((e, s) for e, s, _, _ in shape)}"
        )
    workers = first.num_workers
    taken = [by_worker[worker].yielded for worker in range(workers)]
    # worker w consumed positions w, w + workers, ... (from start): the prefix ends at the first one not
    # consumed
    prefix = min(worker + taken[worker] * workers for worker in range(workers))
    first_ahead = [
        -(-max(0, prefix - worker) // workers) for worker in range(workers)
    ]  # each worker's, by count
    beyond = sum(max(0, taken[worker] - first_ahead[worker]) for worker in range(workers))
    if beyond > _MAX_AHEAD:
        raise StateError(
            f"malformed loader state: its workers' states are {beyond} batches apart (they yielded "
            f"{shown(taken)}); a DataLoader's workers stay within a round of each other"
        )
    ahead = tuple(
        sorted(
            first.start + worker + count * workers
            for worker in range(workers)
            for count in range(first_ahead[worker], taken[worker])
        )
    )
    if ahead and steps_after:
        raise StateError(
            f"a StatefulDataLoader state {steps_after} step(s) after its snapshot whose workers' states "
            "consumed out of plan order: save it at a snapshot step"
        )
    return _at(first, first.start + prefix + steps_after), ahead


def _at(state: LoaderState, position: int) -> LoaderState:
    """``state.at(position)``, a position the control block holds."""
    if position > MAX_COUNT:
        raise StateError(
            f"malformed loader state: field yielded: the workers' states stand at batch {position} "
            f"of the segment, beyond {MAX_COUNT}"
        )
    return state.at(position)


def steps_after_snapshot(container: Any) -> int:
    """The batches a ``StatefulDataLoader`` with workers yielded after the snapshot of its workers' states in
    ``container`` (its state dict, or a checkpoint holding it): ``snapshot_every_n_steps > 1`` leaves up to
    that many less one. 0 where there is no such state."""
    found = [
        item["_steps_since_snapshot"]
        for item in _mappings(container)
        if "_snapshot" in item and "_steps_since_snapshot" in item
    ]
    for steps in found:
        if type(steps) is not int or not 0 <= steps <= MAX_COUNT:
            raise StateError(
                f"malformed StatefulDataLoader state: _steps_since_snapshot must be an integer >= 0 "
                f"and <= {MAX_COUNT}, not {shown(steps)}"
            )
    if len(found) > 1:
        raise StateError(
            f"{len(found)} StatefulDataLoader states in one checkpoint: load the one of this dataset"
        )
    return found[0] if found else 0


def loader_batch_size(container: Any) -> int | None:
    """The samples a ``StatefulDataLoader`` put in each of its batches, where its state in ``container``
    shows more than one (its batch sampler's samples over its batches, ``DataLoader(batch_size=N)`` over an
    unbatched dataset); ``None`` where it shows none (``batch_size=None``, no such state, no batch yet)."""
    found = None
    for item in _mappings(container):
        sampled, batches = item.get("_sampler_iter_state"), item.get("_sampler_iter_yielded")
        if not isinstance(sampled, Mapping) or "samples_yielded" not in sampled or batches is None:
            continue
        samples = sampled["samples_yielded"]
        for name, value in (("samples_yielded", samples), ("_sampler_iter_yielded", batches)):
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                raise StateError(
                    f"malformed StatefulDataLoader state: {name} must be an integer >= 0 and <= "
                    f"{MAX_COUNT}, not {shown(value)}"
                )
        if batches and samples > batches:
            found = -(-samples // batches)
    return found


def job_state(container: Any) -> LoaderState:
    """The job-level state in ``container``: a shardio state, a StatefulDataLoader's whole state, or a
    checkpoint holding one (see :func:`combine` and :func:`steps_after_snapshot`)."""
    return combine(find_states(container), steps_after_snapshot(container))
