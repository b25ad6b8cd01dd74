"""Samples left out of an epoch's plan: a state's quarantine entries
(:class:`~shardio.planning.surgery.Surgery`) as the planner reads them, and the entry that leaves out samples
a state's DataLoader workers consumed ahead of its position. The ledger (:mod:`shardio.ledger.quarantine`)
writes quarantines; the datasets and the ledger read them through :mod:`shardio.planning.surgery`, so that the
datasets import nothing from the ledger.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import StateError
from .plan import EpochPlan
from .surgery import QUARANTINE, Quarantine, Surgery

__all__ = ["QUARANTINE", "check_entry", "check_extra", "exclusions", "leave_out_consumed", "consumed_ahead"]


def _surgery(extra: Mapping[str, Any] | Surgery) -> Surgery:
    return extra if isinstance(extra, Surgery) else Surgery.of(extra)


def check_extra(
    extra: Mapping[str, Any] | Surgery,
    num_samples: int,
    key_of: Callable[[int], str] | None = None,
    corpus_of: Callable[[int], str | None] | None = None,
) -> dict[str, Any]:
    """``extra`` of a loaded state, its quarantine entries parsed (:meth:`Surgery.of`) and checked against a
    dataset (:meth:`Surgery.check_ids`).

    Args:
        extra: The state's ``extra``.
        num_samples: The dataset's number of samples.
        key_of: The key of a sample id, or ``None``.
        corpus_of: In a mix, the corpus of a sample id, or ``None``.

    Returns:
        ``extra`` as a dict.

    Raises:
        StateError: Naming the entry and what is wrong with it.
    """
    surgery = _surgery(extra)
    surgery.check_ids(num_samples, key_of, corpus_of)
    return surgery.to_extra() if isinstance(extra, Surgery) else dict(extra)
    return dict(extra)


def exclusions(extra: Mapping[str, Any] | Surgery, epoch: int) -> list[tuple[int, np.ndarray]]:
    """The planner's ``exclude`` for ``epoch`` (see :meth:`Surgery.exclusions`)."""
    return _surgery(extra).exclusions(epoch)


def consumed_ahead(extra: Mapping[str, Any] | Surgery, epoch: int) -> dict[int, np.ndarray]:
    """The samples of ``epoch`` that workers consumed ahead of a state's position (see
    :meth:`Surgery.consumed_ahead`)."""
    return _surgery(extra).consumed_ahead(epoch)


def leave_out_consumed(
    surgery: Surgery,
    plan: EpochPlan,
    positions: Sequence[int],
    *,
    position: int,
    epoch: int,
    segment: int,
    keys: Sequence[str],
) -> Surgery:
    """``surgery`` with an entry that leaves out of ``epoch``, from history segment ``segment`` on, the
    samples of every rank's batches at ``positions`` of ``plan`` (the segment before it), which workers
    consumed ahead of a state at ``position`` (:func:`shardio.jobstate.split`). Such entries of earlier epochs
    are dropped.

    An entry leaves out every occurrence of its samples, so one that also occurs in a batch not yet consumed
    (a mix's sample drawn twice in the epoch) is a :class:`StateError`, not a lost sample."""
    if max(positions) >= plan.num_batches:
        raise StateError(
            f"the workers' states consumed batch {max(positions)} of epoch {epoch}, whose plan has "
            f"{plan.num_batches} batches per rank"
        )
    ahead = np.zeros(plan.num_batches, dtype=bool)
    ahead[list(positions)] = True
    pending = ~ahead
    pending[:position] = False
    ids, later = (
        _samples_of(plan, plan.rank_batches[:, ahead]),
        _samples_of(plan, plan.rank_batches[:, pending]),
    )
    again = np.intersect1d(ids, later)
    if again.shape[0]:
        raise StateError(
            f"the workers' states consumed {len(again)} samples ahead of their position (e.g. "
            f"{reprlib.repr(keys[int(again[0])])}) that epoch {epoch} draws again later, so they cannot "
            "be left out of the rest: load the state with the loader's own load_state_dict, or use a "
            "state saved after a whole round of workers"
        )
    found = tuple(ids.tolist())
    entry = Quarantine(
        epoch, segment, found, carry=False, ahead=True, keys=tuple(keys[i] for i in found), consumed=found
    )
    kept = tuple(e for e in surgery.quarantines if not (e.ahead and e.epoch < epoch))
    return surgery.with_quarantines((*kept, entry))


def _samples_of(plan: EpochPlan, batches: np.ndarray) -> np.ndarray:
    """The sample ids of global batches ``batches`` of ``plan``, each once, sorted."""
    taken = np.zeros(plan.offsets.shape[0] - 1, dtype=bool)
    taken[batches.ravel()] = True
    return np.unique(plan.samples[np.repeat(taken, np.diff(plan.offsets))])


def check_entry(entry: Any, number: int) -> None:
    """Check quarantine entry ``number`` of a state (see :meth:`Quarantine.of`).

    Args:
        entry: The entry as the state holds it.
        number: Its place in the list, for messages.

    Raises:
        StateError: Naming the entry and what is wrong with it.
    """
    Quarantine.of(entry, number)
