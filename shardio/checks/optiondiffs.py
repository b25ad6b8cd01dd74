"""How a saved state's plan options differ from a dataset's: the differing leaves of nested option values, and
a word on how to resume where the difference says more (:meth:`shardio.LoaderState.differences` lists
them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import shown

__all__ = ["option_differences", "option_hint", "where_differ"]


def where_differ(saved: Any, given: Any, where: str = "", depth: int = 0) -> list[tuple[str, Any, Any]]:
    """Where two option values differ: ``(path, saved, given)`` of each differing leaf inside dicts (a
    path like ``.weights.a``), so that a message shows the values that differ rather than the start of two
    long dicts. Options are compared exactly, as the planner uses them (a float's every bit counts)."""
    if not (isinstance(saved, dict) and isinstance(given, dict)) or depth >= 8:
        return [(where, saved, given)] if saved != given else []
    found = []
    for key in sorted(set(saved) | set(given), key=str):
        plain = isinstance(key, str) and len(key) <= 40 and key.isprintable()
        part = f".{key}" if plain else f"[{shown(key, 40)}]"
        found += where_differ(saved.get(key), given.get(key), where + part, depth + 1)
    return found


def option_hint(name: str, option: Any, saved: Any, given: Any) -> str:
    """A word on how to resume, where an option's value in a state (``option``; its differing leaf ``saved``,
    the dataset's ``given``) says more than that it differs."""
    if name == "sync_buckets" and option is None:
        return (
            " (a state saved before sync_buckets existed: give batching=Batching(sync_buckets=False) to play "
            "its batches)"
        )
    floats = type(saved) is float and type(given) is float
    if name == "mix" and floats and math.isclose(saved, given, rel_tol=1e-12):
        return (
            " (a few ulps apart: the same weights normalised from another order of corpora, whose sum "
            "differs in its last bits; give them in the order of the run that saved the state)"
        )
    return ""


def option_differences(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """One line per differing option between a state's ``saved`` options and a dataset's ``given`` ones (at
    most three leaves an option), each with its hint."""
    found = []
    for name in sorted(set(saved) | set(given)):
        if saved.get(name) != given.get(name):
            label = name if len(name) <= 80 and name.isprintable() else shown(name)
            ours, theirs = saved.get(name), given.get(name)
            for where, leaf, other in (where_differ(ours, theirs) or [("", ours, theirs)])[:3]:
                found.append(
                    f"option {label}{where}: state {shown(leaf)}, dataset {shown(other)}"
                    + option_hint(name, ours, leaf, other)
                )
    return found
