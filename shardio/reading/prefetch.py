"""Read-ahead: a worker's remote reads, known from its plan, coalesced and fetched concurrently in advance.

A worker knows every batch it will build (its share of the plan), so before it builds one it already
asks for the bytes of the next ones. The byte spans of their samples are merged per shard where they touch
or lie within ``max_gap`` bytes (:data:`MAX_GAP`; one request for a run of a shard: :func:`coalesce`); the
requests go to a bounded thread pool (``concurrency``). Batches are taken ahead in groups of about half
of ``budget`` bytes (at least one batch), whose spans are coalesced together (a run of a shard read over
several batches is one request); one group is read while the next is fetched, and a group's requests go
to the pool in the order its batches need them (the first batch's first), so the first batch waits for its own
bytes, not for the whole group's. A DataLoader worker reads only every ``num_workers``-th batch, so its spans
cover at most about that share of a shard's run: ``share`` (1 / workers) lowers the density at which a
shard is read whole accordingly (:func:`dense_for`), or interleaved workers would each read a run of a shard
as a request per sample (measured with 2 workers, one shard per shuffle window: 0.28 requests a sample,
against 0.06 with 0 workers). The reader asks
:meth:`ReadAhead.take` first; what it does not hold (or what failed in the background) the reader reads
itself, with its own retries and error messages, so a failure here costs a second try, never a sample.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_GAP", "Span", "ReadAhead", "coalesce", "dense_for"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, end)`` of shard number ``shard``."""

    shard: int
    start: int
    end: int


MAX_GAP = 1 << 20
"""Spans of a shard this close are fetched as one request, the hole included: at ~100 MB/s a MiB takes ~10 ms,
less than one more request's latency on object storage (20-100 ms). With 64 KiB, samples of ~100 KB shuffled
over 12 shards took 0.7 requests a sample and ran below WebDataset at 50 ms (418 vs 485 samples/s); with
1 MiB, 0.1 requests and 1,103 samples/s, for 2.7x the bytes (``benchmarks/remote.py``)."""
DENSE = 0.5
"""A reader that wants this share of the bytes from a shard's first wanted byte to its last reads them
whole."""
MIN_DENSE = 0.25
"""The least density read whole, whatever the worker count: below it a worker fetches 4x the bytes it uses."""


def dense_for(share: float) -> float:
    """The density at which a reader getting ``share`` of the plan's batches (1 / DataLoader workers) reads a
    shard's span whole: :data:`DENSE` scaled by ``share``, at least :data:`MIN_DENSE`."""
    return max(MIN_DENSE, DENSE * min(1.0, share))


def coalesce(spans: Iterable[Span], max_gap: int, dense: float = DENSE) -> list[Span]:
    """``spans`` merged per shard where they overlap or lie within ``max_gap`` bytes of each other; and a
    shard whose spans cover at least ``dense`` of the bytes from its first to its last is read in one span
    (most of it is wanted: one request, streamed, beats many)."""
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
    whole = {
        shard for shard, span in first.items() if wanted[shard] >= dense * (last[shard].end - span.start)
    }
    return sorted(
        [
            *(Span(shard, first[shard].start, last[shard].end) for shard in whole),
            *(span for span in merged if span.shard not in whole),
        ],
        key=lambda s: (s.shard, s.start),
    )


class _Fetch:
    """One coalesced request, running or done."""

    def __init__(self, span: Span, future: Future[bytes]) -> None:
        self.span = span
        self.future = future

    def slice(self, offset: int, size: int) -> bytes | None:
        try:
            data = self.future.result()
        except Exception as exc:  # noqa: BLE001 - the reader reads it again itself, and reports what fails
            logger.debug(
                "read-ahead of %s failed (%s: %s); the reader reads it itself",
                self.span,
                type(exc).__name__,
                exc,
            )
            return None
        start = offset - self.span.start
        return data[start : start + size] if start + size <= len(data) else None


class ReadAhead:
    """Fetches the spans of upcoming batches in the background.

    ``spans_of(ids)`` gives the byte spans a batch of sample ids reads; ``fetch(span)`` reads one span
    (it runs in the pool's threads). Use :meth:`run` around the batches, and :meth:`take` from the reader.
    """

    def __init__(
        self,
        spans_of: Callable[[np.ndarray], list[Span]],
        fetch: Callable[[Span], bytes],
        *,
        budget: int = 64 << 20,
        concurrency: int = 16,
        max_gap: int = MAX_GAP,
        share: float = 1.0,
        on_request: Callable[[int], None] | None = None,
    ) -> None:
        self.spans_of = spans_of
        self.fetch = fetch
        self.budget = budget
        self.max_gap = max_gap
        self.dense = dense_for(share)
        self.on_request = on_request
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="shardio-read-ahead")
        self._current: dict[int, list[_Fetch]] = {}
        self.met: set[int] = set()
        """Shards the caller has already planned whole-shard reads for (its own bookkeeping)."""
        self.sizes: dict[int, Future[int]] = {}
        """Shards whose size the caller is checking in the pool (:meth:`background`), by shard number."""

    def background(self, action: Callable[[], int]) -> Future[int]:
        """``action`` run in the pool (a shard's size check: one request per shard, otherwise paid in turn by
        the reader as it first opens each shard)."""
        return self._pool.submit(action)

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

    def _group(
        self, upcoming: Iterator[np.ndarray]
    ) -> tuple[list[np.ndarray], dict[int, list[_Fetch]]] | None:
        """The next batches, up to about half the budget of spans (at least one), with their fetches
        submitted."""
        group: list[np.ndarray] = []
        spans: list[list[Span]] = []  # per batch of the group
        size = 0
        while size < self.budget // 2 or not group:
            ids = next(upcoming, None)
            if ids is None:
                break
            group.append(ids)
            spans.append(self.spans_of(ids))
            size += sum(span.end - span.start for span in spans[-1])
        if not group:
            return None
        return group, self._submit(spans)

    def _submit(self, spans: list[list[Span]]) -> dict[int, list[_Fetch]]:
        """The coalesced requests of a group's spans (one list per batch), submitted in the order of the first
        batch that needs each."""
        merged = coalesce((span for batch in spans for span in batch), self.max_gap, self.dense)
        # per shard: its coalesced spans' starts, in order (coalesce sorts them)
        starts: dict[int, list[int]] = {}
        first: dict[int, int] = {}  # per shard: the position of its first coalesced span
        for position, span in enumerate(merged):
            first.setdefault(span.shard, position)
            starts.setdefault(span.shard, []).append(span.start)
        need = [len(spans)] * len(merged)
        for number, batch in enumerate(spans):
            for span in batch:
                position = first[span.shard] + bisect.bisect_right(starts[span.shard], span.start) - 1
                need[position] = min(need[position], number)
        fetches: dict[int, list[_Fetch]] = {}
        # stable: shard order within a batch
        for position in sorted(range(len(merged)), key=lambda p: need[p]):
            span = merged[position]
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
