"""ShardLoader: a shardio dataset's batches from worker processes, each on a pipe of its own.

torch's DataLoader moves every batch through an index queue, a result queue and its feeder thread, and a
pickle of the batch in each direction; on a fast codec that hand-off costs as much CPU as decoding
(``benchmarks/results/workers.md``). A shardio dataset needs none of it: its workers know their batches from
the plan. Here each worker has one duplex pipe and a count of credits in shared memory
(:mod:`.credits`). The training process starts an iteration with ``prefetch`` credits per worker and grants
one more for each batch it takes; a worker makes and sends a batch for each credit it holds. The audio travels
in a reused shared-memory block, named after its first trip (:mod:`shardio.reading.blocks`), so a batch
costs one small message, and its credit no system call.

Order: batches are taken from the workers in turn, worker 0 first, skipping those that have finished, as the
DataLoader does; the plan gives worker ``w`` batches ``start + w``, ``start + w + n``, ... (see
:func:`~shardio.planning.plan.worker_batches`), so the order is the plan's for any worker count, and it
matches ``num_workers=0`` batch for batch.

Workers run the dataset exactly as DataLoader workers do (``torch.utils.data.get_worker_info()`` says which
one), so planning, instructions (``set_epoch``, ``load_state_dict``) and persistent workers behave as they do
under a DataLoader. A worker's exception is raised in the training process with the worker's traceback as a
note; a worker that dies is a ``RuntimeError`` naming it and its exit code, never a hang. One that lives but
gives nothing (stopped, blocked) fails at ``timeout``; without one it is waited for, with a warning naming it
(:mod:`.pool`, :mod:`.silence`).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import warnings
import weakref
from collections.abc import Generator, Iterator
from typing import Any

import torch

from ..checks.options import flag, integer, real
from ..checks.states import MAX_WORKERS
from ..datasets.dataset import ShardDataset
from ..errors import OptionError, shown
from ..runtime.yieldlog import YieldLog, recorder
from ..state import batch_position
from ..world import Context
from .pinning import Pinner, pinned
from .pool import WorkerPool
from .server import BATCH, ERROR

__all__ = ["ShardLoader"]

logger = logging.getLogger(__name__)

MAX_PREFETCH = 1024
"""The most batches a worker may have ready ahead (each holds a batch's memory; credits
count up one by one)."""

_WITH_WORKERS: weakref.WeakSet[ShardLoader] = weakref.WeakSet()
"""Loaders whose workers may be running, closed at exit while the modules they use are still whole (an
iterator left unfinished is otherwise finalised after them, and its halt fails)."""


class ShardLoader:
    """Iterates a batched :class:`~shardio.ShardDataset` (or :class:`~shardio.MixedDataset`) in
    worker processes, with a fraction of a DataLoader's per-batch cost (see the module docs).

    :meth:`state_dict` is the job's state after the last batch this loader yielded (exact, with any number of
    workers); :meth:`load_state_dict` continues from a state, as :meth:`ShardDataset.load_state_dict
    <shardio.ShardDataset.load_state_dict>` does.

    Args:
        dataset: A batched `ShardDataset` or `MixedDataset` (a dataset of single samples is refused: use
            a `DataLoader` with `collate`).
        num_workers: Worker processes (default 2); 0 iterates in this process. Each worker holds its own
            reader and up to `prefetch` batches.
        prefetch: Batches each worker may have ready ahead of the training process (default 2; at most 1024).
            Memory: `num_workers * prefetch` batches in shared memory.
        persistent_workers: Keep the workers between iterations (epochs; default `True`): no start-up cost per
            epoch, and the workers' memory stays held.
        multiprocessing_context: `"fork"`, `"forkserver"`, `"spawn"` or a context (default: the platform's).
            Spawn and forkserver workers start slower and receive the dataset pickled (its plan by reference).
        pin_memory: Batches in pinned memory for asynchronous copies to the GPU (default `False`), copied by a
            thread of their own when there are workers (a copy of each batch). Without an accelerator: a
            warning, and nothing is pinned.
        timeout: Seconds to wait for a batch before failing (default 0: no limit, with a warning after a
            minute of silence); a dead worker fails at once either way.

    Raises:
        OptionError: Not a shardio dataset, an unbatched one, or an option of the wrong type or out of range.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        num_workers: int = 2,
        prefetch: int = 2,
        persistent_workers: bool = True,
        multiprocessing_context: Any = None,
        pin_memory: bool = False,
        timeout: float = 0.0,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise OptionError(
                f"ShardLoader iterates a shardio ShardDataset or MixedDataset, not a "
                f"{type(dataset).__name__}; use torch's DataLoader for other datasets"
            )
        if not dataset.batched:
            raise OptionError(
                "ShardLoader hands over whole batches: give the dataset batch_size or max_duration "
                "(or batch its samples with a DataLoader: batch_size=N, collate_fn=shardio.collate)"
            )
        num_workers = integer("num_workers", num_workers, 0, MAX_WORKERS)
        prefetch = integer("prefetch", prefetch, 1, MAX_PREFETCH)
        if timeout == float("inf"):  # no limit, as 0 (and warned of silence as 0 is)
            timeout = 0.0
        real("timeout", timeout, "a number of seconds >= 0 (0: no limit)")
        if not timeout >= 0:
            raise OptionError(f"timeout must be a number of seconds >= 0 (0: no limit), not {shown(timeout)}")
        persistent_workers = flag("persistent_workers", persistent_workers)
        pin_memory = flag("pin_memory", pin_memory)
        if isinstance(multiprocessing_context, str):
            if multiprocessing_context not in multiprocessing.get_all_start_methods():
                raise OptionError(
                    f"multiprocessing_context must be one of "
                    f"{', '.join(multiprocessing.get_all_start_methods())} or a context, not "
                    f"{shown(multiprocessing_context)}"
                )
        elif multiprocessing_context is not None and not isinstance(
            multiprocessing_context, multiprocessing.context.BaseContext
        ):
            raise OptionError(
                f"multiprocessing_context must be a start method's name or a multiprocessing context, "
                f"not {shown(multiprocessing_context)}"
            )
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.persistent_workers = persistent_workers
        self.timeout = float(timeout)
        self._pool = WorkerPool(
            multiprocessing.get_context(multiprocessing_context)
            if multiprocessing_context is None or isinstance(multiprocessing_context, str)
            else multiprocessing_context
        )
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn(
                "pin_memory=True, but no accelerator is available: batches are not pinned", stacklevel=2
            )
        self._iteration = 0  # iterations begun; an older iterator that is resumed fails
        # (instruction generation, position of the last batch yielded): not the batch,
        # whose block it would hold
        self._last: tuple[int, dict[str, int]] | None = None
        self._pinner: Pinner | None = None  # the pin-memory thread of the iteration in progress

    def __len__(self) -> int:
        """Batches per rank in the dataset's current (or next) epoch: ``len(dataset)``."""
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """`dataset.set_epoch(epoch)`: the next iteration plays the epoch from its start.

        Args:
            epoch: The epoch, from 0.
        """
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The job's state after the last batch yielded (before any: the dataset's own state)."""
        if self._last is not None and self._last[0] == self.dataset.instructions:
            return self.dataset.state_after(self._last[1])
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state at the next iteration; with another world size or worker count, every sample
        not yet consumed in its epoch is consumed exactly once in the rest of it.

        Args:
            state: This loader's state, a dataset's, or a `StatefulDataLoader`'s.

        Raises:
            StateError: A state that does not fit the dataset.
        """
        self.dataset.load_state_dict(state)
        self._last = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The batches of the next iteration. Nothing starts before the first ``next()`` (Lightning calls
        ``iter()`` once only to check that a loader is iterable); that first ``next()`` stops an earlier
        iteration left unfinished."""
        self._iteration += 1
        iteration = self._iteration
        self._stop_pinning()
        self._pool.halt(self.timeout)
        self._last = None
        if self.num_workers == 0:
            for batch in self.dataset:
                self._check(iteration)
                yield self._handed(pinned(batch) if self.pin_memory else batch)
            return
        taken = self._taken(iteration)
        log = recorder()  # the workers record nothing: what this process hands over is recorded here
        logged = None if log is None else self._yield_fields(log, iteration)
        pinner = None
        if self.pin_memory:
            device = torch.cuda.current_device() if torch.cuda.is_available() else None
            pinner = self._pinner = Pinner(taken, depth=self.prefetch, device=device)
        try:
            for batch in taken if pinner is None else pinner:
                if log is not None and logged is not None:
                    log.batch(batch, **logged)
                yield self._handed(batch)
                self._check(iteration)
        finally:
            if pinner is not None:
                pinner.stop()
            taken.close()

    def _taken(self, iteration: int) -> Generator[dict[str, Any], None, None]:
        """The batches of iteration ``iteration`` from the workers, in the plan's order, as they arrive."""
        pool = self._pool
        pool.start(self.dataset, self.num_workers)
        _WITH_WORKERS.add(self)
        pool.begin(self.prefetch)
        turn = 0
        try:
            while pool.running:
                number = turn % self.num_workers
                turn += 1
                if number not in pool.running:
                    continue
                kind, payload = pool.receive(number, self.timeout)
                if kind == BATCH:
                    pool.grant(number)
                    yield payload
                    continue
                pool.running.discard(number)
                if kind == ERROR:
                    raise payload
        finally:
            if iteration == self._iteration:
                pool.halt(self.timeout)
                if not self.persistent_workers:
                    pool.shutdown()

    def _yield_fields(self, log: YieldLog, iteration: int) -> dict[str, Any]:
        """What each batch record of this iteration carries besides the batch (the yield log's)."""
        world = self.dataset.ranks(Context.detect())
        return {
            "src": log.source(self.dataset.index.fingerprint, self.dataset.seed),
            "rank": world.rank,
            "world": world.world_size,
            "worker": None,
            "it": f"{os.getpid()}.{id(self)}.{iteration}",
        }

    def _handed(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch``, its position kept for :meth:`state_dict`."""
        self._last = (self.dataset.instructions, _position(batch))
        return batch

    def _check(self, iteration: int) -> None:
        if iteration != self._iteration:
            raise RuntimeError(
                "this ShardLoader iterator was superseded: a newer iteration of the loader began"
            )

    def _stop_pinning(self) -> None:
        """End the pin-memory thread of an earlier iteration, which may still be taking its batches."""
        if self._pinner is not None:
            self._pinner.stop()
            self._pinner = None

    def close(self) -> None:
        """Stop and end the workers (a later iteration starts new ones)."""
        self._iteration += 1
        self._stop_pinning()
        self._pool.halt(self.timeout)
        self._pool.shutdown()

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop_pinning()
            self._pool.shutdown()
        except Exception:  # interpreter shutdown: the workers are daemons and end with this process
            pass


@atexit.register
def _close_at_exit() -> None:
    """Close every loader with workers, before the interpreter tears down the modules that closing uses."""
    for loader in list(_WITH_WORKERS):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - exiting: a worker that cannot be stopped is a daemon, ended with us
            logger.debug("a shardio loader could not be closed at exit", exc_info=True)


def _position(batch: dict[str, Any]) -> dict[str, int]:
    epoch, index = batch_position(batch)
    return {"epoch": epoch, "batch_index": index}
