"""Re-mix at resume: change a :class:`~shardio.MixedDataset`'s weights, add or drop corpora, at a checkpoint.

A state from one mix never loads into another (a :class:`~shardio.StateError` names the difference);
:func:`remix` is the one explicit path. It takes the state, the dataset that saved it and the new one, and
returns a state for the new mix. The semantics:

- **Where.** At an epoch boundary: the state is at the start of epoch ``E`` (nothing consumed, no
  elastic history) and the new mix plays from epoch ``E``, or it is after the last batch of epoch ``E``
  and the new mix plays from ``E + 1``. A state in the middle of an epoch is refused (finish the epoch).
- **Pass accounting.** Each corpus is an endless stream of passes (:mod:`shardio.planning.mix`); under a mix
  that took effect at epoch ``s`` with cursor ``k``, epoch ``e`` takes stream positions
  ``[k + (e - s) * q, k + (e - s + 1) * q)`` (``q`` its quota). The re-mix sets each corpus's cursor to
  where its stream stands at the boundary, so the new quotas continue each stream exactly: no sample of a
  pass is seen twice and none is skipped, across the re-mix (the ``batches`` epoch size keeps its
  documented skip of a few samples planned beyond the epoch's last batch).
- **Added and dropped corpora.** A new corpus starts its stream at position 0; a dropped corpus's cursor
  stays in the state, so re-adding it later continues where it stopped. Corpora in both mixes must have
  the same index (fingerprint), else a :class:`~shardio.StateError`.
- **Quarantines** that still apply from epoch ``since`` (carried ones, and those made in that epoch) move
  to the new mix's ids, as from the start of epoch ``since`` (those of a dropped corpus are left behind).
- **Record.** ``extra["remix"]`` holds ``since`` (the first epoch of the current mix) and the cursors.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import StateError
from ..planning.mix import mix_quotas
from ..state import LoaderState, combine, find_states
from ..world import World

if TYPE_CHECKING:
    from ..mixed import MixedDataset

__all__ = ["remix", "streams_of"]

_KEY = "remix"


def streams_of(extra: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """The cursors and the first epoch (``since``) of the current mix, from a state's ``extra``."""
    entry = extra.get(_KEY)
    if entry is None:
        return {}, 0
    try:
        cursors = {str(name): int(value) for name, value in dict(entry["cursors"]).items()}
        since = int(entry["since"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"malformed loader state: extra.{_KEY}: {exc!r}") from None
    if since < 0 or any(value < 0 for value in cursors.values()):
        raise StateError(f"malformed loader state: extra.{_KEY} has negative fields: {entry}")
    return cursors, since


def _cursors_at(dataset: MixedDataset, extra: Mapping[str, Any], epoch: int) -> dict[str, int]:
    """Every corpus's stream position at the start of ``epoch`` under ``dataset``'s mix (and ``extra``)."""
    cursors, since = streams_of(extra)
    batching = dataset.batching if dataset.batched else replace(dataset.batching, batch_size=1)
    quotas = mix_quotas(dataset.index.columns_of(), dataset.mix, batching, seed=dataset.seed,
                        ordering=dataset.ordering)
    now = {name: cursors.get(name, 0) + (epoch - since) * quota for name, quota in quotas.items()}
    return {**cursors, **now}


def _moved_quarantines(entries: list[dict[str, Any]], old: MixedDataset, new: MixedDataset,
                       since: int) -> list[dict[str, Any]]:
    """The quarantine entries that apply from epoch ``since``, on ``new``'s global ids, from its start."""
    moved = []
    for entry in entries:
        if not (entry["carry"] or int(entry["epoch"]) >= since):
            continue
        ids, keys, corpora = [], [], []
        for sample_id, key in zip(entry["ids"], entry["keys"]):
            corpus = old.index.corpus(sample_id)
            if corpus in new.index.names:
                local = sample_id - int(old.index.offsets[old.index.names.index(corpus)])
                ids.append(local + int(new.index.offsets[new.index.names.index(corpus)]))
                keys.append(key)
                corpora.append(corpus)
        if ids:
            moved.append({**entry, "epoch": since, "segment": 0, "ids": ids, "keys": keys, "corpora": corpora,
                          "consumed": []})
    return moved


def remix(state: Mapping[str, Any], old: MixedDataset, new: MixedDataset) -> dict[str, Any]:
    """A state for ``new`` that continues ``state`` (saved from ``old``) at its epoch boundary, every
    corpus's passes continuing exactly (see the module docs)."""
    loaded: LoaderState = combine(find_states(state))
    probe = copy.copy(old)
    probe._explicit_world = probe._world = World(0, loaded.world_size)
    probe.load_state_dict(loaded.to_dict())  # the state must be old's: a StateError names what differs
    if not loaded.history and loaded.position == 0:
        since = loaded.epoch
    elif loaded.position == probe.plan().num_batches:
        since = loaded.epoch + 1
    else:
        raise StateError(f"a re-mix happens at an epoch boundary: the state is at batch {loaded.position} of "
                         f"{probe.plan().num_batches} in epoch {loaded.epoch}; finish the epoch first")
    old_parts = dict(zip(old.index.names, (p.fingerprint for p in old.index.parts)))
    changed = [name for name, part in zip(new.index.names, new.index.parts)
               if name in old_parts and old_parts[name] != part.fingerprint]
    if changed:
        raise StateError(f"corpora {changed} have another index in the new mix (a re-pack): their passes "
                         "cannot continue")
    cursors = _cursors_at(probe, loaded.extra, since)
    extra = {name: value for name, value in loaded.extra.items() if name not in (_KEY, "quarantine")}
    extra[_KEY] = {"since": since, "cursors": cursors}
    moved = _moved_quarantines(loaded.extra.get("quarantine", []), old, new, since)
    if moved:
        extra["quarantine"] = moved
    fresh = LoaderState(epoch=since, seed=loaded.seed, index=new.index.fingerprint, options=new.options,
                        world_size=loaded.world_size, extra=extra)
    return fresh.to_dict()
