"""ShardDataset: a stateful IterableDataset that executes the epoch plan and resumes exactly.

The training process holds its rank's share of an epoch's plan (``set_epoch``); each DataLoader worker takes
its batches of that share, reads and decodes only those samples, and yields collated batches. An epoch's plan
is computed once per node (:mod:`shardio.runtime.planfiles`): the first process that needs it (a rank's
training process when the world size is above 1 or its workers have begun, or a worker beginning an epoch the
training process did not plan) plans the whole epoch under a lock and writes every rank's share; every other
process of the node reads its rank's part. One rank without workers yet plans in memory. A worker inherits the
share (fork), receives it in shared memory (spawn, forkserver: :mod:`shardio.runtime.sharing`) or reads it. A
process plans by itself when the cache directory cannot hold the files or the lock, or its files are not to be
trusted (another user's, writable by others, not this plan's: :mod:`shardio.runtime.nodeplan`). Every rank
yields the same number of batches, so the state of rank 0 restores the whole job; plan files are derived data,
not state.

Progress: ``state_dict()`` is exact when iteration happens in this process (``num_workers=0``) or inside
workers (torchdata's ``StatefulDataLoader``). With a plain multi-worker ``DataLoader`` the main process never
sees iteration, so every batch carries ``epoch`` and ``batch_index`` and ``state_after(batch)`` gives the
state to save after that batch.

Instructions: ``set_epoch`` and ``load_state_dict`` in the training process go into a shared block
(:mod:`shardio.runtime.control`) that every worker, persistent ones too, reads when an iteration starts;
inside a worker (``StatefulDataLoader`` restoring its workers) ``load_state_dict`` is that worker's own. Each
process's position among them is its :class:`~shardio.runtime.progress.Progress`. The
world is decided in the training process and carried to spawn/forkserver workers when the dataset is pickled
for them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from ..checks.options import integer
from ..errors import OptionError, shown
from ..planning.plan import Batching, Ordering, worker_batches
from ..planning.planner import Planner
from ..planning.surgery import Surgery
from ..reading.assembly import Assembler
from ..reading.cache import ShardCache
from ..reading.decodedcache import DecodedCache
from ..reading.options import Decoding, Reading, Transform
from ..reading.reader import Reader, ReadStats
from ..runtime.control import Instruction
from ..runtime.progress import Progress
from ..runtime.sharing import shared_table
from ..runtime.yieldlog import recorder
from ..shards.index import Index
from ..storage.files import cache_dir
from ..world import Context, World, refuse_resharding
from .checks import check_rates, check_some_eligible, source_index
from .epochplans import EpochPlans
from .options import option_groups
from .resumable import Resumable

__all__ = ["ShardDataset", "Transform"]

logger = logging.getLogger(__name__)


UPCOMING_BATCHES = 4096
"""The batches of a process's that its decoded cache is told it reads next (eviction keeps them longest)."""


class ShardDataset(Resumable, IterableDataset):
    """Planned, rank-balanced, resumable batches of decoded audio from a shardio dataset.

    Options come in four groups, each a small frozen value documented field by field: `batching`
    (`Batching`: batch size or duration, buckets, filters; part of the plan, so a saved state records it),
    `ordering` (`Ordering`: shuffling; part of the plan too), `decoding` (`Decoding`: what the audio becomes)
    and `reading` (`Reading`: remote reads, caching, errors). The common fields have keyword shortcuts; a
    shortcut given together with its group is an `OptionError` naming both. The other fields' old keywords
    (`ShardDataset(root, mono=True)`) still work, with a `DeprecationWarning` naming the group field.

    Args:
        source: A dataset directory or URL (holding `index.json`), or a loaded `Index`.
        batching: How samples form batches (default `Batching()`: with no batch size or duration, single
            samples are yielded).
        ordering: How an epoch's samples are ordered (default `Ordering()`: shuffled).
        decoding: What each sample's audio becomes (default `Decoding()`: as stored, float32).
        reading: How samples are fetched and what a failed one does (default `Reading()`).
        seed: The seed of every epoch's shuffle and of `transform`'s generators (default 0). Part of the
            plan: a state saved under another seed does not load.
        world: The rank and world size (a `World`); by default from `torch.distributed`, else the
            `RANK`/`WORLD_SIZE` environment, else rank 0 of 1.
        batch_size: Shortcut for `batching.batch_size`.
        max_duration: Shortcut for `batching.max_duration`.
        num_buckets: Shortcut for `batching.num_buckets`.
        shuffle: Shortcut for `ordering.shuffle` (`None`: the group's default, `True`).
        sample_rate: Shortcut for `decoding.sample_rate`.
        on_error: Shortcut for `reading.on_error` (`None`: the group's default, `"raise"`).
        **deprecated: The other fields' old keywords (`max_batch_size`, `remainder`, `duration_bins`,
            `quadratic_duration`, `min_duration`, `max_sample_duration`, `sync_buckets`, `batch_cost`,
            `batch_cost_name`, `shuffle_shards`, `mono`, `transform`, `check_finite`, `dtype`, `retry`,
            `storage_options`, `read_ahead`, `cache_bytes`): each still works, with a `DeprecationWarning`.

    Raises:
        OptionError: An option of the wrong type or out of range, a shortcut given with its group, a
            `source` that is neither a location nor an `Index`, duration filters that leave no sample, or a
            `sample_rate` beyond what shardio resamples the dataset's lowest rate to.
        FormatError: An index that is not a shardio index.
        ReadError: An index that cannot be read.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Index,
        *,
        batching: Batching | None = None,
        ordering: Ordering | None = None,
        decoding: Decoding | None = None,
        reading: Reading | None = None,
        seed: int = 0,
        world: World | None = None,
        batch_size: int | None = None,
        max_duration: float | None = None,
        num_buckets: int | None = None,
        shuffle: bool | None = None,
        sample_rate: int | None = None,
        on_error: str | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__()
        groups = option_groups(
            type(self).__name__,
            dict(batching=batching, ordering=ordering, decoding=decoding, reading=reading),
            dict(
                batch_size=batch_size,
                max_duration=max_duration,
                num_buckets=num_buckets,
                shuffle=shuffle,
                sample_rate=sample_rate,
                on_error=on_error,
            ),
            deprecated,
        )
        seed = integer("seed", seed, 0)
        if world is not None and not isinstance(world, World):
            raise OptionError(f"world must be a shardio.World(rank, world_size), not {shown(world)}")
        self.index = source_index(source, groups.reading.storage_options)
        check_rates(self.index, groups.decoding.sample_rate)
        self._check_plannable(groups.batching)
        self.batching, self.ordering, self.decoding, self.reading = groups
        self.batched = groups.batching.batch_size is not None or groups.batching.max_duration is not None
        self.seed = seed
        self.planner = Planner(self.index, seed, self.batching, self.ordering)
        self._progress = Progress()
        self._epochs = EpochPlans(self.planner, world, self._progress)
        self._set_surgery(Surgery())  # a loaded state's quarantines and re-mix, carried into states
        self._reader: Reader | None = None
        self._decoded: DecodedCache | None = None  # this process's decoded cache, made when first read

    def _check_plannable(self, batching: Batching) -> None:
        check_some_eligible(self.index, batching)  # a mix checks each corpus instead

    mono = property(lambda self: self.decoding.mono, doc="`decoding.mono` (read-only).")
    sample_rate = property(lambda self: self.decoding.sample_rate, doc="`decoding.sample_rate` (read-only).")
    transform = property(lambda self: self.decoding.transform, doc="`decoding.transform` (read-only).")
    dtype = property(lambda self: self.decoding.dtype, doc="`decoding.dtype` (read-only).")
    check_finite = property(
        lambda self: self.decoding.check_finite, doc="`decoding.check_finite` (read-only)"
    )
    on_error = property(lambda self: self.reading.on_error, doc="`reading.on_error` (read-only).")
    retry = property(lambda self: self.reading.retry, doc="`reading.retry` (read-only).")
    read_ahead = property(lambda self: self.reading.read_ahead, doc="`reading.read_ahead` (read-only).")
    cache_bytes = property(lambda self: self.reading.cache_bytes, doc="`reading.cache_bytes` (read-only).")

    # -- progress ----------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start an epoch at its first batch (a state just loaded for this epoch is kept).

        It reaches every DataLoader worker, persistent ones too, at their next iteration. Where other
        processes need the plan, the epoch is planned here, once per node (O(samples) CPU and memory,
        briefly).

        Args:
            epoch: The epoch, from 0.

        Raises:
            OptionError: A negative or non-integer epoch.
        """
        if type(epoch) is not int or epoch < 0:
            raise OptionError(f"epoch must be a non-negative integer, not {epoch!r}")
        context = Context.detect()
        if context.in_worker:
            self._progress.give_own(Instruction(epoch))
            return
        control = self._progress.control
        current = control.instruction()
        if not (current.loaded and current.epoch == epoch and not control.started()):
            control.give(Instruction(epoch, extra=self._surgery_mark))
        given = control.instruction()
        # here, before workers: they inherit, receive or map it
        self._epochs.share(given, self._epochs.ranks(context), self._surgery, context)

    @property
    def instructions(self) -> int:
        """How many instructions (``set_epoch``, ``load_state_dict``) this dataset has been given."""
        return self._progress.instructions

    @property
    def epoch(self) -> int:
        """The epoch this process is playing, else the one its next iteration plays."""
        return self._progress.live(Context.detect()).epoch

    def _new_reader(self) -> Reader:
        size = self.reading.cache_bytes
        cache = ShardCache(os.path.join(cache_dir(), "shards"), size) if size > 0 else None
        return Reader(self.index, retry=self.reading.retry, cache=cache)

    def _decoded_cache(self) -> DecodedCache | None:
        directory = self.reading.decoded_cache
        if directory is None:
            return None
        if self._decoded is None:
            self._decoded = DecodedCache(
                directory, self.reading.decoded_cache_bytes, self.index, self.decoding
            )
        return self._decoded

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
        # node plan's files it is read from, else in shared memory (by handle, not by value), and the shard
        # table in shared memory too (O(shards)); the index's columns travel by reference to its mapped file.
        context = Context.detect()
        state = dict(self.__dict__, _reader=None, _decoded=None)
        if not context.in_worker:
            world = self._epochs.ranks(context)
            self._epochs.share(self._progress.live(context), world, self._surgery, context)
            self.index.share_tables(shared_table)
            # pickled for a spawn/forkserver worker: the world is known here (torch.distributed, environment)
            # and may not be there (init_process_group(rank=..., world_size=...) without RANK/WORLD_SIZE)
            state["_epochs"] = self._epochs.for_workers(world)
        else:
            state["_epochs"] = self._epochs.for_workers(None)
        return state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        context = Context.detect()
        refuse_resharding(context, self)
        progress = self._progress
        at, skip = progress.upcoming(context), progress.upcoming_skip()
        if progress.follows_control and progress.control.instruction().extra != self._surgery_mark:
            raise OptionError(
                "a state with quarantines, a re-mix or samples its workers consumed ahead (its "
                "'extra') was loaded after this persistent DataLoader worker started, and cannot reach "
                "it: load the state before creating the DataLoader, or use persistent_workers=False"
            )
        # before begin: a worker that has begun has its plan
        world = self._epochs.ranks(context)
        plan = self._epochs.share(at, world, self._surgery, context)
        progress.begin(at, skip, context)
        world = world.with_worker(context)
        if self._reader is None:
            self._reader = self._new_reader()
        assembler = Assembler(
            self._reader,
            self.decoding,
            seed=self.seed,
            batched=self.batched,
            on_error=self.reading.on_error,
            fields=self.planner.fields if self.planner.corpora else None,
            in_worker=context.in_worker,
            cache=self._decoded_cache(),
        )
        builder = assembler.lane or assembler  # a batch's first stop: the lane, where it serves
        numbers = worker_batches(plan.num_batches, at.start, world.worker, world.num_workers)[skip:]
        if assembler.cache is not None and numbers:  # the next batches (evicted last), not the epoch's all
            assembler.cache.upcoming(np.concatenate([plan.batch(j) for j in numbers[:UPCOMING_BATCHES]]))
        held = assembler.cache.holds if assembler.cache is not None and assembler.lane is not None else None
        batches = self._reader.read_ahead(
            (plan.batch(j) for j in numbers), self.reading.read_ahead, share=1 / world.num_workers, held=held
        )
        log = recorder()  # None unless SHARDIO_YIELD_LOG is set (and not in a ShardLoader's worker)
        if log is not None:
            src, worker = (
                log.source(self.index.fingerprint, self.seed),
                world.worker if context.in_worker else None,
            )
            it = f"w{progress.iteration(context)}" if context.in_worker else f"{os.getpid()}.{id(progress)}"
            it = f"{it}.{progress.begun}"
        for j, ids in zip(numbers, batches):
            batch = builder.batch(ids, at.epoch, plan.repeat_flags(j))
            batch["epoch"], batch["batch_index"] = at.epoch, j
            progress.yielded += 1
            if log is not None:
                log.batch(batch, src=src, rank=world.rank, world=world.world_size, worker=worker, it=it)
            yield batch
        progress.finish(context)
