"""LoaderState: where a job stands in its data, small and JSON-serialisable.

One state describes the whole job, because every rank has the same number of batches: the state saved on
rank 0 restores every rank. A state records the epoch, the finished segments of the epoch (world-size
changes), where iteration of the current segment started (``start``, in batches per rank) and how many
batches have been yielded since, plus the seed and the fingerprints of the index and of the plan options.

Inside a DataLoader worker (torchdata's ``StatefulDataLoader`` takes states there) ``yielded`` counts that
worker's batches only; :mod:`shardio.jobstate` finds the states a checkpoint holds and combines them into the
job's. A yielded batch says where it stands (:func:`batch_position`), and the states saved after consecutive
batches follow one another (:func:`check_follows`)."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any

from .checks.optiondiffs import option_differences
from .checks.states import MAX_COUNT, MAX_HISTORY, MAX_WORKERS, MAX_WORLD_SIZE, check_count, check_tree
from .errors import OptionError, StateError, shown
from .planning.plan import Segment
from .planning.surgery import Surgery

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "LoaderState",
    "batch_position",
    "check_follows",
    "options_fingerprint",
]

STATE_VERSION = 1
STATE_FORMAT = "shardio-state"
"""The ``format`` field of every shardio state."""


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
        nodes: The nodes of the current segment's ranks, with `Ordering(node_stable=True)` (1 otherwise;
            recorded only when above 1).
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
    nodes: int = 1

    @cached_property
    def surgery(self) -> Surgery:
        """``extra`` typed: quarantines and re-mix (a :class:`StateError` where malformed; parsed by
        from_dict)."""
        return Surgery.of(self.extra) if self.extra else Surgery()

    @property
    def position(self) -> int:
        """Batches per rank consumed in the current segment (a job-level state only)."""
        if self.num_workers != 1:
            raise StateError(
                f"this is worker {self.worker}'s share of a {self.num_workers}-worker state; "
                "combine the states of all workers first"
            )
        return self.start + self.yielded

    @property
    def step(self) -> tuple[int, int] | None:
        """With `Batching(step_batches=K)` (recorded in `options`): the optimizer step of the epoch this
        (job-level) state stands at, and the micro-batch within it (0 at a step's boundary), counting the
        steps of every finished segment on its own world; `None` without steps."""
        k = self.options.get("step_batches")
        sizes = [self.world_size, *(segment.world_size for segment in self.history)]
        if type(k) is not int or k < 1 or any(size < 1 or k % size for size in sizes):
            return None
        done = sum(segment.consumed // (k // segment.world_size) for segment in self.history)
        accumulation = k // self.world_size
        return done + self.position // accumulation, self.position % accumulation

    def at(self, position: int) -> LoaderState:
        """The job-level state at a position of the current segment.

        Args:
            position: Batches per rank consumed in the segment.
        """
        return replace(self, start=position, yielded=0, worker=0, num_workers=1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (what ``state_dict()`` returns)."""
        body = asdict(self)
        body["history"] = [
            [s.world_size, s.consumed] if s.nodes == 1 else [s.world_size, s.consumed, s.nodes]
            for s in self.history
        ]
        if self.nodes == 1:  # recorded only on several nodes: every other state stays as it was
            del body["nodes"]
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            **body,
            "options_fingerprint": options_fingerprint(self.options),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LoaderState:
        """Parse a state dict; every field is bounded here, before anything plans with it.

        Args:
            state: A dict from `to_dict()` (as loaded from JSON).

        Raises:
            StateError: A field missing or malformed, or another format or version.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise StateError("not a shardio loader state (expected a dict with format 'shardio-state')")
        if type(state.get("version")) is not int or state.get("version") != STATE_VERSION:
            raise StateError(
                f"loader state version {shown(state.get('version'))}; this shardio reads "
                f"version {STATE_VERSION}"
            )
        for name in (
            "epoch",
            "seed",
            "index",
            "options",
            "world_size",
            "history",
            "start",
            "yielded",
            "worker",
            "num_workers",
        ):
            if name not in state:
                raise StateError(f"malformed loader state: field {name} is missing")
        # the seed is only compared with the dataset's, which may be any integer >= 0
        most = {"world_size": MAX_WORLD_SIZE, "num_workers": MAX_WORKERS, "seed": None}
        ints = {
            name: check_count(
                state, name, 1 if name in ("world_size", "num_workers") else 0, most.get(name, MAX_COUNT)
            )
            for name in ("epoch", "seed", "world_size", "start", "yielded", "worker", "num_workers")
        }
        ints["nodes"] = check_count(state, "nodes", 1, ints["world_size"]) if "nodes" in state else 1
        if ints["world_size"] % ints["nodes"]:
            raise StateError(
                f"malformed loader state: field nodes is {ints['nodes']}, which does not divide world_size "
                f"{ints['world_size']}"
            )
        if ints["worker"] >= ints["num_workers"]:
            raise StateError(
                f"malformed loader state: field worker is {ints['worker']}, not below num_workers "
                f"{ints['num_workers']}"
            )
        for name in ("options", "extra"):
            check_tree(name, state.get(name, {}))
        if not isinstance(state["index"], str):
            raise StateError(
                f"malformed loader state: field index must be a string, not {type(state['index']).__name__}"
            )
        parsed = cls(
            index=state["index"],
            options=dict(state["options"]),
            history=_history(state["history"]),
            extra=dict(state.get("extra", {})),
            **ints,
        )
        several = parsed.nodes > 1 or any(segment.nodes > 1 for segment in parsed.history)
        if several and parsed.options.get("node_stable") is not True:
            raise StateError(
                "malformed loader state: it records segments on several nodes, which only "
                "Ordering(node_stable=True) plans, and its options do not have node_stable"
            )
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
            found.append(
                f"index fingerprint: state {shown(self.index)}, dataset {shown(index)} (another dataset "
                "or a re-pack)"
            )
        if self.seed != seed:
            found.append(f"seed: state {shown(self.seed)}, dataset {shown(seed)}")
        return found + (option_differences(self.options, options) if self.options != options else [])


def _history(value: Any) -> tuple[Segment, ...]:
    """Field ``history``: at most :data:`MAX_HISTORY` ``[world_size, consumed]`` integer pairs (or
    ``[world_size, consumed, nodes]`` triples, ``nodes`` from 2, dividing ``world_size``), each within the
    bounds of :mod:`shardio.checks.states` (whether ``consumed`` fits its plan is the planner's to say)."""
    if not isinstance(value, (list, tuple)):
        raise StateError(f"malformed loader state: field history must be a list, not {type(value).__name__}")
    if len(value) > MAX_HISTORY:
        raise StateError(
            f"malformed loader state: field history has {len(value)} world-size changes in one "
            f"epoch; at most {MAX_HISTORY} are kept"
        )
    segments = []
    for number, item in enumerate(value):
        if (
            not isinstance(item, (list, tuple))
            or len(item) not in (2, 3)
            or any(type(v) is not int for v in item)
            or not 1 <= item[0] <= MAX_WORLD_SIZE
            or not 0 <= item[1] <= MAX_COUNT
            or (len(item) == 3 and not (2 <= item[2] <= item[0] and item[0] % item[2] == 0))
        ):
            raise StateError(
                f"malformed loader state: field history[{number}] must be [world_size >= 1 and <= "
                f"{MAX_WORLD_SIZE}, consumed >= 0 and <= {MAX_COUNT}] or [world_size, consumed, nodes >= 2 "
                f"dividing world_size] (integers), not {shown(item)}"
            )
        segments.append(Segment(*item))
    return tuple(segments)


def batch_position(batch: Mapping[str, Any]) -> tuple[int, int]:
    """A yielded batch's ``(epoch, batch_index)``: integers (Python, numpy or one-element torch), never
    bools."""

    def exact(value: Any) -> int:
        if isinstance(value, bool):
            raise TypeError("a bool is not a batch index")
        return operator.index(value)

    try:
        return exact(batch["epoch"]), exact(batch["batch_index"])
    except (KeyError, TypeError):
        pass
    if isinstance(batch.get("batch_index"), (list, tuple)):
        raise OptionError(
            f"state_after takes a batch ShardDataset yielded; this one holds "
            f"{len(batch['batch_index'])} samples a DataLoader batched (its 'batch_index' is a list), "
            "which several workers hand over out of plan order, so no position describes them: batch "
            "in the dataset (ShardDataset(batch_size=...) or max_duration, with DataLoader(batch_size="
            "None)), or use torchdata's StatefulDataLoader and its state, or num_workers=0 and "
            "ds.state_dict()"
        )
    raise OptionError(
        "state_after needs a batch yielded by ShardDataset, with integer 'epoch' and "
        "'batch_index' (a collate_fn must keep them)"
    )


def check_follows(previous: Mapping[str, Any] | None, state: Mapping[str, Any]) -> None:
    """That ``state``, saved after a batch trained on, follows ``previous``, saved after the batch before (or
    loaded): in one epoch and segment, one batch further. A :class:`StateError` where a batch came out of plan
    order (a DataLoader with ``in_order=False``), which no state of one batch can describe."""
    if previous is None or previous.get("format") != STATE_FORMAT:
        return
    same = all(previous.get(name) == state.get(name) for name in ("epoch", "history", "world_size"))
    if same and state.get("start") != previous.get("start", 0) + 1:
        now, before = state.get("start", 0) - 1, previous.get("start", 0) - 1
        skipped = (
            f"batches {before + 1} to {now - 1} were skipped (skip_first_batches after a resume? the loaded "
            "state already starts after the batches trained on) or "
            if now > before + 1
            else ""
        )
        raise StateError(
            f"batch {now} of epoch {state.get('epoch')} was trained on right after batch {before}: "
            f"{skipped}the DataLoader hands batches over out of plan order (in_order=False?), so no "
            "saved state can say which were trained on: keep the DataLoader's default in_order=True"
        )
