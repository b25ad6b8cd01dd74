"""LoaderState: where a job stands in its data, small and JSON-serialisable.

One state describes the whole job, because every rank has the same number of batches: the state saved on
rank 0 restores every rank. A state records the epoch, the finished segments of the epoch (world-size
changes), where iteration of the current segment started (``start``, in batches per rank) and how many
batches have been yielded since, plus the seed and the fingerprints of the index and of the plan options.

Inside a DataLoader worker (torchdata's ``StatefulDataLoader`` takes states there) ``yielded`` counts that
worker's batches only; :func:`combine` adds up the workers' states into the job position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .errors import StateError
from .plan import Segment

__all__ = ["STATE_VERSION", "LoaderState", "combine", "find_states", "options_fingerprint"]

STATE_VERSION = 1
_FORMAT = "shardio-state"


def options_fingerprint(options: Mapping[str, object]) -> str:
    """A short hash of the plan-shaping options."""
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LoaderState:
    """A resumable position. ``position`` (batches per rank consumed in this segment) is ``start + yielded``."""

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

    @property
    def position(self) -> int:
        """Batches per rank consumed in the current segment (a job-level state only)."""
        if self.num_workers != 1:
            raise StateError(f"this is worker {self.worker}'s share of a {self.num_workers}-worker state; "
                             "combine the states of all workers first")
        return self.start + self.yielded

    def at(self, position: int) -> LoaderState:
        """The job-level state at ``position`` batches per rank into the current segment."""
        return replace(self, start=position, yielded=0, worker=0, num_workers=1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (what ``state_dict()`` returns)."""
        body = asdict(self)
        body["history"] = [[s.world_size, s.consumed] for s in self.history]
        return {"format": _FORMAT, "version": STATE_VERSION, **body,
                "options_fingerprint": options_fingerprint(self.options)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Parse a state dict, with a :class:`StateError` for anything missing or malformed."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise StateError("not a shardio loader state (expected a dict with format 'shardio-state')")
        if state.get("version") != STATE_VERSION:
            raise StateError(f"loader state version {state.get('version')!r}; this shardio reads "
                             f"version {STATE_VERSION}")
        try:
            history = tuple(Segment(int(size), int(consumed)) for size, consumed in state["history"])
            parsed = cls(epoch=int(state["epoch"]), seed=int(state["seed"]), index=str(state["index"]),
                         options=dict(state["options"]), world_size=int(state["world_size"]), history=history,
                         start=int(state["start"]), yielded=int(state["yielded"]), worker=int(state["worker"]),
                         num_workers=int(state["num_workers"]), extra=dict(state.get("extra", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"malformed loader state: {exc!r}") from None
        if min(parsed.epoch, parsed.start, parsed.yielded, parsed.worker) < 0 or parsed.world_size < 1:
            raise StateError(f"loader state has negative or zero fields: {state}")
        return parsed

    def differences(self, *, seed: int, index: str, options: Mapping[str, Any]) -> list[str]:
        """What differs between this state and a dataset with these settings (empty when compatible)."""
        found = []
        if self.index != index:
            found.append(f"index fingerprint: state {self.index}, dataset {index} (another dataset or a re-pack)")
        if self.seed != seed:
            found.append(f"seed: state {self.seed}, dataset {seed}")
        for name in sorted(set(self.options) | set(options)):
            if self.options.get(name) != options.get(name):
                found.append(f"option {name}: state {self.options.get(name)!r}, dataset {options.get(name)!r}")
        return found


def find_states(container: Any) -> list[LoaderState]:
    """Every shardio state inside ``container`` (a state, or a StatefulDataLoader's nested state dict)."""
    found: list[LoaderState] = []
    stack = [container]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if item.get("format") == _FORMAT:
                found.append(LoaderState.from_dict(item))
            else:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def combine(states: Iterable[LoaderState]) -> LoaderState:
    """The job-level state from one job-level state, or from the states of all workers of one loader."""
    states = list(states)
    if not states:
        raise StateError("not a shardio loader state: found no dict with format 'shardio-state' in it")
    if len(states) == 1 and states[0].num_workers == 1:
        return states[0]
    first = states[0]
    by_worker = {s.worker: s for s in states}
    shape = {(s.epoch, s.start, s.num_workers, s.history) for s in states}
    if len(shape) != 1 or len(by_worker) != first.num_workers or len(states) != first.num_workers:
        raise StateError(f"worker states do not describe one loader: {len(states)} states for "
                         f"{first.num_workers} workers, epochs/starts {sorted((e, s) for e, s, _, _ in shape)}")
    return first.at(first.start + sum(s.yielded for s in states))
