"""ShardDataset: a stateful IterableDataset that executes the epoch plan and resumes exactly.

Each process (the main one, or each DataLoader worker) computes the same plan from the index, takes the
batches of its rank and worker, reads and decodes only those samples, and yields collated batches. Every
rank yields the same number of batches, so the state of rank 0 restores the whole job.

Progress: ``state_dict()`` is exact when iteration happens in this process (``num_workers=0``) or inside
workers (torchdata's ``StatefulDataLoader``). With a plain multi-worker ``DataLoader`` the main process never
sees iteration, so every batch carries ``epoch`` and ``batch_index`` and ``state_after(batch)`` gives the
state to save after that batch.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from .assembly import Assembler, Decoding, Transform
from .cache import ShardCache
from .errors import OptionError, StateError
from .index import Index
from .plan import Batching, EpochPlan, Ordering, Segment, options_of, plan_epoch, worker_batches
from .quarantine import check_extra, exclusions
from .rankplan import RankPlan, rank_plan
from .reader import Reader, ReadStats, RetryPolicy
from .state import LoaderState, combine, find_states
from .storage import cache_dir
from .world import World

__all__ = ["ShardDataset", "Transform"]

logger = logging.getLogger(__name__)

class ShardDataset(IterableDataset):
    """Planned, rank-balanced, resumable batches of decoded audio from a shardio dataset.

    ``source`` is a dataset directory or URL (holding ``index.json``) or a loaded :class:`Index`. Batch
    by ``batch_size`` or ``max_duration`` (padded seconds); with neither, single samples are yielded.
    ``num_buckets`` or ``duration_bins`` form batches within duration buckets (less padding; the batch
    order is shuffled per epoch); ``quadratic_duration``, ``min_duration`` and ``max_sample_duration``
    are the cost and filters of :class:`~shardio.plan.Batching`; ``sync_buckets`` (on when bucketing) gives
    all ranks batches of one bucket and of nearly equal cost (``batch_cost``/``batch_cost_name``) at every step.
    ``world`` gives the rank and world size explicitly; by default they come from ``torch.distributed``
    or the ``RANK``/``WORLD_SIZE`` environment. ``on_error="skip"`` logs and leaves out samples that cannot
    be read or decoded (listed in the batch's ``skipped``, counted in :attr:`stats`) while still yielding every
    planned batch. ``storage_options`` (endpoint, credentials) are for a remote ``source`` (see
    :meth:`Index.load`); ``retry`` bounds the retries of remote reads; ``read_ahead`` is the bytes of
    remote reads each process fetches ahead of the batch it builds (coalesced and concurrent, see
    :mod:`shardio.prefetch`; 0 reads each sample when it is needed). ``cache_bytes`` > 0 reads remote shards
    whole through a node-local disk cache of that size under :func:`~shardio.storage.cache_dir`, shared by
    every process on the node (:mod:`shardio.cache`). ``dtype="int16"`` yields audio as int16 (16-bit PCM
    as stored; half the bytes; see :mod:`shardio.pcm16`).
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
        if on_error not in ("raise", "skip"):
            raise OptionError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if not isinstance(seed, int) or seed < 0:
            raise OptionError(f"seed must be a non-negative integer, not {seed!r}")
        self.index = source if isinstance(source, Index) else Index.load(source, storage_options)
        self.batching = Batching(batch_size=batch_size, max_duration=max_duration, max_batch_size=max_batch_size,
                                 remainder=remainder, num_buckets=num_buckets,
                                 duration_bins=tuple(duration_bins) if duration_bins is not None else None,
                                 quadratic_duration=quadratic_duration, min_duration=min_duration,
                                 max_sample_duration=max_sample_duration, sync_buckets=sync_buckets,
                                 batch_cost=batch_cost, batch_cost_name=batch_cost_name)
        self.ordering = Ordering(shuffle=shuffle, shuffle_shards=shuffle_shards)
        self.batched = batch_size is not None or max_duration is not None
        self.seed = seed
        self.mono, self.sample_rate, self.check_finite = mono, sample_rate, check_finite
        self.transform = transform
        self.dtype = Decoding(dtype=dtype).dtype  # checked here, not at the first batch
        self.on_error = on_error
        self.retry = retry
        self.read_ahead = read_ahead
        self.cache_bytes = cache_bytes
        self._explicit_world = world
        self._world: World | None = world
        self._plans: dict[tuple[Any, ...], EpochPlan] = {}
        self._extra: dict[str, Any] = {}  # a loaded state's surgery (quarantine, re-mix), carried into states
        self._shares: dict[tuple[Any, ...], RankPlan] = {}  # this rank's part of the current plan
        self._reader: Reader | None = None
        self._reset(epoch=0)

    # -- progress ----------------------------------------------------------------------------------

    def _reset(self, epoch: int, history: tuple[Segment, ...] = (), start: int = 0) -> None:
        self._epoch, self._history, self._start = epoch, history, start
        self._skip = 0  # this worker's batches already yielded, from a worker-level (StatefulDataLoader) state
        self._yielded = 0
        self._running: World | None = None
        self._finished = False
        self._loaded = False

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its first batch (a state just loaded for this epoch is kept), and plan it
        for this rank."""
        if epoch < 0:
            raise OptionError(f"epoch must be non-negative, not {epoch}")
        if not (self._loaded and epoch == self._epoch):
            self._reset(epoch)
        if get_worker_info() is None:
            self._share()  # planned here, once per rank: fork workers inherit it, others receive it pickled

    @property
    def epoch(self) -> int:
        """The epoch the next iteration plays (or the one being played)."""
        return self._epoch

    def ranks(self) -> World:
        """Rank and world size: the explicit ``world``, else detected (and remembered in the main process)."""
        if self._explicit_world is not None:
            return replace(self._explicit_world, worker=0, num_workers=1)
        if get_worker_info() is None or self._world is None:
            self._world = World.detect()
        return self._world

    @property
    def options(self) -> dict[str, object]:
        """The options that shape the plan (a state records them)."""
        return options_of(self.batching, self.ordering)

    def _state(self, **fields: Any) -> LoaderState:
        return LoaderState(epoch=self._epoch, seed=self.seed, index=self.index.fingerprint, options=self.options,
                           world_size=self.ranks().world_size, history=self._history, start=self._start,
                           extra=self._extra, **fields)

    def state_dict(self) -> dict[str, Any]:
        """Where this process stands: exact in the process that iterates (see the module docs)."""
        running = self._running or World()
        return self._state(yielded=self._yielded, worker=running.worker,
                           num_workers=running.num_workers).to_dict()

    def state_after(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The job state to save once ``batch`` (yielded by this dataset) has been consumed."""
        try:
            epoch, index = int(batch["epoch"]), int(batch["batch_index"])
        except (KeyError, TypeError) as exc:
            raise OptionError(f"state_after needs a batch yielded by ShardDataset (missing {exc})") from None
        history = self._history if epoch == self._epoch else ()
        return replace(self._state(), epoch=epoch, history=history, start=index + 1).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: a shardio state, or a whole ``StatefulDataLoader`` state dict.

        It applies to the next iteration only. With the same world size the job continues onto exactly the
        batches an uninterrupted run would have seen; with another world size (or worker count) every sample
        not yet consumed in the epoch is consumed exactly once in the rest of it.
        """
        states = find_states(state)
        world = self.ranks()
        info = get_worker_info()
        worker_level = (len(states) == 1 and states[0].num_workers > 1 and info is not None
                        and (states[0].worker, states[0].num_workers) == (info.id, info.num_workers))
        loaded = states[0] if worker_level else combine(states)
        problems = loaded.differences(seed=self.seed, index=self.index.fingerprint, options=self.options)
        if problems:
            raise StateError("the saved loader state does not fit this dataset:\n  - " + "\n  - ".join(problems))
        self._extra = check_extra(loaded.extra, len(self.index))
        if worker_level:
            if loaded.world_size != world.world_size:
                raise StateError(f"a worker's state from a world of {loaded.world_size} cannot resume a world of "
                                 f"{world.world_size}: load the loader's whole state into a fresh dataset instead")
            self._reset(loaded.epoch, loaded.history, loaded.start)
            self._skip = loaded.yielded
        elif loaded.world_size == world.world_size:
            self._reset(loaded.epoch, loaded.history, loaded.position)
        else:
            self._reset(loaded.epoch, (*loaded.history, Segment(loaded.world_size, loaded.position)))
            logger.info("world size changed from %d to %d at batch %d of epoch %d: re-planning the rest",
                        loaded.world_size, world.world_size, loaded.position, loaded.epoch)
        self._loaded = True
        share = self._share()
        if self._start > share.num_batches:
            raise StateError(f"the state is at batch {self._start} of epoch {self._epoch}, which has only "
                             f"{share.num_batches} batches per rank")

    # -- planning ----------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the current one) for this world, after this epoch's segments."""
        epoch = self._epoch if epoch is None else epoch
        history = self._history if epoch == self._epoch else ()
        world_size = self.ranks().world_size
        key = (epoch, history, world_size, json.dumps(self._extra, sort_keys=True))
        if key not in self._plans:
            batching = self.batching if self.batched else replace(self.batching, batch_size=1)
            self._plans = {key: self._make_plan(epoch, history, world_size, batching)}
            report = self._plans[key].report
            if any(report.get(name) for name in ("dropped", "padded", "excluded", "skipped", "repeated")):
                logger.info("epoch %d plan: %s", epoch, report)
            if report.get("excluded"):  # never yielded, this epoch or any: say so at the default level
                left_out = self.index.durations[~batching.eligible(self.index.durations)]
                logger.warning("epoch %d: %d samples (%.3f h) are left out of the plan: longer than max_duration "
                               "alone, or outside min_duration/max_sample_duration", epoch, len(left_out),
                               float(left_out.sum()) / 3600)
        return self._plans[key]

    def _make_plan(self, epoch: int, history: tuple[Segment, ...], world_size: int, batching: Batching) -> EpochPlan:
        """Plan an epoch (the one step a dataset over other index layouts, such as a mix, replaces)."""
        return plan_epoch(self.index.shard_ids, self.index.durations, len(self.index.shards), seed=self.seed,
                          epoch=epoch, world_size=world_size, batching=batching, ordering=self.ordering,
                          history=history, exclude=exclusions(self._extra, epoch))

    def __len__(self) -> int:
        """Batches (or samples, when unbatched) this rank yields in the current epoch."""
        return self._share().num_batches

    def _new_reader(self) -> Reader:
        cache = ShardCache(os.path.join(cache_dir(), "shards"), self.cache_bytes) if self.cache_bytes > 0 else None
        return Reader(self.index, retry=self.retry, cache=cache)

    def _share(self) -> RankPlan:
        """This rank's part of the current epoch's plan (O(N / world)); the whole plan is not kept."""
        history, world = self._history, self.ranks()
        key = (self._epoch, history, world.world_size, world.rank, json.dumps(self._extra, sort_keys=True))
        if key not in self._shares:
            self._shares = {key: rank_plan(self.plan(), world.rank)}
            self._plans = {}
        return self._shares[key]

    # -- iteration ---------------------------------------------------------------------------------

    @property
    def stats(self) -> ReadStats:
        """This process's loading counters (samples, skipped by error type, retries); each DataLoader worker
        keeps its own, so in the training process they stay zero: there, count each batch's ``skipped``."""
        if self._reader is None:
            self._reader = self._new_reader()
        return self._reader.stats

    def __getstate__(self) -> dict[str, Any]:
        # A plan is O(N): a spawned or forkserver worker plans again rather than receive one; the index
        # travels by reference to its mapped file (Index.__getstate__).
        if get_worker_info() is None and not self._finished:
            self._share()  # planned once here, in the rank's process, rather than in every worker
        state = dict(self.__dict__)
        state.update(_reader=None, _plans={})
        return state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._finished:  # a persistent worker (or a re-iterated dataset) moves on to the next epoch
            self._reset(self._epoch + 1)
        self._loaded = False
        world = replace(self.ranks(), worker=0, num_workers=1).with_worker()
        plan = self._share()
        epoch, skip = self._epoch, self._skip
        self._running, self._yielded = world, skip
        if self._reader is None:
            self._reader = self._new_reader()
        decoding = Decoding(self.mono, self.sample_rate, self.check_finite, self.transform, self.dtype)
        assembler = Assembler(self._reader, decoding, seed=self.seed, batched=self.batched, on_error=self.on_error,
                              fields=self._fields)
        numbers = worker_batches(plan.num_batches, self._start, world.worker, world.num_workers)[skip:]
        batches = self._reader.read_ahead((plan.batch(j) for j in numbers), self.read_ahead)
        for k, ids in enumerate(batches):
            j = numbers[k]
            batch = assembler.batch(ids, epoch, plan.repeat_flags(j))
            batch["epoch"], batch["batch_index"] = epoch, j
            self._yielded += 1
            yield batch
        self._finished = True

    def _fields(self, sample_id: int) -> dict[str, Any]:
        """Fields a sample has before its metadata and the transform (a mix adds its ``corpus``)."""
        return {}
