"""A saved state's re-mix entry (``extra["remix"]``) as the planner reads it: each corpus's stream (cursor and
positions pending) or the tail of an epoch, parsed and bounded before anything is allocated, and
:func:`mix_args`, the streams an epoch of a mix is planned with. The ledger (:mod:`shardio.ledger.remix`)
writes the entry; the mixed dataset and the ledger read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..checks.states import MAX_COUNT
from ..errors import StateError, shown
from .quotas import MAX_EPOCH_SAMPLES
from .streams import MAX_POSITION, Stream, expand, join_ranges

__all__ = ["REMIX", "Streams", "mix_args", "range_length"]

REMIX = "remix"
"""The key of a state's ``extra`` that holds its re-mix entry."""
_KEY = REMIX


class Streams(NamedTuple):
    """The current mix's streams, from a state's ``extra["remix"]``. Positions are kept as ranges (``(k, 2)``
    int64 arrays of ``[start, stop)``, in order): each stream's ``pending`` and the ``tail``'s per corpus."""

    since: int
    streams: dict[str, Stream]
    tail: tuple[int, dict[str, np.ndarray]] | None
    fingerprints: dict[str, str]
    events: list[dict[str, Any]]

    @classmethod
    def of(cls, extra: Mapping[str, Any]) -> Streams:
        """Parse ``extra[\"remix\"]`` (no entry: every stream at 0 from epoch 0), a :class:`StateError` if
        malformed. Every number is bounded here, before anything is allocated: ``since`` by the epochs a state
        reaches, each cursor by ``since`` epochs of the largest quota, and the positions of ``pending``
        and ``tail`` (both kept as ranges, never expanded here) by the most one epoch of a mix draws (see
        :func:`_once`)."""
        entry = extra.get(_KEY)
        if entry is None:
            return cls(0, {}, None, {}, [])
        try:
            since = _number(entry["since"], "since", MAX_COUNT + 1)
            most = min(since * MAX_EPOCH_SAMPLES, MAX_POSITION)
            cursors = {
                str(name): _number(value, f"cursors.{name}", most)
                for name, value in dict(entry["cursors"]).items()
            }
            pending = {
                str(name): _once(value, f"pending.{name}", cursors.get(str(name), 0), MAX_EPOCH_SAMPLES)
                for name, value in dict(entry.get("pending", {})).items()
            }
            tail = entry.get("tail")
            if tail is not None:
                epoch = _number(tail["epoch"], "tail.epoch", MAX_COUNT)
                ranges = {
                    str(n): _once(v, f"tail.{n}", cursors.get(str(n), 0), MAX_EPOCH_SAMPLES)
                    for n, v in dict(tail["positions"]).items()
                }
                total = sum(range_length(found) for found in ranges.values())
                # the most the quotas sum to: their rounding up adds at most 1 each
                if total > MAX_EPOCH_SAMPLES + len(ranges):
                    raise StateError(
                        f"malformed loader state: extra.{_KEY}.tail holds {total} positions, "
                        f"more than one epoch of a mix draws ({MAX_EPOCH_SAMPLES})"
                    )
                tail = (epoch, ranges)
            fingerprints = {str(n): str(v) for n, v in dict(entry.get("fingerprints", {})).items()}
            events = list(entry.get("events", []))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"malformed loader state: extra.{_KEY}: {exc!r}"[:300]) from None
        if tail is not None and tail[0] >= since:
            raise StateError(
                f"malformed loader state: extra.{_KEY} has a tail epoch ({tail[0]}) not before "
                f"since ({since})"
            )
        names = set(cursors) | set(pending)
        streams = {name: Stream(cursors.get(name, 0), pending.get(name, _NO_RANGES)) for name in names}
        return cls(since, streams, tail, fingerprints, events)

    def to_extra(self) -> dict[str, Any]:
        """The JSON-ready ``extra["remix"]``."""
        entry: dict[str, Any] = {
            "since": self.since,
            "cursors": {n: s.cursor for n, s in sorted(self.streams.items())},
        }
        pending = {n: join_ranges(s.pending).tolist() for n, s in sorted(self.streams.items()) if s.held}
        if pending:
            entry["pending"] = pending
        if self.tail is not None:
            entry["tail"] = {
                "epoch": self.tail[0],
                "positions": {n: join_ranges(r).tolist() for n, r in sorted(self.tail[1].items())},
            }
        return {**entry, "fingerprints": dict(sorted(self.fingerprints.items())), "events": self.events}


_NO_RANGES = np.zeros((0, 2), dtype=np.int64)


def _number(value: Any, what: str, most: int) -> int:
    """``value``, an integer from 0 to ``most`` (not a bool, float or string), or a :class:`StateError`."""
    if type(value) is not int or not 0 <= value <= most:
        raise StateError(
            f"malformed loader state: extra.{_KEY}.{what} must be an integer from 0 to {most}, "
            f"not {shown(value)}"
        )
    return value


def range_length(ranges: np.ndarray) -> int:
    return int((ranges[:, 1] - ranges[:, 0]).sum()) if ranges.shape[0] else 0


def _once(ranges: Any, what: str, cursor: int, most: int) -> np.ndarray:
    """``ranges`` as a ``(k, 2)`` array (positions of slices already planned), checked without expanding it: a
    :class:`StateError` for a malformed range, where two ranges overlap (a position played or kept pending
    twice), one reaches the corpus's ``cursor``, or they hold more than ``most`` positions.

    ``most`` is :data:`~shardio.planning.quotas.MAX_EPOCH_SAMPLES`: what a re-mix records here is the part not
    consumed of one epoch's slice of a corpus (with the rest of an earlier pending set, itself no larger), and
    no epoch of a mix draws more; a corpus may repeat within it, so its size does not bound them."""
    if not isinstance(ranges, (list, tuple)):
        raise StateError(
            f"malformed loader state: extra.{_KEY}.{what} must be a list of [start, stop] "
            f"ranges, not {shown(ranges)}"
        )
    spans = []
    for item in ranges:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or any(type(v) is not int for v in item)
            or not 0 <= item[0] < item[1]
        ):
            expand([item])  # its StateError names the malformed range
        spans.append((item[0], item[1]))
    found = np.asarray(spans, dtype=np.int64).reshape(len(spans), 2)
    ordered = sorted(spans)
    for (_, stop), (start, _) in zip(ordered, ordered[1:]):
        if start < stop:
            raise StateError(
                f"malformed loader state: extra.{_KEY}.{what}: its position ranges overlap (at "
                f"{start}); each position is played once"
            )
    if spans and ordered[-1][1] > cursor:
        raise StateError(
            f"malformed loader state: extra.{_KEY}.{what} holds positions at or beyond the "
            f"corpus's cursor {cursor} (they must be of slices already planned)"
        )
    if range_length(found) > most:
        raise StateError(
            f"malformed loader state: extra.{_KEY}.{what} holds {range_length(found)} positions, "
            f"more than one epoch of a mix draws ({most})"
        )
    return found


def mix_args(extra: Mapping[str, Any] | Streams, epoch: int, names: list[str]) -> dict[str, Any]:
    """:func:`~shardio.planning.mix.plan_mix`'s stream arguments for ``epoch`` of a mix of ``names``
    (positions as ranges: the planner expands a tail only after bounding it by the mix's epoch), from a
    state's streams (or its ``extra``)."""
    parsed = extra if isinstance(extra, Streams) else Streams.of(extra)
    if parsed.tail is not None and parsed.tail[0] == epoch:
        unknown = sorted(set(parsed.tail[1]) - set(names))
        if unknown:
            raise StateError(
                f"the state's re-mix plays corpora {unknown} in the rest of epoch {epoch}, which "
                f"this mix of {names} lacks"
            )
        return {"tail": parsed.tail[1]}
    return {
        "since": parsed.since,
        "cursors": {n: s.cursor for n, s in parsed.streams.items()},
        "pending": {n: s.pending for n, s in parsed.streams.items()},
    }
