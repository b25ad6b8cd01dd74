"""Where the shardio state sits in a loaded checkpoint: its key paths, found by a bounded walk, and a copy of
the checkpoint with a new state at one of them (:mod:`shardio.ledger.checkpoints` reads and writes the files).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import StateError, shown

__all__ = ["MAX_WALK_DEPTH", "MAX_WALK_VALUES", "replaced_state", "state_paths", "state_where"]

MAX_WALK_DEPTH = 32
"""How deep the search for the shardio state nests in a checkpoint's dicts and lists."""
MAX_WALK_VALUES = 1 << 24
"""The most values (each container's entries, each container once) the search for the state looks at."""

_FORMAT = "shardio-state"


def state_paths(container: Any) -> Iterator[tuple[Any, ...]]:
    """The key path of every shardio state (a dict whose ``"format"`` is ``"shardio-state"``) in
    ``container`` (dicts, lists and tuples), in order. Walked without recursion, each container once (a
    pickle may share one list at every place of another: ``[a, a]`` of ``[b, b]`` ... is 2**32 paths from
    2 KB), at most :data:`MAX_WALK_DEPTH` deep and over at most :data:`MAX_WALK_VALUES` values.

    Args:
        container: what ``torch.load`` or ``json.load`` returned.

    Returns:
        An iterator over the key paths (``()``: the container is the state).

    Raises:
        StateError: nested deeper, or more values, than the bounds.
    """
    seen: set[int] = set()
    budget = MAX_WALK_VALUES
    stack: list[tuple[Any, tuple[Any, ...]]] = [(container, ())]
    while stack:
        item, prefix = stack.pop()
        if isinstance(item, Mapping) and item.get("format") == _FORMAT:
            yield prefix
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        if len(prefix) > MAX_WALK_DEPTH:
            raise StateError(
                f"the checkpoint nests dicts and lists more than {MAX_WALK_DEPTH} deep (at "
                f"{shown(''.join(f'[{key!r}]' for key in prefix[:8]))}...); not a checkpoint shardio reads"
            )
        pairs = list(item.items()) if isinstance(item, Mapping) else list(enumerate(item))
        budget -= len(pairs)
        if budget < 0:
            raise StateError(
                f"the checkpoint holds more than {MAX_WALK_VALUES} values in its dicts and lists; not a "
                "checkpoint shardio reads"
            )
        stack.extend(
            (value, (*prefix, key))
            for key, value in reversed(pairs)
            if isinstance(value, (Mapping, list, tuple))
        )


def state_where(container: Any) -> tuple[Any, ...] | None:
    """The path of the one state in ``container``; in a Lightning checkpoint, the ShardioCallback's (which
    replaces a StatefulDataLoader's own state on resume); None where there are several (or none).

    Args:
        container: what ``torch.load`` or ``json.load`` returned.

    Returns:
        The key path, or None.

    Raises:
        StateError: as :func:`state_paths`.
    """
    found = list(state_paths(container))
    callback = [
        p for p in found if len(p) > 2 and p[0] == "callbacks" and str(p[1]).startswith("ShardioCallback")
    ]
    if len(callback) == 1:
        return callback[0]
    return found[0] if len(found) == 1 else None


def replaced_state(container: Any, where: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """A copy of ``container`` with ``state`` at ``where`` (only the dicts and lists on the way are copied).

    Args:
        container: the loaded checkpoint.
        where: a key path in it (:func:`state_where`).
        state: what goes there.

    Returns:
        The copy.
    """
    if not where:
        return state
    key, rest = where[0], where[1:]
    if isinstance(container, Mapping):
        copy = dict(container)
        copy[key] = replaced_state(container[key], rest, state)
        return copy
    items = list(container)
    items[key] = replaced_state(container[key], rest, state)
    return type(container)(items) if isinstance(container, tuple) else items
