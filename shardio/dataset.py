"""ShardDataset: a stateful IterableDataset that executes the epoch plan and resumes exactly.

The training process holds its rank's share of an epoch's plan (``set_epoch``); each DataLoader worker takes
its batches of that share, reads and decodes only those samples, and yields collated batches. An epoch's plan
is computed once per node (:mod:`shardio.workers.planfiles`): the first process that needs it (a rank's
training process when the world size is above 1 or its workers have begun, or a worker beginning an epoch the
training process did not plan) plans the whole epoch under a lock and writes every rank's share; every other
process of the node reads its rank's part. One rank without workers yet plans in memory. A worker inherits the
share (fork), receives it in shared memory (spawn, forkserver: :mod:`shardio.workers.sharing`) or reads it. A
process plans by itself when the cache directory cannot hold the files or the lock, or its files are not to be
trusted (another user's, writable by others, not this plan's: :mod:`shardio.workers.nodeplan`). Every rank
yields the same number of batches, so the state of rank 0 restores the whole job; plan files are derived data,
not state.

Progress: ``state_dict()`` is exact when iteration happens in this process (``num_workers=0``) or inside
workers (torchdata's ``StatefulDataLoader``). With a plain multi-worker ``DataLoader`` the main process never
sees iteration, so every batch carries ``epoch`` and ``batch_index`` and ``state_after(batch)`` gives the
state to save after that batch.

Instructions: ``set_epoch`` and ``load_state_dict`` in the training process go into a shared block
(:mod:`shardio.workers.control`) that every worker, persistent ones too, reads when an iteration starts;
inside a worker (``StatefulDataLoader`` restoring its workers) ``load_state_dict`` is that worker's own. Each
process's position among them is its :class:`~shardio.workers.progress.Progress`. The
world is decided in the training process and carried to spawn/forkserver workers when the dataset is pickled for them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from .checks.datasets import check_rates, check_some_eligible, source_index
from .epochplans import EpochPlans
from .errors import OptionError, StateError, shown
from .ledger.quarantine import check_extra, leave_out_consumed
from .checks.options import integer
from .planning.plan import Batching, EpochPlan, Ordering, worker_batches
from .planning.rankplan import RankPlan
from .reading.assembly import Assembler, Decoding, Transform
from .reading.cache import ShardCache
from .reading.reader import Reader, ReadStats
from .reading.retries import RetryPolicy
from .reading.storage import cache_dir
from .shards.index import Index
from .state import LoaderState, batch_position, find_states, steps_after_snapshot
from .workers.control import Instruction, extra_mark
from .workers.progress import Progress, resume_point
from .workers.sharing import shared, shared_table
from .world import World, refuse_resharding

__all__ = ["ShardDataset", "Transform"]

logger = logging.getLogger(__name__)


class ShardDataset(EpochPlans, IterableDataset):
    """Planned, rank-balanced, resumable batches of decoded audio from a shardio dataset.

    ``source`` is a dataset directory or URL (holding ``index.json``) or a loaded :class:`Index`. Batch
    by ``batch_size`` or ``max_duration`` (padded seconds); with neither, single samples are yielded.
    ``num_buckets`` or ``duration_bins`` form batches within duration buckets (less padding; the batch
    order is shuffled per epoch); ``quadratic_duration``, ``min_duration`` and ``max_sample_duration``
    are the cost and filters of :class:`~shardio.planning.plan.Batching`; ``sync_buckets`` (on when bucketing) gives
    all ranks batches of one bucket and of nearly equal cost (``batch_cost``/``batch_cost_name``) at every step.
    ``world`` gives the rank and world size explicitly; by default they come from ``torch.distributed``
    or the ``RANK``/``WORLD_SIZE`` environment. ``on_error="skip"`` logs and leaves out samples that cannot
    be read or decoded (listed in the batch's ``skipped``, counted in :attr:`stats`) while still yielding every
    planned batch. ``storage_options`` (endpoint, credentials) are for a remote ``source`` (see
    :meth:`Index.load`); ``retry`` bounds the retries of remote reads; ``read_ahead`` is the bytes of
    remote reads each process fetches ahead of the batch it builds (coalesced and concurrent, see
    :mod:`shardio.reading.prefetch`; 0 reads each sample when it is needed). ``cache_bytes`` > 0 reads remote shards
    whole through a node-local disk cache of that size under :func:`~shardio.reading.storage.cache_dir`, shared by
    every process on the node (:mod:`shardio.reading.cache`). ``dtype="int16"`` yields audio as int16 (16-bit PCM
    as stored; half the bytes; see :mod:`shardio.reading.pcm16`).
    """

    def __init__(self, source: str | os.PathLike[str] | Index, *, batch_size: int | None = None,
                 max_duration: float | None = None, max_batch_size: int | None = None, remainder: str = "pad",
                 num_buckets: int | None = None, duration_bins: Sequence[float] | None = None,
                 quadratic_duration: float | None = None, min_duration: float | None = None,
                 max_sample_duration: float | None = None, sync_buckets: bool | None = None,
                 batch_cost: Callable[[np.ndarray], float] | None = None, batch_cost_name: str | None = None,
                 shuffle: bool = True, shuffle_shards: int = 16, seed: int = 0, world: World | None = None,
                 mono: bool = False, sample_rate: int | None = None, transform: Transform | None = None,
                 on_error: str = "raise", check_finite: bool = True, retry: RetryPolicy = RetryPolicy(),
                 storage_options: dict[str, Any] | None = None, dtype: str = "float32",
                 read_ahead: int = 64 << 20, cache_bytes: int = 0) -> None:
        super().__init__()
        if not isinstance(on_error, str) or on_error not in ("raise", "skip"):
            raise OptionError(f"on_error must be 'raise' or 'skip', not {shown(on_error)}")
        seed = integer("seed", seed, 0)
        if world is not None and not isinstance(world, World):
            raise OptionError(f"world must be a shardio.World(rank, world_size), not {shown(world)}")
        if not isinstance(retry, RetryPolicy):
            raise OptionError(f"retry must be a shardio.RetryPolicy, not {shown(retry)}")
        read_ahead = integer("read_ahead", read_ahead, 0)
        cache_bytes = integer("cache_bytes", cache_bytes, 0)
        decoding = Decoding(mono, sample_rate, check_finite, transform, dtype)  # checked here, not at a batch
        self.index = source_index(source, storage_options)
        check_rates(self.index, decoding.sample_rate)
        self.batching = Batching(batch_size=batch_size, max_duration=max_duration, max_batch_size=max_batch_size,
                                 remainder=remainder, num_buckets=num_buckets,
                                 duration_bins=duration_bins,  # type: ignore[arg-type]  # made a tuple by Batching
                                 quadratic_duration=quadratic_duration, min_duration=min_duration,
                                 max_sample_duration=max_sample_duration, sync_buckets=sync_buckets,
                                 batch_cost=batch_cost, batch_cost_name=batch_cost_name)
        self.ordering = Ordering(shuffle=shuffle, shuffle_shards=shuffle_shards)
        check_some_eligible(self.index, self.batching)
        self.batched = batch_size is not None or max_duration is not None
        self.seed = seed
        self.mono, self.sample_rate, self.check_finite = decoding.mono, decoding.sample_rate, decoding.check_finite
        self.transform = transform
        self.dtype = decoding.dtype
        self.on_error = on_error
        self.retry = retry
        self.read_ahead = read_ahead
        self.cache_bytes = cache_bytes
        self._explicit_world = world
        self._world: World | None = world  # carried to spawned workers by __getstate__
        self._world_of = 0  # the process that carried it
        self._plans: dict[tuple[Any, ...], EpochPlan] = {}
        self._extra: dict[str, Any] = {}  # a loaded state's surgery (quarantine, re-mix), carried into states
        self._shares: dict[tuple[Any, ...], RankPlan] = {}  # this rank's part of the current plan
        self._reader: Reader | None = None
        self._progress = Progress()

    # -- progress ----------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its first batch (a state just loaded for this epoch is kept).

        It reaches every DataLoader worker, persistent ones too, at their next iteration.
        """
        if type(epoch) is not int or epoch < 0:
            raise OptionError(f"epoch must be a non-negative integer, not {epoch!r}")
        if get_worker_info() is not None:
            self._progress.give_own(Instruction(epoch))
            return
        control = self._progress.control
        current = control.instruction()
        if not (current.loaded and current.epoch == epoch and not control.started()):
            control.give(Instruction(epoch, extra=extra_mark(self._extra)))
        given = control.instruction()
        self._share(given.epoch, given.history)  # here, before workers: they inherit, receive or map it

    def _instructions(self) -> int:
        """How many instructions (``set_epoch``, ``load_state_dict``) this dataset has been given."""
        return self._progress.instructions

    @property
    def epoch(self) -> int:
        """The epoch this process is playing, else the one its next iteration plays."""
        return self._progress.live().epoch

    def _state(self, at: Instruction, **fields: Any) -> LoaderState:
        return LoaderState(epoch=at.epoch, seed=self.seed, index=self.index.fingerprint, options=self.options,
                           world_size=self.ranks().world_size, history=at.history, start=at.start,
                           extra=self._extra, **fields)

    def state_dict(self) -> dict[str, Any]:
        """Where this process stands: exact in the process that iterates (see the module docs)."""
        at, yielded = self._progress.current()
        info = get_worker_info()
        if info is None and self._progress.control.workers_playing():
            logger.warning("ds.state_dict() in the training process cannot see how far its DataLoader workers have "
                           "got in epoch %d: the state starts it again; save ds.state_after(batch) of the last batch "
                           "trained on, or use a StatefulDataLoader's state", at.epoch)
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self._state(at, yielded=yielded, worker=worker, num_workers=workers).to_dict()

    def state_after(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The job state to save once ``batch`` (yielded by this dataset) and every batch before it have been
        consumed: a DataLoader must hand them over in order (its default ``in_order=True``)."""
        epoch, index = batch_position(batch)
        given = self._progress.control.instruction()
        history = given.history if epoch == given.epoch else ()
        return self._state(Instruction(epoch, history, index + 1)).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: a shardio state, or a whole ``StatefulDataLoader`` state dict.

        It applies to the next iteration only (in every DataLoader worker, persistent ones too). With the
        same world size the job continues onto exactly the batches an uninterrupted run would have seen; with
        another world size (or worker count) every sample not yet consumed in the epoch is consumed exactly
        once in the rest of it.
        """
        world_size = self.ranks().world_size
        loaded, instruction, skip, ahead = resume_point(find_states(state), steps_after_snapshot(state), world_size)
        problems = loaded.differences(seed=self.seed, index=self.index.fingerprint, options=self.options)
        if problems:
            raise StateError("the saved loader state does not fit this dataset:\n  - " + "\n  - ".join(problems))
        extra = check_extra(loaded.extra, len(self.index))
        if loaded.world_size != world_size:
            logger.info("world size changed from %d to %d at batch %d of epoch %d: re-planning the rest",
                        loaded.world_size, world_size, loaded.position, loaded.epoch)
        self._extra, previous = extra, self._extra
        try:
            if ahead:  # batches its workers consumed ahead of its position: left out of the rest of the epoch
                plan = self._make_plan(loaded.epoch, loaded.history, loaded.world_size, self._planned_batching)
                self._extra = leave_out_consumed(extra, plan, ahead, position=loaded.position, epoch=loaded.epoch,
                                                 segment=len(loaded.history) + 1, keys=self.index.keys)
            self._check_position(instruction)
        except StateError:
            self._extra = previous
            raise
        self._share(instruction.epoch, instruction.history)
        if get_worker_info() is not None:
            self._progress.give_own(instruction, skip)
        else:
            self._progress.control.give(replace(instruction, extra=extra_mark(self._extra)))

    def _new_reader(self) -> Reader:
        cache = ShardCache(os.path.join(cache_dir(), "shards"), self.cache_bytes) if self.cache_bytes > 0 else None
        return Reader(self.index, retry=self.retry, cache=cache)

    # -- iteration ---------------------------------------------------------------------------------

    @property
    def stats(self) -> ReadStats:
        """This process's loading counters (samples, skipped by error type, retries); each DataLoader worker
        keeps its own, so in the training process they stay zero: there, count each batch's ``skipped``."""
        if self._reader is None:
            self._reader = self._new_reader()
        return self._reader.stats

    def __getstate__(self) -> dict[str, Any]:
        # A plan is O(N): a spawned or forkserver worker receives this rank's share of it by reference to the
        # node plan's files it was read from, else in shared memory (by handle, not by value), and the shard
        # table in shared memory too (O(shards)); the index's columns travel by reference to its mapped file.
        if get_worker_info() is None:
            at = self._progress.live()
            self._share(at.epoch, at.history)
            self._shares = {key: shared(plan) for key, plan in self._shares.items()}
            self.index.share_tables(shared_table)
        state = dict(self.__dict__)
        state.update(_reader=None, _plans={})
        if self._explicit_world is None and get_worker_info() is None:
            # pickled for a spawn/forkserver worker: the world is known here (torch.distributed, environment)
            # and may not be there (init_process_group(rank=..., world_size=...) without RANK/WORLD_SIZE)
            state["_world"], state["_world_of"] = self.ranks(), os.getpid()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # a share read from the node's plan travels as its name (workers.nodeplan): where its files are gone
        # it arrives as None, and this process obtains the plan again
        self._shares = {key: plan for key, plan in self._shares.items() if plan is not None}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        refuse_resharding(sys._getframe(1))  # the frame that asked for the first batch
        progress = self._progress
        at, skip = progress.upcoming(), progress.upcoming_skip()
        if progress.follows_control and progress.control.instruction().extra != extra_mark(self._extra):
            raise OptionError("a state with quarantines, a re-mix or samples its workers consumed ahead (its "
                              "'extra') was loaded after this persistent DataLoader worker started, and cannot reach "
                              "it: load the state before creating the DataLoader, or use persistent_workers=False")
        plan = self._share(at.epoch, at.history)  # before begin: a worker that has begun has its plan
        progress.begin(at, skip)
        world = replace(self.ranks(), worker=0, num_workers=1).with_worker()
        if self._reader is None:
            self._reader = self._new_reader()
        decoding = Decoding(self.mono, self.sample_rate, self.check_finite, self.transform, self.dtype)
        assembler = Assembler(self._reader, decoding, seed=self.seed, batched=self.batched, on_error=self.on_error,
                              fields=self._fields)
        numbers = worker_batches(plan.num_batches, at.start, world.worker, world.num_workers)[skip:]
        batches = self._reader.read_ahead((plan.batch(j) for j in numbers), self.read_ahead,
                                          share=1 / world.num_workers)
        for j, ids in zip(numbers, batches):
            batch = assembler.batch(ids, at.epoch, plan.repeat_flags(j))
            batch["epoch"], batch["batch_index"] = at.epoch, j
            progress.yielded += 1
            yield batch
        progress.finish()

    def _fields(self, sample_id: int) -> dict[str, Any]:
        """Fields a sample has before its metadata and the transform (a mix adds its ``corpus``)."""
        return {}
