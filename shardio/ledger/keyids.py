"""Sample keys to sample ids, for the ledger: the keys a quarantine or a trace names, found
in a dataset's index."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import OptionError

__all__ = ["resolve_keys"]


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
