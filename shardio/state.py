"""LoaderState: where a job stands in its data, small and JSON-serialisable.

One state describes the whole job, because every rank has the same number of batches: the state saved on
rank 0 restores every rank. A state records the epoch, the finished segments of the epoch (world-size
changes), where iteration of the current segment started (``start``, in batches per rank) and how many
batches have been yielded since, plus the seed and the fingerprints of the index and of the plan options.

Inside a DataLoader worker (torchdata's ``StatefulDataLoader`` takes states there) ``yielded`` counts that
worker's batches only; :func:`combine` adds up the workers' states into the job position, where what they
consumed together is the plan's first batches (it is not when a DataLoader batches an unbatched dataset's
samples with several workers, between rounds, and such states are refused), and :func:`job_state` adds the
batches a ``StatefulDataLoader`` yielded after its last snapshot of them.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from .checks.optiondiffs import option_differences
from .checks.states import MAX_COUNT, MAX_HISTORY, MAX_WORKERS, MAX_WORLD_SIZE, check_count, check_tree
from .errors import OptionError, StateError, shown
from .planning.plan import Segment
from .planning.surgery import Surgery

__all__ = ["STATE_VERSION", "LoaderState", "batch_position", "check_follows", "combine", "find_states", "job_state",
           "options_fingerprint", "split", "steps_after_snapshot"]

STATE_VERSION = 1
_MAX_AHEAD = 1 << 20  # batches per rank that workers' states may have consumed beyond their common prefix
_FORMAT = "shardio-state"


def options_fingerprint(options: Mapping[str, object]) -> str:
    """A short hash of the plan-shaping options."""
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LoaderState:
    """A resumable position: what `state_dict()` saves, as a value. `position` is `start + yielded`.

    Args:
        epoch: The epoch.
        seed: The dataset's seed.
        index: The index fingerprint.
        options: The options that shape the plan (batching, ordering; a mix's too).
        world_size: The ranks of the current segment.
        history: The epoch's finished segments (earlier world sizes), oldest first.
        start: Batches per rank the current segment had consumed when its iteration started.
        yielded: Batches per rank yielded since `start` (one worker's share in a worker's state).
        worker: The DataLoader worker a worker's state is of (0 in a job-level state).
        num_workers: The workers a worker's state is one of (1 in a job-level state).
        extra: A state's surgery: quarantines, re-mixes, samples consumed ahead.
    """

    epoch: int
    seed: int
    index: str
    options: dict[str, Any]
    world_size: int
    history: tuple[Segment, ...] = ()
    start: int = 0
    yielded: int = 0
    worker: int = 0
    num_workers: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def surgery(self) -> Surgery:
        """``extra`` typed: quarantines and re-mix (a :class:`StateError` where malformed; parsed by from_dict)."""
        return Surgery.of(self.extra) if self.extra else Surgery()

    @property
    def position(self) -> int:
        """Batches per rank consumed in the current segment (a job-level state only)."""
        if self.num_workers != 1:
            raise StateError(f"this is worker {self.worker}'s share of a {self.num_workers}-worker state; "
                             "combine the states of all workers first")
        return self.start + self.yielded

    def at(self, position: int) -> LoaderState:
        """The job-level state at a position of the current segment.

        Args:
            position: Batches per rank consumed in the segment.
        """
        return replace(self, start=position, yielded=0, worker=0, num_workers=1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (what ``state_dict()`` returns)."""
        body = asdict(self)
        body["history"] = [[s.world_size, s.consumed] for s in self.history]
        return {"format": _FORMAT, "version": STATE_VERSION, **body,
                "options_fingerprint": options_fingerprint(self.options)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Parse a state dict; every field is bounded here, before anything plans with it.

        Args:
            state: A dict from `to_dict()` (as loaded from JSON).

        Raises:
            StateError: A field missing or malformed, or another format or version.
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise StateError("not a shardio loader state (expected a dict with format 'shardio-state')")
        if type(state.get("version")) is not int or state.get("version") != STATE_VERSION:
            raise StateError(f"loader state version {shown(state.get('version'))}; this shardio reads "
                             f"version {STATE_VERSION}")
        for name in ("epoch", "seed", "index", "options", "world_size", "history", "start", "yielded", "worker",
                     "num_workers"):
            if name not in state:
                raise StateError(f"malformed loader state: field {name} is missing")
        # the seed is only compared with the dataset's, which may be any integer >= 0
        most = {"world_size": MAX_WORLD_SIZE, "num_workers": MAX_WORKERS, "seed": None}
        ints = {name: check_count(state, name, 1 if name in ("world_size", "num_workers") else 0,
                                  most.get(name, MAX_COUNT))
                for name in ("epoch", "seed", "world_size", "start", "yielded", "worker", "num_workers")}
        if ints["worker"] >= ints["num_workers"]:
            raise StateError(f"malformed loader state: field worker is {ints['worker']}, not below num_workers "
                             f"{ints['num_workers']}")
        for name in ("options", "extra"):
            check_tree(name, state.get(name, {}))
        if not isinstance(state["index"], str):
            raise StateError(f"malformed loader state: field index must be a string, not "
                             f"{type(state['index']).__name__}")
        parsed = cls(index=state["index"], options=dict(state["options"]), history=_history(state["history"]),
                     extra=dict(state.get("extra", {})), **ints)
        parsed.surgery  # noqa: B018  (parsed and bounded now, before anything plans with it)
        return parsed

    def differences(self, *, seed: int, index: str, options: Mapping[str, Any]) -> list[str]:
        """What differs between this state and a dataset with these settings (empty when compatible).

        Args:
            seed: The dataset's seed.
            index: Its index fingerprint.
            options: Its plan options.
        """
        found = []
        if self.index != index:
            found.append(f"index fingerprint: state {shown(self.index)}, dataset {shown(index)} (another dataset "
                         "or a re-pack)")
        if self.seed != seed:
            found.append(f"seed: state {shown(self.seed)}, dataset {shown(seed)}")
        return found + option_differences(self.options, options)


def _mappings(container: Any) -> Iterator[Mapping[Any, Any]]:
    """Every mapping inside ``container`` (nested in mappings, lists and tuples), each once: a checkpoint that
    holds itself (pickle allows it) is walked, not looped over. A shardio state's own fields are not entered."""
    seen: set[int] = set()
    stack = [container]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Mapping):
            yield item
            if item.get("format") != _FORMAT:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def find_states(container: Any) -> list[LoaderState]:
    """Every shardio state inside ``container`` (a state, or a StatefulDataLoader's nested state dict).

    The container is a dict: a state, a ``StatefulDataLoader``'s state or a checkpoint holding one. A list at
    the top (``[state]``, say, a list of ranks' states) is a :class:`StateError`: one state describes the
    whole job, and which of several to take is not for the loader to guess."""
    if not isinstance(container, Mapping):
        raise StateError(f"not a shardio loader state: a saved state is a dict (a shardio state, a "
                         f"StatefulDataLoader's state or a checkpoint dict holding one), not a "
                         f"{type(container).__name__}")
    return [LoaderState.from_dict(item) for item in _mappings(container) if item.get("format") == _FORMAT]


def combine(states: Iterable[LoaderState], steps_after: int = 0) -> LoaderState:
    """The job-level state from one job-level state, or from the states of all workers of one loader; plus
    ``steps_after`` batches the loader yielded after those states (:func:`steps_after_snapshot`).

    Workers take the plan's batches in turn (worker ``w`` those ``start + w``, ``start + w + num_workers``,
    ...), so the workers' states describe a position only where what they yielded together is the plan's
    first batches; anything else (a DataLoader that batches an unbatched dataset's samples, several at a time
    from one worker, between rounds of its workers) is a :class:`StateError` here. :func:`split` describes such
    states, for a dataset to resume without what they consumed ahead."""
    loaded, ahead = split(states, steps_after)
    if ahead:
        raise StateError(f"the workers' states do not describe a position of epoch {loaded.epoch}: beyond its first "
                         f"{loaded.position} batches per rank they consumed {len(ahead)} more, out of plan order (a "
                         "DataLoader that batches an unbatched dataset's samples takes them from one worker at a "
                         "time). ds.load_state_dict resumes it; for the ledger, save ds.state_dict() after loading "
                         "it there, or use a state saved after a whole round of workers")
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
        raise StateError(f"this StatefulDataLoader state was saved {steps_after} step(s) after its last snapshot "
                         "(snapshot_every_n_steps > 1) and its dataset is unbatched, so how many samples those "
                         "steps took is not in it: save it at a snapshot step, or load it with the loader's own "
                         "load_state_dict")
    if len(states) == 1 and first.num_workers == 1:
        return (_at(first, first.position + steps_after) if steps_after else first), ()
    by_worker = {s.worker: s for s in states}
    shape = {(s.epoch, s.start, s.num_workers, s.history) for s in states}
    if len(shape) != 1 or len(by_worker) != first.num_workers or len(states) != first.num_workers:
        raise StateError(f"worker states do not describe one loader: {len(states)} states for "
                         f"{first.num_workers} workers, epochs/starts {sorted((e, s) for e, s, _, _ in shape)}")
    workers = first.num_workers
    taken = [by_worker[worker].yielded for worker in range(workers)]
    # worker w consumed positions w, w + workers, ... (from start): the prefix ends at the first one not consumed
    prefix = min(worker + taken[worker] * workers for worker in range(workers))
    first_ahead = [-(-max(0, prefix - worker) // workers) for worker in range(workers)]  # each worker's, by count
    beyond = sum(max(0, taken[worker] - first_ahead[worker]) for worker in range(workers))
    if beyond > _MAX_AHEAD:
        raise StateError(f"malformed loader state: its workers' states are {beyond} batches apart (they yielded "
                         f"{shown(taken)}); a DataLoader's workers stay within a round of each other")
    ahead = tuple(sorted(first.start + worker + count * workers for worker in range(workers)
                         for count in range(first_ahead[worker], taken[worker])))
    if ahead and steps_after:
        raise StateError(f"a StatefulDataLoader state {steps_after} step(s) after its snapshot whose workers' states "
                         "consumed out of plan order: save it at a snapshot step")
    return _at(first, first.start + prefix + steps_after), ahead


def _at(state: LoaderState, position: int) -> LoaderState:
    """``state.at(position)``, a position the control block holds."""
    if position > MAX_COUNT:
        raise StateError(f"malformed loader state: field yielded: the workers' states stand at batch {position} "
                         f"of the segment, beyond {MAX_COUNT}")
    return state.at(position)


def steps_after_snapshot(container: Any) -> int:
    """The batches a ``StatefulDataLoader`` with workers yielded after the snapshot of its workers' states in
    ``container`` (its state dict, or a checkpoint holding it): ``snapshot_every_n_steps > 1`` leaves up to
    that many less one. 0 where there is no such state."""
    found = [item["_steps_since_snapshot"] for item in _mappings(container)
             if "_snapshot" in item and "_steps_since_snapshot" in item]
    for steps in found:
        if type(steps) is not int or not 0 <= steps <= MAX_COUNT:
            raise StateError(f"malformed StatefulDataLoader state: _steps_since_snapshot must be an integer >= 0 "
                             f"and <= {MAX_COUNT}, not {shown(steps)}")
    if len(found) > 1:
        raise StateError(f"{len(found)} StatefulDataLoader states in one checkpoint: load the one of this dataset")
    return found[0] if found else 0


def job_state(container: Any) -> LoaderState:
    """The job-level state in ``container``: a shardio state, a StatefulDataLoader's whole state, or a
    checkpoint holding one (see :func:`combine` and :func:`steps_after_snapshot`)."""
    return combine(find_states(container), steps_after_snapshot(container))


def _history(value: Any) -> tuple[Segment, ...]:
    """Field ``history``: at most :data:`MAX_HISTORY` ``[world_size, consumed]`` integer pairs, each within the
    bounds of :mod:`shardio.checks.states` (whether ``consumed`` fits its plan is the planner's to say)."""
    if not isinstance(value, (list, tuple)):
        raise StateError(f"malformed loader state: field history must be a list, not {type(value).__name__}")
    if len(value) > MAX_HISTORY:
        raise StateError(f"malformed loader state: field history has {len(value)} world-size changes in one "
                         f"epoch; at most {MAX_HISTORY} are kept")
    segments = []
    for number, item in enumerate(value):
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or any(type(v) is not int for v in item)
                or not 1 <= item[0] <= MAX_WORLD_SIZE or not 0 <= item[1] <= MAX_COUNT):
            raise StateError(f"malformed loader state: field history[{number}] must be [world_size >= 1 and <= "
                             f"{MAX_WORLD_SIZE}, consumed >= 0 and <= {MAX_COUNT}] (integers), not {shown(item)}")
        segments.append(Segment(item[0], item[1]))
    return tuple(segments)


def batch_position(batch: Mapping[str, Any]) -> tuple[int, int]:
    """A yielded batch's ``(epoch, batch_index)``: integers (Python, numpy or one-element torch), never bools."""
    def exact(value: Any) -> int:
        if isinstance(value, bool):
            raise TypeError("a bool is not a batch index")
        return operator.index(value)

    try:
        return exact(batch["epoch"]), exact(batch["batch_index"])
    except (KeyError, TypeError):
        pass
    if isinstance(batch.get("batch_index"), (list, tuple)):
        raise OptionError(f"state_after takes a batch ShardDataset yielded; this one holds "
                          f"{len(batch['batch_index'])} samples a DataLoader batched (its 'batch_index' is a list), "
                          "which several workers hand over out of plan order, so no position describes them: batch "
                          "in the dataset (ShardDataset(batch_size=...) or max_duration, with DataLoader(batch_size="
                          "None)), or use torchdata's StatefulDataLoader and its state, or num_workers=0 and "
                          "ds.state_dict()")
    raise OptionError("state_after needs a batch yielded by ShardDataset, with integer 'epoch' and "
                      "'batch_index' (a collate_fn must keep them)")


def check_follows(previous: Mapping[str, Any] | None, state: Mapping[str, Any]) -> None:
    """That ``state``, saved after a batch trained on, follows ``previous``, saved after the batch before (or
    loaded): in one epoch and segment, one batch further. A :class:`StateError` where a batch came out of plan
    order (a DataLoader with ``in_order=False``), which no state of one batch can describe."""
    if previous is None or previous.get("format") != _FORMAT:
        return
    same = all(previous.get(name) == state.get(name) for name in ("epoch", "history", "world_size"))
    if same and state.get("start") != previous.get("start", 0) + 1:
        now, before = state.get("start", 0) - 1, previous.get("start", 0) - 1
        skipped = (f"batches {before + 1} to {now - 1} were skipped (skip_first_batches after a resume? the loaded "
                   "state already starts after the batches trained on) or " if now > before + 1 else "")
        raise StateError(f"batch {now} of epoch {state.get('epoch')} was trained on right after batch {before}: "
                         f"{skipped}the DataLoader hands batches over out of plan order (in_order=False?), so no "
                         "saved state can say which were trained on: keep the DataLoader's default in_order=True")
