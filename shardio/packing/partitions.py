"""Partitioned packing: plan on a driver, pack each partition anywhere, merge in partition order.

The engine-neutral unit of work of :func:`shardio.packing.engines.pack_partitioned`:

- :func:`plan_partitions` (driver, no audio read): read the corpus, check keys (unique over the whole
  corpus), optionally permute by ``seed``, and cut the inputs into contiguous partitions of about
  ``partition_bytes`` estimated output bytes (input file sizes). The plan is written to
  ``_parts/plan.json`` with the fingerprint of its inputs and options.
- :func:`pack_partition` (any process, any machine sharing ``out_dir``): validate and write partition ``p``'s
  shards ``{prefix}-{p:05d}-{n:06d}.tar[.zst]`` in a private attempt directory, move them to ``out_dir``,
  then publish its index part ``_parts/{p:05d}/`` with ``index.json`` last: that file is the commit marker.
  Every attempt of a partition writes the same bytes, so retries and duplicate attempts are harmless.
- :func:`~shardio.packing.merging.merge_partitions` (driver): join the index parts in partition order (never
  completion order), check keys are unique, write the columns file then ``index.json``, and remove ``_parts``.

The result depends only on the input and the options, not on which engine ran the partitions, in which
order, or how many attempts failed. A re-run with the same plan packs only partitions without a marker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import InputProblem, OptionError, shown, shown_path
from ..shards.index import INDEX_COLUMNS, INDEX_JSON
from ..shards.writer import ShardWriter
from .keys import assign_keys
from .listing import list_corpus
from .output import Output, output_root
from .partfiles import PARTS_DIR, PLAN_FILE, part_dir, read_plan_fingerprint
from .preparation import Task, prepare
from .source import AUDIO_EXTENSIONS, Source
from .structure import DEFAULT_VALIDATE

__all__ = [
    "PARTS_DIR",
    "DEFAULT_PARTITION_BYTES",
    "PackOptions",
    "PartitionJob",
    "PartitionPlan",
    "plan_partitions",
    "pack_partition",
    "partition_done",
    "part_dir",
]

logger = logging.getLogger(__name__)

DEFAULT_PARTITION_BYTES = 2 * 10**9
"""Estimated output bytes of one partition when ``partition_bytes`` is not given."""
_SEGMENT_BYTES_PER_SECOND = 32_000  # a segment's estimate: 16 kHz 16-bit mono


@dataclass(frozen=True)
class PackOptions:
    """The options that shape a partition's shards (the same for every partition of a plan)."""

    samples_per_shard: int | None = None
    shard_bytes: int | None = 256 * 10**6
    compression: str = "none"
    zstd_level: int = 3
    transcode: str | None = None
    on_error: str = "raise"
    validate: str = DEFAULT_VALIDATE
    prefix: str = "shard"


@dataclass
class PartitionPlan:
    """What every partition packs: small enough to ship to each task, and JSON-serialisable."""

    out_dir: str
    options: PackOptions
    partitions: list[list[Task]]
    problems: list[InputProblem] = field(default_factory=list)
    """Inputs rejected on the driver (key rule, duplicate keys, unknown formats)."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Files in a folder corpus that are not inputs (see
    :attr:`shardio.packing.pack.PackSummary.left_out`)."""
    fingerprint: str = ""
    storage_options: dict[str, Any] | None = None
    """fsspec options for a URL ``out_dir`` (never written to the plan file)."""

    @property
    def output(self) -> Output:
        """Where the dataset goes."""
        return Output(self.out_dir, self.storage_options)

    def job(self, number: int) -> PartitionJob:
        """What partition ``number``'s task needs (its inputs only: tasks never carry the whole plan)."""
        return PartitionJob(
            self.out_dir,
            self.options,
            number,
            self.partitions[number],
            self.storage_options,
            self.fingerprint,
        )

    def to_json(self) -> str:
        """The plan as canonical JSON (its fingerprint covers everything but the output directory)."""
        return json.dumps(_plan_body(self), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class PartitionJob:
    """One partition's unit of work: :func:`pack_partition` runs it anywhere that sees ``out_dir``."""

    out_dir: str
    options: PackOptions
    number: int
    tasks: list[Task]
    storage_options: dict[str, Any] | None = None
    fingerprint: str = ""
    """The plan's fingerprint, recorded in the partition's report so that the merge can tell a part packed by
    another plan (an earlier run's task that committed after its plan was removed)."""

    @property
    def output(self) -> Output:
        """Where the dataset goes."""
        return Output(self.out_dir, self.storage_options)


def _plan_body(plan: PartitionPlan) -> dict[str, Any]:
    return {
        "options": asdict(plan.options),
        "partitions": [
            [{"key": t.key, "source": asdict(t.source), "transcode": t.transcode} for t in part]
            for part in plan.partitions
        ],
        "problems": [asdict(p) for p in plan.problems],
    }


def _estimate(source: Source) -> int:
    if source.size is not None:
        return source.size
    if source.offset is not None and source.duration is not None:
        return int(source.duration * _SEGMENT_BYTES_PER_SECOND)
    try:
        return os.path.getsize(source.audio_path)
    except OSError:
        return 0  # reported when the partition reads it


def plan_partitions(
    input: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    kind: str | None = None,
    options: PackOptions | None = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    shuffle: bool = False,
    seed: int = 0,
    require_text: bool = False,
    rewrite_keys: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> PartitionPlan:
    """Read the corpus and cut it into partitions; writes ``_parts/plan.json`` (or checks an existing one).
    ``progress``: a tqdm counter of the files listed, on stderr."""
    options = options or PackOptions()
    if partition_bytes < 1:
        raise OptionError(f"partition_bytes must be at least 1, not {partition_bytes}")
    if options.on_error not in ("raise", "skip"):
        raise OptionError(f"on_error must be 'raise' or 'skip', not {options.on_error!r}")
    out = output_root(os.fspath(out_dir))
    output = Output(out, storage_options)
    if output.exists(INDEX_JSON):
        raise OptionError(
            f"{shown_path(out)} already holds a dataset ({INDEX_JSON}); choose another directory"
        )
    problems: list[InputProblem] = []
    left_out: Counter[str] = Counter()
    sources = list_corpus(input, kind, problems=problems, left_out=left_out, progress=progress)
    if shuffle:
        sources = [sources[i] for i in np.random.default_rng((seed, 0x9A27)).permutation(len(sources))]
    tasks = assign_keys(
        sources,
        problems,
        transcode=options.transcode,
        validate=options.validate,
        rewrite=rewrite_keys,
        require_text=require_text,
    )
    if not sources and not problems:
        problems.append(
            InputProblem(
                os.fspath(input),
                "",
                f"no audio inputs found (audio files are {', '.join('.' + e for e in AUDIO_EXTENSIONS)})",
            )
        )
    partitions: list[list[Task]] = []
    current: list[Task] = []
    size = 0
    for task in tasks:
        current.append(task)
        size += _estimate(task.source)
        if size >= partition_bytes:
            partitions.append(current)
            current, size = [], 0
    if current:
        partitions.append(current)
    plan = PartitionPlan(
        out, options, partitions, problems, dict(sorted(left_out.items())), storage_options=storage_options
    )
    text = plan.to_json()
    plan.fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    name = PLAN_FILE
    if output.exists(name):
        recorded = read_plan_fingerprint(output)
        if recorded != plan.fingerprint:
            raise OptionError(
                f"{shown_path(output.path(name))}: an earlier run planned other inputs or options (plan "
                f"{shown(recorded)}, now {plan.fingerprint}); remove "
                f"{shown_path(output.path(PARTS_DIR))} or use another directory"
            )
    else:
        stale = output.shard_files(options.prefix)
        if stale:
            raise OptionError(
                f"{shown_path(out)} holds partition shards ({', '.join(map(shown_path, stale[:3]))}) of an "
                "earlier run with no plan; remove them or use another directory"
            )
        output.write(
            name,
            json.dumps(
                {"fingerprint": plan.fingerprint, "partitions": len(partitions), "samples": len(tasks)}
            ).encode(),
        )
    logger.info("planned %d inputs in %d partitions (plan %s)", len(tasks), len(partitions), plan.fingerprint)
    return plan


def partition_done(plan: PartitionPlan | PartitionJob, number: int) -> bool:
    """Whether partition ``number`` has published its index part (its commit marker)."""
    return plan.output.exists(f"{part_dir(number)}/{INDEX_JSON}")


def pack_partition(job: PartitionJob) -> int:
    """Pack one partition (see :meth:`PartitionPlan.job`; skipped when already committed); returns its sample
    count (-1 when skipped). Idempotent: any number of attempts, concurrent or not, leave the same bytes.
    """
    number = job.number
    if partition_done(job, number):
        return -1
    options, output = job.options, job.output
    if output.remote:
        attempt = tempfile.mkdtemp(prefix=f"shardio-part-{number:05d}-")
    else:
        attempt = output.path(f"{PARTS_DIR}/.attempt-{number:05d}-{uuid.uuid4().hex}")
    writer = ShardWriter(
        attempt,
        prefix=f"{options.prefix}-{number:05d}",
        compression=options.compression,
        zstd_level=options.zstd_level,
        max_samples=options.samples_per_shard,
        max_bytes=options.shard_bytes,
    )
    try:
        problems: list[InputProblem] = []
        samples = input_bytes = 0
        for task in job.tasks:
            result = prepare(task)
            if isinstance(result, InputProblem):
                problems.append(result)
                continue
            if options.on_error == "raise" and problems:
                continue  # no shard will be merged; validate the rest to list every problem
            writer.write(
                result.key,
                result.members,
                audio_ext=result.audio_ext,
                num_frames=result.num_frames,
                sample_rate=result.sample_rate,
                channels=result.channels,
            )
            samples += 1
            input_bytes += result.input_bytes
        index = writer.close()
        for shard in index.shards:
            if output.holds_other(shard.name, shard.bytes, shard.sha256):
                raise OptionError(
                    f"{shown_path(output.path(shard.name))}: a file that is not partition {number}'s shard "
                    "(its size or SHA-256 differs) is in the way; nothing was replaced: remove it, or use "
                    "another directory"
                )
        for shard in index.shards:  # same name, same bytes from every attempt: replacing is harmless
            output.publish(os.path.join(attempt, shard.name), shard.name)
        part = part_dir(number)
        report = {
            "problems": [asdict(p) for p in problems],
            "input_bytes": input_bytes,
            "plan": job.fingerprint,
        }
        output.write(f"{part}/report.json", json.dumps(report, sort_keys=True).encode())
        output.publish(os.path.join(attempt, INDEX_COLUMNS), f"{part}/{INDEX_COLUMNS}")
        output.publish(os.path.join(attempt, INDEX_JSON), f"{part}/{INDEX_JSON}")  # the commit marker, last
    except BaseException:
        writer.abort()
        raise
    finally:
        shutil.rmtree(attempt, ignore_errors=True)
    return samples
