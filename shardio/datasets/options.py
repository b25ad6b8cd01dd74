"""A dataset's option groups from what its constructor was given: the groups themselves
(:class:`~shardio.Batching`, :class:`~shardio.Ordering`, :class:`~shardio.Decoding`,
:class:`~shardio.Reading`), the keyword shortcuts of their common fields, and the other fields' old keywords,
deprecated.

A shortcut (or an old keyword) given together with its group is an :class:`~shardio.errors.OptionError` naming
both: neither silently wins.
"""

from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any, NamedTuple

from ..errors import OptionError, shown
from ..planning.options import Batching, Ordering
from ..reading.options import Decoding, Reading

__all__ = ["DEPRECATED", "GROUPS", "SHORTCUTS", "Groups", "option_groups"]

GROUPS: dict[str, type] = {
    "batching": Batching,
    "ordering": Ordering,
    "decoding": Decoding,
    "reading": Reading,
}
"""Each group's keyword and its class."""

SHORTCUTS = {
    "batch_size": "batching",
    "max_duration": "batching",
    "num_buckets": "batching",
    "shuffle": "ordering",
    "sample_rate": "decoding",
    "on_error": "reading",
}
"""The keywords kept for the common fields (``None``: not given), and their groups."""

_KEYWORDS_BEFORE_GROUPS = frozenset(
    {
        *("max_batch_size", "remainder", "duration_bins", "quadratic_duration", "min_duration"),
        *("max_sample_duration", "sync_buckets", "batch_cost", "batch_cost_name", "shuffle_shards", "mono"),
        *("transform", "check_finite", "dtype", "retry", "storage_options", "read_ahead", "cache_bytes"),
    }
)
DEPRECATED = {
    f.name: group for group, cls in GROUPS.items() for f in fields(cls) if f.name in _KEYWORDS_BEFORE_GROUPS
}
"""The other fields that were dataset keywords before the option groups (still accepted, with a
DeprecationWarning naming its group's field). A field added since has no keyword: only its group takes it."""


class Groups(NamedTuple):
    """A dataset's four option groups."""

    batching: Batching
    ordering: Ordering
    decoding: Decoding
    reading: Reading


def option_groups(
    owner: str, groups: dict[str, Any], shortcuts: dict[str, Any], old: dict[str, Any], *, stacklevel: int = 3
) -> Groups:
    """The option groups of a dataset ``owner`` (its class name, for messages).

    Args:
        owner: The dataset class's name, for messages.
        groups: The groups given, by keyword (``None``: not given).
        shortcuts: The shortcuts given, by keyword (``None``: not given).
        old: The old keywords given (deprecated): each warns, naming its group's field.
        stacklevel: The warning's stack level: the frame of the dataset's caller.

    Returns:
        The groups: each as given, else made of its shortcuts and old keywords (defaults for the rest).

    Raises:
        OptionError: A group of the wrong type, or one given with a shortcut or old keyword of its own.
        TypeError: A keyword that is neither (as for any function).
    """
    unknown = sorted(set(old) - set(DEPRECATED))
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    given: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for name, value in shortcuts.items():
        if value is not None:
            given[SHORTCUTS[name]][name] = value
    for name, value in old.items():
        group = DEPRECATED[name]
        warnings.warn(
            f"{owner}({name}=...) is deprecated: give {group}=shardio.{GROUPS[group].__name__}({name}=...)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        given[group][name] = value
    made = {}
    for group, cls in GROUPS.items():
        value = groups.get(group)
        if value is None:
            made[group] = cls(**given[group])
            continue
        if not isinstance(value, cls):
            raise OptionError(f"{group} must be a shardio.{cls.__name__}, not {shown(value)}")
        if given[group]:
            name = sorted(given[group])[0]
            raise OptionError(
                f"{name} and {group} were both given: {name} is {group}.{name}; give it in "
                f"{group}=shardio.{cls.__name__}({name}=...), or leave out {group}"
            )
        made[group] = value
    return Groups(**made)
