"""Re-mix at resume: change a :class:`~shardio.MixedDataset`'s weights, add or drop corpora, at a checkpoint.

A state from one mix never loads into another (a :class:`~shardio.StateError` names the difference);
:func:`remix` is the one explicit path. It takes the state, the dataset that saved it and the new one, and
returns a state for the new mix (small, JSON-ready; later loads need only the new mix's indexes). The
semantics, in terms of each corpus's stream of passes (:mod:`shardio.planning.streams`: stream position
``p`` is a fixed sample of pass ``p // size``; epoch ``e`` of a mix takes the next ``q`` positions):

- **At an epoch boundary.** A state at the start of epoch ``E`` (nothing consumed, no elastic history): the
  new mix plays from epoch ``E``; after the last batch of ``E``: from ``E + 1``. Every stream continues where
  it stood at the boundary.
- **In the middle of an epoch** (any position, after any elastic history, also inside the rest of an epoch
  that an earlier mid-epoch re-mix made): the old plan's occurrences not consumed yet
  (:mod:`shardio.ledger.remainder`) are known exactly. The rest of epoch ``E`` plays exactly the unconsumed
  stream positions of the corpora the new mix keeps, each once, re-planned like an elastic resume for whatever
  world loads the state (equal batches on every rank; a fresh plan of the rest, so ``state["epoch"]`` stays
  ``E``, position 0, no history). New weights and added corpora take effect from ``E + 1``, where each kept
  corpus's stream continues right after its epoch-``E`` slice. A corpus dropped here: its unconsumed positions
  of the epoch-``E`` slice become its *pending* positions (as ranges), and re-adding it later replays exactly
  those first, then continues after the slice. So no sample of a pass is seen twice and none is skipped, for
  every corpus, across any sequence of re-mixes (pass accounting is of the loader's plan: the documented skips
  of the ``batches`` epoch size, ``remainder='drop'`` and quarantines stay what they are).
- **Corpora.** A new corpus starts its stream at position 0; a dropped corpus's stream (cursor and pending)
  stays in the state, so re-adding it later continues it. A corpus must keep its index (fingerprint, recorded
  for dropped ones too), else a :class:`~shardio.StateError`.
- **Quarantines.** Those of epoch ``E`` are already out of the rest of ``E`` (the remainder excludes them);
  those that apply from the new mix's first epoch ``since`` (carried ones) move to the new mix's ids, from
  its start (those of a dropped corpus are left behind).
- **Record.** ``extra["remix"]`` holds ``since`` (the first epoch of the current mix), the ``cursors`` and
  ``pending`` ranges of the streams there, the ``tail`` (epoch ``E`` and the positions of each corpus that the
  rest of ``E`` plays), the index ``fingerprints`` and the ``events``; :func:`remix_report` lists them.
  Position ranges keep it small (bounded by the slices being played, not by the corpora's size); read, they
  stay ranges, expanded only to plan the rest of ``E`` where at most
  :data:`~shardio.planning.mix.MAX_TAIL_EPOCHS` epochs of the mix playing it (a re-mix leaving more is
  refused: every state it writes loads). The ledger (:class:`~shardio.Trace`) of epoch ``E`` from the new
  state shows the rest of ``E`` as re-planned; the part played before the re-mix is traced from the old state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError, StateError
from ..jobstate import job_state
from ..planning.mix import MAX_TAIL_EPOCHS, tail_limit
from ..planning.mixstreams import Streams, range_length
from ..planning.planner import Planner
from ..planning.streams import Stream, as_ranges, join_ranges
from ..planning.surgery import Quarantine, Surgery
from ..state import LoaderState

if TYPE_CHECKING:
    from ..datasets.mixed import MixedDataset

__all__ = ["remix", "remix_report"]


def _moved_quarantines(
    entries: tuple[Quarantine, ...], old: MixedDataset, new: MixedDataset, since: int
) -> tuple[Quarantine, ...]:
    """The quarantine entries that apply from epoch ``since``, on ``new``'s global ids, from its start."""
    moved = []
    for entry in entries:
        if not (entry.carry or entry.epoch >= since):
            continue
        ids, keys, corpora = [], [], []
        for sample_id, key in zip(entry.ids, entry.keys or ("",) * len(entry.ids)):
            corpus = old.index.corpus(sample_id)
            if corpus in new.index.names:
                local = sample_id - int(old.index.offsets[old.index.names.index(corpus)])
                ids.append(local + int(new.index.offsets[new.index.names.index(corpus)]))
                keys.append(key)
                corpora.append(corpus)
        if ids:
            moved.append(
                replace(
                    entry,
                    epoch=since,
                    segment=0,
                    ids=tuple(ids),
                    keys=tuple(keys),
                    corpora=tuple(corpora),
                    consumed=(),
                )
            )
    return tuple(moved)


def _check_tail(tail: Mapping[str, np.ndarray], new: MixedDataset, epoch: int) -> None:
    """An :class:`OptionError` where the rest of ``epoch`` (``tail``'s ranges) is more than
    :data:`~shardio.planning.mix.MAX_TAIL_EPOCHS` epochs of ``new``: the state would not load (the planner
    refuses such a tail, as it would a tampered one)."""
    quotas = new.planner.quotas()
    total, epoch_size = sum(range_length(found) for found in tail.values()), sum(quotas.values())
    if total > tail_limit(quotas):
        raise OptionError(
            f"the rest of epoch {epoch} holds {total} samples of the corpora the new mix keeps, "
            f"more than {MAX_TAIL_EPOCHS} epochs of the new mix ({epoch_size} samples each) that "
            f"would play it: re-mix at the end of epoch {epoch}, or give the new mix a larger "
            "epoch_size"
        )


def remix(state: Mapping[str, Any], old: MixedDataset, new: MixedDataset) -> dict[str, Any]:
    """A state for a new mix that continues a state of the old one at its position, at an epoch boundary or
    in the middle of an epoch, every corpus's passes continuing exactly (see the module docs).

    Args:
        state: A state saved from `old`.
        old: The mix the state was saved from.
        new: The mix to continue with (other weights; corpora added or dropped).

    Returns:
        The state to load into `new`.

    Raises:
        OptionError: `old` or `new` not a `MixedDataset`, or a re-mix that cannot continue.
        StateError: A state that does not fit `old`, or (with `step_batches`) one inside an optimizer
            step: the rest of the epoch is planned again as whole steps.
    """
    from ..datasets.mixed import MixedDataset
    from .remainder import remaining_positions

    for name, dataset in (("old", old), ("new", new)):
        if not isinstance(dataset, MixedDataset):
            raise OptionError(f"remix takes two mixes (MixedDataset); {name} is a {type(dataset).__name__}")
    loaded: LoaderState = job_state(state)
    planner: Planner = old.planner
    current_plan = planner.check(loaded)  # the state must be old's: a StateError names what differs
    stepped = loaded.step
    if stepped is not None and stepped[1]:
        raise StateError(
            f"the state is at micro-batch {stepped[1]} of optimizer step {stepped[0]} of epoch "
            f"{loaded.epoch}: with step_batches a re-mix plans the rest of the epoch again as whole steps, "
            "so re-mix at a state saved at a step's boundary"
        )
    current = loaded.surgery.mix_streams
    in_tail = current.tail is not None and current.tail[0] == loaded.epoch
    fingerprints = {
        **current.fingerprints,
        **dict(zip(old.index.names, (p.fingerprint for p in old.index.parts))),
    }
    changed = [
        name
        for name, part in zip(new.index.names, new.index.parts)
        if name in fingerprints and fingerprints[name] != part.fingerprint
    ]
    if changed:
        raise StateError(
            f"corpora {changed} have another index in the new mix (a re-pack): their passes cannot continue"
        )
    fingerprints.update(zip(new.index.names, (p.fingerprint for p in new.index.parts)))
    at_end = loaded.position == current_plan.num_batches
    since = loaded.epoch if not (loaded.history or loaded.position or in_tail) else loaded.epoch + 1
    quotas = planner.quotas()
    streams = dict(current.streams)
    for name in old.index.names:  # every stream of the old mix, right after its last epoch before `since`
        streams[name] = streams.get(name, Stream()).advance((since - current.since) * quotas[name])
    event: dict[str, Any] = {
        "epoch": loaded.epoch,
        "step": stepped[0] if stepped else sum(s.consumed for s in loaded.history) + loaded.position,
        "old": dict(old.mix.weights),
        "new": dict(new.mix.weights),
        "corpora": {},
    }
    tail = None
    if since == loaded.epoch or at_end:
        event["at"] = "start" if since == loaded.epoch else "end"
    else:
        event["at"] = "mid-epoch"
        remaining, sizes = remaining_positions(planner, loaded)
        tail = (
            loaded.epoch,
            {name: as_ranges(remaining[name]) for name in new.index.names if name in remaining},
        )
        _check_tail(tail[1], new, loaded.epoch)
        for name in old.index.names:
            if name not in new.index.names:
                held = streams[name]
                streams[name] = Stream(
                    held.cursor, join_ranges(np.concatenate([as_ranges(remaining[name]), held.pending]))
                )
            event["corpora"][name] = {"slice": sizes[name], "remaining": int(remaining[name].shape[0])}
    for name in sorted(set(old.index.names) | set(new.index.names)):
        status = (
            "kept"
            if name in old.index.names and name in new.index.names
            else ("added" if name in new.index.names else "dropped")
        )
        held = streams.get(name, Stream())
        event["corpora"][name] = {
            **event["corpora"].get(name, {}),
            "status": status,
            "cursor": held.cursor,
            "pending": held.held,
        }
    surgery = Surgery(
        _moved_quarantines(loaded.surgery.quarantines, old, new, since),
        Streams(since, streams, tail, fingerprints, [*current.events, event]),
        loaded.surgery.other,
    )
    fresh = LoaderState(
        epoch=loaded.epoch if tail is not None else since,
        seed=loaded.seed,
        index=new.index.fingerprint,
        options=new.options,
        world_size=loaded.world_size,
        extra=surgery.to_extra(),
    )
    return fresh.to_dict()


def remix_report(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every re-mix ``state`` went through, one row per (re-mix, corpus): the epoch and epoch step it
    happened at (an optimizer step with ``step_batches``; ``at``: ``start``, ``end`` or ``mid-epoch``), the
    corpus's ``status`` (kept, added, dropped), its weights before and after, and for a mid-epoch re-mix its
    epoch-slice size (``slice``) and the positions of it not yet consumed (``remaining``: played in the rest
    of the epoch if kept, pending for its return if dropped); ``cursor``/``pending``: its stream after the
    re-mix.

    Args:
        state: A state `remix` returned (or one saved after it was loaded).

    Raises:
        StateError: A malformed state.
    """
    loaded: LoaderState = job_state(state)
    rows = []
    for number, event in enumerate(loaded.surgery.mix_streams.events):
        try:
            for name, fields in dict(event["corpora"]).items():
                rows.append(
                    {
                        "epoch": event["epoch"],
                        "step": event["step"],
                        "at": event["at"],
                        "corpus": name,
                        "old_weight": dict(event["old"]).get(name),
                        "new_weight": dict(event["new"]).get(name),
                        **dict(fields),
                    }
                )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"malformed loader state: extra.remix.events[{number}]: {exc!r}"[:300]) from None
    return rows
