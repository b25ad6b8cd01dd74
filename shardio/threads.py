"""Threads: a process's planned batches assembled by a few threads, yielded in plan order.

Reading (``madvise``), casting PCM (numpy) and decoding (libsndfile, through cffi) release the GIL, so threads
in the training process decode in parallel with no transport at all: a batch lands in a reused private block
(:func:`shardio.collate.audio_block`) and is handed over as it is. Each thread has its own
:class:`~shardio.reader.Reader` (open shards, zstd context) and :class:`~shardio.assembly.Assembler`; batches
are submitted in plan order, at most ``threads`` ahead of the one the consumer waits for, and yielded in that
order, so what comes out (batches, errors, their order) is what one thread gives.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from . import collate
from .assembly import Assembler
from .errors import OptionError
from .reader import Reader, ReadStats

__all__ = ["assembled", "check_threads", "threaded_batches"]


def check_threads(threads: int) -> int:
    """``threads`` if it is a valid ``ShardDataset(threads=...)``: 0 (assemble in the iterating thread) or more."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise OptionError(f"threads must be a non-negative integer, not {threads!r}")
    return threads


def assembled(make: Callable[[Reader], Assembler], reader: Reader, jobs: Iterable[tuple[np.ndarray, int]],
              threads: int) -> Iterator[dict[str, Any]]:
    """The batches of ``jobs`` (``(sample ids, epoch)``), in order: assembled in this thread by ``make(reader)``
    when ``threads`` is 0, else by :func:`threaded_batches` with a reader per thread (counted in ``reader``)."""
    if threads == 0:
        assembler = make(reader)
        for ids, epoch in jobs:
            yield assembler.batch(ids, epoch)
        return
    collate.reserve_blocks(threads)
    batches = threaded_batches(lambda: make(Reader(reader.index, retry=reader.retry)), jobs, threads=threads,
                               stats=reader.stats)
    try:
        yield from batches
    finally:
        batches.close()


def _merge(into: ReadStats, part: ReadStats) -> None:
    into.samples += part.samples
    into.skipped += part.skipped
    into.retries += part.retries
    into.errors.update(part.errors)


def threaded_batches(make: Callable[[], Assembler], jobs: Iterable[tuple[np.ndarray, int]], *, threads: int,
                     stats: ReadStats) -> Generator[dict[str, Any], None, None]:
    """The batches of ``jobs`` (``(sample ids, epoch)``, in order), assembled by ``threads`` threads, each with
    an assembler made by ``make``; every batch's loading counters are added to ``stats`` as it is yielded.

    Closing the iterator early cancels the batches not yet started and waits for those being assembled."""
    local = threading.local()

    def run(ids: np.ndarray, epoch: int) -> tuple[dict[str, Any], ReadStats]:
        assembler: Assembler | None = getattr(local, "assembler", None)
        if assembler is None:
            assembler = local.assembler = make()
        assembler.reader.stats = ReadStats()
        return assembler.batch(ids, epoch), assembler.reader.stats

    pool = ThreadPoolExecutor(threads, thread_name_prefix="shardio-decode")
    pending: deque[Future[tuple[dict[str, Any], ReadStats]]] = deque()
    try:
        for ids, epoch in jobs:
            pending.append(pool.submit(run, ids, epoch))
            if len(pending) > threads:
                batch, part = pending.popleft().result()
                _merge(stats, part)
                yield batch
        while pending:
            batch, part = pending.popleft().result()
            _merge(stats, part)
            yield batch
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
