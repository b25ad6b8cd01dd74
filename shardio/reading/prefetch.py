"""Read-ahead: a worker's remote reads, known from its plan, coalesced and fetched concurrently in advance.

A worker knows every batch it will build (its share of the plan), so before it builds one it already
asks for the bytes of the next ones. The byte spans of their samples are merged per shard where they touch
or lie within ``max_gap`` bytes (one request for a run of a shard: :func:`coalesce`); the
requests go to a bounded thread pool (``concurrency``). Batches are taken ahead in groups of about half
of ``budget`` bytes (at least one batch), whose spans are coalesced together (a run of a shard read over
several batches is one request); one group is read while the next is fetched. The reader asks
:meth:`ReadAhead.take` first; what it does not hold (or what failed in the background) the reader reads
itself, with its own retries and error messages, so a failure here costs a second try, never a sample.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["Span", "ReadAhead", "coalesce"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of shard number ``shard``."""

    shard: int
    start: int
    end: int


def coalesce(spans: Iterable[Span], max_gap: int, dense: float = 0.5) -> list[Span]:
    """``spans`` merged per shard where they overlap or lie within ``max_gap`` bytes of each other; and a shard
    whose spans cover at least ``dense`` of the bytes from its first to its last is read in one span (most of
    it is wanted: one request, streamed, beats many)."""
    merged: list[Span] = []
    wanted: dict[int, int] = {}
    for span in sorted(spans, key=lambda s: (s.shard, s.start)):
        previous = merged[-1] if merged else None
        if previous is not None and previous.shard == span.shard and span.start <= previous.end + max_gap:
            wanted[span.shard] += max(0, span.end - max(span.start, previous.end))
            merged[-1] = Span(previous.shard, previous.start, max(previous.end, span.end))
        else:
            wanted[span.shard] = wanted.get(span.shard, 0) + span.end - span.start
            merged.append(span)
    first: dict[int, Span] = {}
    last: dict[int, Span] = {}
    for span in merged:
        first.setdefault(span.shard, span)
        last[span.shard] = span
    whole = {shard for shard, span in first.items()
             if wanted[shard] >= dense * (last[shard].end - span.start)}
    return sorted([*(Span(shard, first[shard].start, last[shard].end) for shard in whole),
                   *(span for span in merged if span.shard not in whole)], key=lambda s: (s.shard, s.start))


class _Fetch:
    """One coalesced request, running or done."""

    def __init__(self, span: Span, future: Future[bytes]) -> None:
        self.span = span
        self.future = future

    def slice(self, offset: int, size: int) -> bytes | None:
        try:
            data = self.future.result()
        except Exception as exc:  # noqa: BLE001 - the reader reads it again itself, and reports what fails
            logger.debug("read-ahead of %s failed (%s: %s); the reader reads it itself", self.span,
                         type(exc).__name__, exc)
            return None
        start = offset - self.span.start
        return data[start : start + size] if start + size <= len(data) else None


class ReadAhead:
    """Fetches the spans of upcoming batches in the background.

    ``spans_of(ids)`` gives the byte spans a batch of sample ids reads; ``fetch(span)`` reads one span
    (it runs in the pool's threads). Use :meth:`run` around the batches, and :meth:`take` from the reader.
    """

    def __init__(self, spans_of: Callable[[np.ndarray], list[Span]], fetch: Callable[[Span], bytes], *,
                 budget: int = 64 << 20, concurrency: int = 16, max_gap: int = 64 << 10,
                 on_request: Callable[[int], None] | None = None) -> None:
        self.spans_of = spans_of
        self.fetch = fetch
        self.budget = budget
        self.max_gap = max_gap
        self.on_request = on_request
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="shardio-read-ahead")
        self._current: dict[int, list[_Fetch]] = {}
        self.met: set[int] = set()
        """Shards the caller has already planned whole-shard reads for (its own bookkeeping)."""

    def run(self, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """The batches, in order; while the caller builds some, the next ones' bytes are fetched.

        Batches are taken in groups of about half the budget (at least one batch); a group's spans are
        coalesced together, so a run of a shard read over several batches is one request. One group is
        read while the next is fetched: at most about ``budget`` bytes are held.
        """
        upcoming = iter(batches)
        pending: deque[tuple[list[np.ndarray], dict[int, list[_Fetch]]]] = deque()
        try:
            while True:
                while len(pending) < 2:
                    group = self._group(upcoming)
                    if group is None:
                        break
                    pending.append(group)
                if not pending:
                    return
                group_ids, self._current = pending.popleft()
                yield from group_ids
        finally:
            self._current = {}
            for _, fetches in pending:
                for fetch in (f for group in fetches.values() for f in group):
                    fetch.future.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _group(self, upcoming: Iterator[np.ndarray]) -> tuple[list[np.ndarray], dict[int, list[_Fetch]]] | None:
        """The next batches, up to about half the budget of spans (at least one), with their fetches submitted."""
        group: list[np.ndarray] = []
        spans: list[Span] = []
        size = 0
        while size < self.budget // 2 or not group:
            ids = next(upcoming, None)
            if ids is None:
                break
            group.append(ids)
            more = self.spans_of(ids)
            spans += more
            size += sum(span.end - span.start for span in more)
        if not group:
            return None
        return group, self._submit(spans)

    def _submit(self, spans: list[Span]) -> dict[int, list[_Fetch]]:
        fetches: dict[int, list[_Fetch]] = {}
        for span in coalesce(spans, self.max_gap):
            fetches.setdefault(span.shard, []).append(_Fetch(span, self._pool.submit(self.fetch, span)))
            if self.on_request is not None:
                self.on_request(span.end - span.start)
        return fetches

    def take(self, shard: int, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` of shard ``shard`` when the current batch's read-ahead holds
        them (waiting for its request), else None."""
        for fetch in self._current.get(shard, ()):
            if fetch.span.start <= offset and offset + size <= fetch.span.end:
                return fetch.slice(offset, size)
        return None
