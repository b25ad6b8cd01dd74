"""Bounds on a loader state's fields, checked when it is parsed: before any planning, in O(size of the
state)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import StateError, shown

__all__ = [
    "MAX_COUNT",
    "MAX_DEPTH",
    "MAX_HISTORY",
    "MAX_WORKERS",
    "MAX_WORLD_SIZE",
    "check_count",
    "check_tree",
]

MAX_COUNT = 2**62 - 1
"""The largest epoch, position or batch count a state may hold: the control block's int64 fields hold it with
room for the next epoch and for a position ``start + yielded``."""
MAX_WORLD_SIZE = 2**17
"""The most ranks a state's world (or a history segment's) may have: the planner deals at least one round of
``world_size`` batches (padding with repeats), so each planned world costs O(world_size) memory and time
whatever the dataset; 131072 ranks is above any data-parallel job, yet bounds that to a few MiB and a tenth of
a second."""
MAX_HISTORY = 32
"""World-size changes one epoch's state can record (each elastic resume inside an epoch adds one)."""
MAX_WORKERS = 1024
"""DataLoader workers per rank that the control block has slots for."""
MAX_DEPTH = 32
"""Nesting of a state's ``options`` and ``extra`` (shardio writes at most 5 levels)."""
MAX_NODES = {"options": 2**16, "extra": 2**22}
"""Values (containers and scalars, a shared one each time it is reached) in ``options`` and ``extra``."""
_MAX_INT = 2**63  # an integer inside options or extra: within int64, as every count shardio records there


def check_count(state: Mapping[str, Any], name: str, least: int, most: int | None = MAX_COUNT) -> int:
    """Field ``name``: an int (not a bool, float or string) from ``least`` to ``most`` (``None``:
    unbounded)."""
    value = state[name]
    if type(value) is not int or value < least or (most is not None and value > most):
        expected = f">= {least}" if most is None else f">= {least} and <= {most}"
        raise StateError(
            f"malformed loader state: field {name} must be an integer {expected}, not {shown(value)}"
        )
    return value


def check_tree(name: str, value: Any) -> None:
    """Field ``name`` (``options`` or ``extra``): a dict of JSON values (dicts with string keys, lists,
    strings, numbers, bools, None), at most :data:`MAX_DEPTH` deep and :data:`MAX_NODES` values, integers
    within int64. Iterative, so a self-holding or deeply nested value (a pickled checkpoint can hold either)
    is an error here, not a RecursionError or a hang later (``json.dumps`` and ``repr`` of it).

    Each container is checked once however often it is reached: its count of values and its height are
    remembered, so a value that shares its lists (``[[x] * 64] * 64 ...``: 64**14 values from a few kB) is
    refused at once, by arithmetic, instead of after walking :data:`MAX_NODES` of them."""
    if not isinstance(value, Mapping):
        raise StateError(f"malformed loader state: field {name} must be a dict, not {type(value).__name__}")
    budget = MAX_NODES[name]
    done: dict[int, tuple[int, int]] = {}  # id of a checked container: (values under it, height)
    open_: set[int] = set()  # containers whose children are being checked: the path from the root
    # (container, depth, its children once they are pushed: then it finishes when popped again)
    stack: list[tuple[Any, int, list[Any] | None]] = [(value, 1, None)]
    while stack:
        item, depth, finishing = stack.pop()
        key = id(item)
        if finishing is not None:
            count, height = len(finishing), 1
            for child in finishing:
                if isinstance(child, _CONTAINERS):
                    below, child_height = done[id(child)]
                    count, height = count + below, max(height, child_height + 1)
            if count > budget:
                raise StateError(f"malformed loader state: field {name} holds more than {budget} values")
            done[key] = (count, height)
            open_.discard(key)
            continue
        if depth > MAX_DEPTH or (key in done and depth + done[key][1] - 1 > MAX_DEPTH) or key in open_:
            raise StateError(f"malformed loader state: field {name} is nested more than {MAX_DEPTH} deep")
        if key in done:
            continue
        children = list(item.values()) if isinstance(item, Mapping) else list(item)
        if len(children) > budget:
            raise StateError(f"malformed loader state: field {name} holds more than {budget} values")
        _check_values(name, item, children)
        open_.add(key)
        stack.append((item, depth, children))
        stack.extend((child, depth + 1, None) for child in children if isinstance(child, _CONTAINERS))


_CONTAINERS = (dict, list, tuple)


def _check_values(name: str, item: Any, children: list[Any]) -> None:
    """One container's keys and values: string keys, JSON kinds, integers within int64."""
    if isinstance(item, Mapping) and any(type(key) is not str for key in item):
        bad = next(key for key in item if type(key) is not str)
        raise StateError(f"malformed loader state: field {name} has a key {shown(bad)} that is not a string")
    kinds = set(map(type, children))  # per kind, not per value: a long list of numbers is checked in C
    for kind in kinds:
        if not issubclass(kind, (str, int, float, type(None), *_CONTAINERS)):
            raise StateError(
                f"malformed loader state: field {name} holds a {kind.__name__}, not a JSON value "
                "(dict, list, string, number, bool or None)"
            )
    if kinds & {int, bool} and kinds <= {int, bool}:
        if min(children) < -_MAX_INT or max(children) >= _MAX_INT:
            raise StateError(f"malformed loader state: field {name} holds an integer beyond int64")
    elif any(issubclass(kind, int) for kind in kinds):
        if any(isinstance(c, int) and not -_MAX_INT <= c < _MAX_INT for c in children):
            raise StateError(f"malformed loader state: field {name} holds an integer beyond int64")
