"""Engines that run the partitions of a
:class:`~shardio.packing.partitions.PartitionPlan`: local processes or Ray.

An engine is any callable ``engine(plan, numbers)`` that runs
:func:`~shardio.packing.partitions.pack_partition` on ``plan.job(number)`` for each partition number, in any
order, with any retries; :func:`pack_partitioned` then merges in partition order, so the dataset is
byte-identical whichever engine ran the work.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from ..errors import OptionError
from ..shards.index import INDEX_JSON
from .merging import merge_partitions
from .output import Output
from .pack import PackSummary, default_workers
from .partfiles import PARTS_DIR, part_dir, remove_parts
from .partitions import (
    DEFAULT_PARTITION_BYTES,
    PackOptions,
    PartitionPlan,
    pack_partition,
    partition_done,
    plan_partitions,
)
from .structure import DEFAULT_VALIDATE, check_validate

__all__ = ["ENGINES", "Engine", "local_engine", "ray_engine", "pack_partitioned"]

logger = logging.getLogger(__name__)

Engine = Callable[[PartitionPlan, Sequence[int]], None]
ENGINES = ("local", "ray")


def local_engine(workers: int = 1, *, progress: bool = False) -> Engine:
    """Run partitions in this process (``workers=1``) or in a pool of ``workers`` processes."""

    def run(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        with tqdm(
            total=len(numbers), disable=not progress, file=sys.stderr, unit="partition", desc="pack"
        ) as bar:
            if workers <= 1 or len(numbers) <= 1:
                for number in numbers:
                    pack_partition(plan.job(number))
                    bar.update()
                return
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(method)
            if method == "forkserver":  # the server imports shardio once; each worker forks from it
                context.set_forkserver_preload(["shardio.packing.partitions"])
            with context.Pool(min(workers, len(numbers))) as pool:
                for _ in pool.imap_unordered(pack_partition, (plan.job(n) for n in numbers)):
                    bar.update()

    return run


def ray_engine(
    address: str | None = None, *, retries: int = 3, num_cpus: int | None = None, progress: bool = False
) -> Engine:
    """Run partitions as Ray tasks (retried ``retries`` times when a worker dies), on the cluster at
    ``address`` (``"auto"``: the running one) or on a local one started here (``num_cpus`` workers).
    Every task needs ``out_dir`` on a file system it shares with the driver. Needs the ``ray`` extra."""

    def run(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        try:
            import ray
        except ImportError:
            raise OptionError("engine 'ray' needs the ray package: pip install 'shardio[ray]'") from None
        started_here = not ray.is_initialized()
        if started_here:
            ray.init(
                address=address,
                num_cpus=None if address else num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        try:
            remote = ray.remote(max_retries=retries, retry_exceptions=False)(pack_partition)
            pending = [remote.remote(plan.job(n)) for n in numbers]
            with tqdm(
                total=len(pending), disable=not progress, file=sys.stderr, unit="partition", desc="pack (ray)"
            ) as bar:
                while pending:
                    done, pending = ray.wait(pending, num_returns=1)
                    ray.get(done)  # raises the task's error after its retries
                    bar.update(len(done))
        finally:
            if started_here:
                ray.shutdown()

    return run


def pack_partitioned(
    input: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    engine: str | Engine = "local",
    workers: int | None = 1,
    address: str | None = None,
    kind: str | None = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    samples_per_shard: int | None = None,
    shard_bytes: int | None = None,
    compression: str = "none",
    zstd_level: int = 3,
    transcode: str | None = None,
    validate: str = DEFAULT_VALIDATE,
    shuffle: bool = False,
    seed: int = 0,
    on_error: str = "raise",
    require_text: bool = False,
    rewrite_keys: bool = False,
    prefix: str = "shard",
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> PackSummary:
    """Pack like :func:`shardio.packing.pack.pack`, in partitions of about ``partition_bytes`` input bytes,
    run by ``engine``: ``"local"`` (``workers`` processes), ``"ray"`` (tasks on the cluster at ``address``, or
    a local cluster of ``workers`` CPUs; None: :func:`~shardio.packing.pack.default_workers`), or any
    :data:`Engine`. Shards are named
    ``{prefix}-{partition:05d}-{n:06d}.tar[.zst]``. Re-running after an interruption packs only the
    partitions that did not commit. The dataset is byte-identical whatever the engine, order or retries.
    ``out_dir`` may be an fsspec URL (``s3://bucket/data``, with ``storage_options``): each task then writes
    its shards locally and uploads them, its index part last. ``validate``: as
    :func:`~shardio.packing.pack.pack`'s.
    """
    if transcode not in (None, "flac", "wav"):
        raise OptionError(f"transcode must be None, 'flac' or 'wav', not {transcode!r}")
    check_validate(validate)
    if workers is None:
        workers = default_workers()
    if not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers must be a whole number >= 1, not {workers!r}")
    if compression not in ("none", "zstd"):
        raise OptionError(f"compression must be 'none' or 'zstd', not {compression!r}")
    started = time.perf_counter()
    if samples_per_shard is None and shard_bytes is None:
        shard_bytes = 256 * 10**6
    options = PackOptions(
        samples_per_shard=samples_per_shard,
        shard_bytes=shard_bytes,
        compression=compression,
        zstd_level=zstd_level,
        transcode=transcode,
        on_error=on_error,
        validate=validate,
        prefix=prefix,
    )
    run: Engine
    if engine == "local":
        run = local_engine(workers, progress=progress)
    elif engine == "ray":
        run = ray_engine(address, num_cpus=workers, progress=progress)
    elif callable(engine):
        run = engine
    else:
        raise OptionError(f"engine must be one of {ENGINES} or a callable, not {engine!r}")
    output = Output(os.fspath(out_dir), storage_options)
    fresh = not output.exists(PARTS_DIR)  # only a _parts this run makes is removed on failure
    created = not output.remote and not os.path.lexists(output.root)
    try:
        plan = plan_partitions(
            input,
            out_dir,
            kind=kind,
            options=options,
            partition_bytes=partition_bytes,
            shuffle=shuffle,
            seed=seed,
            require_text=require_text,
            rewrite_keys=rewrite_keys,
            storage_options=storage_options,
            progress=progress,
        )
    except Exception:
        if fresh:
            _remove_uncommitted(output, 0, created)
        raise
    todo = [n for n in range(len(plan.partitions)) if not partition_done(plan, n)]
    if len(todo) < len(plan.partitions):
        logger.info(
            "%d of %d partitions already committed; packing the rest",
            len(plan.partitions) - len(todo),
            len(plan.partitions),
        )
    try:
        run(plan, todo)
        index, problems, input_bytes = merge_partitions(plan)
    except Exception:  # not on an interrupt: a cluster's tasks may still commit, and a re-run resumes them
        if fresh:
            _remove_uncommitted(output, len(plan.partitions), created)
        raise
    seconds = time.perf_counter() - started
    return PackSummary(
        shards=len(index.shards),
        samples=len(index),
        hours=index.total_duration / 3600,
        bytes=sum(s.bytes for s in index.shards),
        seconds=seconds,
        mb_per_s=input_bytes / 1e6 / max(seconds, 1e-9),
        rejected=problems,
        input_bytes=input_bytes,
        left_out=plan.left_out,
    )


def _remove_uncommitted(output: Output, partitions: int, created: bool) -> None:
    """After a failed run that made ``_parts``: remove it unless it holds a committed part a re-run can resume
    from (its plan alone would refuse a re-run with mended inputs or options), and the output directory too
    when the run made it and nothing else is left in it."""
    if any(output.exists(f"{part_dir(number)}/{INDEX_JSON}") for number in range(partitions)):
        return
    remove_parts(output, partitions)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(output.root)
