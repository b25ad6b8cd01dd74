"""pack: read a corpus, validate every input, and write the samples as shards plus an index.

Each source's bytes are read and decoded once (see :mod:`shardio.packing.preparation`; in a pool of threads
when ``workers > 1``, whose results come back in input order, so the shards and index are
byte-identical whatever the worker count). Audio keeps its
original bytes unless ``transcode`` asks for FLAC or WAV, or the source is a segment of a recording (cut and
encoded as FLAC, or WAV with ``transcode="wav"``). Metadata goes into a ``{key}.json`` member.

With ``on_error="raise"`` the first failing input stops the writing (this run's shards are removed), the
rest are still validated, and :class:`~shardio.errors.InputError` lists every failing input; no index is
written. With ``on_error="skip"`` the failing inputs are left out and listed in ``rejected.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from ..errors import InputError, InputProblem, OptionError, ShardioError, shown_path
from ..shards.journal import journal_path, matches, read_journal
from ..shards.writer import ShardWriter
from ..storage.files import is_url, write_atomic
from .keys import assign_keys, rewrite_key
from .listing import list_corpus
from .output import output_root
from .preparation import Prepared, Task, prepare
from .source import AUDIO_EXTENSIONS
from .structure import DEFAULT_VALIDATE, check_validate

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "REJECTED_FILE",
    "PackSummary",
    "assign_keys",
    "default_workers",
    "describe_left_out",
    "pack",
    "rewrite_key",
]

logger = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 256 * 10**6
"""Shard size (tar bytes) when neither ``samples_per_shard`` nor ``shard_bytes`` is given."""
REJECTED_FILE = "rejected.jsonl"
_AHEAD = 4  # results per worker thread prepared ahead of the writer


@dataclass
class PackSummary:
    """What a :func:`pack` run wrote."""

    shards: int
    samples: int
    hours: float
    bytes: int
    """Bytes of shards written."""
    seconds: float
    mb_per_s: float
    """Input audio megabytes (10^6) read per second of the whole run."""
    rejected: list[InputProblem] = field(default_factory=list)
    input_bytes: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    """What the input holds that is not packed, counted: files in a folder corpus that are not inputs, by
    extension (``.aiff``), and directory links not followed (see :data:`shardio.packing.folder.LOOP`); a Kaldi
    directory's ``text``/``utt2spk`` lines naming no utterance; a NeMo dataset's tar members and tars no
    manifest line names."""


def default_workers() -> int:
    """Pack's workers when none are asked for: one per CPU core this process may use (the thread that writes
    the shards hashes them with the GIL released, beside them: on 2 cores, 2 workers packed FLAC 1.44x as fast
    as 1, ``benchmarks/pack_webdataset.py``); 1 (no pool: inputs read by the writing thread) on one core."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def describe_left_out(left_out: dict[str, int]) -> str:
    """``left_out`` (see :attr:`PackSummary.left_out`) as one line: ``3 .aiff, 1 .m4a`` (an extension from a
    file name escaped where it is not printable)."""
    return ", ".join(f"{count} {shown_path(name)}" for name, count in sorted(left_out.items()))


def pack(
    input: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    kind: str | None = None,
    samples_per_shard: int | None = None,
    shard_bytes: int | None = None,
    compression: str = "none",
    zstd_level: int = 3,
    transcode: str | None = None,
    validate: str = DEFAULT_VALIDATE,
    shuffle: bool = False,
    seed: int = 0,
    workers: int | None = 1,
    on_error: str = "raise",
    require_text: bool = False,
    rewrite_keys: bool = False,
    prefix: str = "shard",
    progress: bool = True,
    overwrite: bool = False,
) -> PackSummary:
    """Pack the corpus at ``input`` into shards and an index under ``out_dir``; returns what was written.

    ``kind``: the corpus kind (see :func:`shardio.packing.corpus.read_corpus`), detected when None.
    ``samples_per_shard`` / ``shard_bytes`` (tar bytes): roll to a new shard (256 MB when neither is given).
    ``compression``: ``none`` (``.tar``) or ``zstd`` (``.tar.zst``, seekable frames) at ``zstd_level``.
    ``transcode``: ``flac`` or ``wav`` re-encodes every input (PCM stays exact); None keeps the bytes.
    ``validate``: ``structure`` (containers, sizes and checksums; frames from the headers where exact) or
    ``decode`` (those checks, then every input decoded); see :mod:`shardio.packing.structure`.
    ``shuffle``/``seed``: pack in a seeded random order. ``workers``: threads that read and validate (None:
    :func:`default_workers`); the calling thread writes and hashes the shards.
    ``on_error``: ``raise`` (:class:`~shardio.errors.InputError` listing every failing input, no index) or
    ``skip`` (leave them out, listed in ``rejected.jsonl``). ``require_text``: a transcript is required.
    ``rewrite_keys``: make keys that break the ``{key}.{ext}`` rule valid instead of rejecting them.
    ``prefix``: shard file names are ``{prefix}-000000.tar``... ``progress``: a tqdm bar on stderr.
    ``overwrite``: replace a dataset (or shard-named files) already in ``out_dir``.
    """
    if transcode not in (None, "flac", "wav"):
        raise OptionError(f"transcode must be None, 'flac' or 'wav', not {transcode!r}")
    if on_error not in ("raise", "skip"):
        raise OptionError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    check_validate(validate)
    if workers is None:
        workers = default_workers()
    if not isinstance(workers, int) or workers < 1:
        raise OptionError(f"workers must be a whole number >= 1, not {workers!r}")
    if not -7 <= zstd_level <= 22:
        raise OptionError(f"zstd_level must be between -7 and 22, not {zstd_level}")
    started = time.perf_counter()
    out = output_root(os.fspath(out_dir))
    if is_url(out):
        raise OptionError(
            f"{shown_path(out)} is a URL: pack writes a local directory. To write to a URL, pack in "
            "partitions, which upload each shard (shardio pack --engine local, or "
            "shardio.packing.engines.pack_partitioned), or pack into a local directory and copy it there"
        )
    if samples_per_shard is None and shard_bytes is None:
        shard_bytes = DEFAULT_SHARD_BYTES
    created = not os.path.lexists(out)
    writer = ShardWriter(
        out,
        prefix=prefix,
        compression=compression,
        zstd_level=zstd_level,
        max_samples=samples_per_shard,
        max_bytes=shard_bytes,
        overwrite=overwrite,
    )
    try:
        problems: list[InputProblem] = []
        left_out: Counter[str] = Counter()
        sources = list_corpus(input, kind, problems=problems, left_out=left_out, progress=progress)
        if left_out:
            logger.warning("%s: left out %s", shown_path(input), describe_left_out(left_out))
        if shuffle:
            sources = [sources[i] for i in np.random.default_rng(seed).permutation(len(sources))]
        tasks = assign_keys(
            sources,
            problems,
            transcode=transcode,
            validate=validate,
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
        writing = on_error == "skip" or not problems
        samples = input_bytes = 0
        with (
            tqdm(total=len(tasks), disable=not progress, file=sys.stderr, unit="file", desc="pack") as bar,
            contextlib.closing(_results(tasks, workers)) as results,
        ):  # closed (pool stopped) on any exit
            for result in results:
                bar.update()
                if isinstance(result, InputProblem):
                    problems.append(result)
                    logger.info("rejected %s", result)
                    if on_error == "raise" and writing:
                        writing = False
                        _discard(writer, out, prefix)
                elif writing:
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
        if (problems and on_error == "raise") or samples == 0:
            raise InputError(problems or [InputProblem(os.fspath(input), "", "no sample was packed")])
        if on_error == "skip":
            if problems:
                logger.warning(
                    "%d inputs rejected; see %s", len(problems), shown_path(os.path.join(out, REJECTED_FILE))
                )
            lines = [_json_line({"source": p.source, "key": p.key, "reason": p.reason}) for p in problems]
            write_atomic(os.path.join(out, REJECTED_FILE), "".join(lines).encode("utf-8"))
        index = writer.close()
    except BaseException:
        _discard(writer, out, prefix)
        if created:  # a failed run leaves no empty output directory behind (a mistyped input made it)
            with contextlib.suppress(OSError):
                os.rmdir(out)
        raise
    seconds = time.perf_counter() - started
    summary = PackSummary(
        shards=len(index.shards),
        samples=len(index),
        hours=index.total_duration / 3600,
        bytes=sum(s.bytes for s in index.shards),
        seconds=seconds,
        mb_per_s=input_bytes / 1e6 / max(seconds, 1e-9),
        rejected=problems,
        input_bytes=input_bytes,
        left_out=dict(sorted(left_out.items())),
    )
    logger.info(
        "packed %d samples (%.2f h) into %d shards under %s in %.1f s; %d rejected",
        summary.samples,
        summary.hours,
        summary.shards,
        shown_path(out),
        seconds,
        len(problems),
    )
    return summary


def _json_line(record: dict[str, str]) -> str:
    """``record`` as a line of JSON: UTF-8 as it is, but escaped (``\\udce9``) where a name held bytes
    that are not UTF-8 (which Python decodes to lone surrogates, and UTF-8 cannot encode)."""
    line = json.dumps(record, sort_keys=True, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, sort_keys=True)
    return line + "\n"


def _discard(writer: ShardWriter, out: str, prefix: str) -> None:
    """Abort the writer and remove the shards this run finished: those its journal names, with the bytes it
    wrote (never a file that was there before, or that another put there meanwhile). With no index written,
    no shard of this run may stay under a final name."""
    journal = journal_path(out, prefix)
    if os.path.lexists(journal):  # gone once an earlier discard removed every shard it names
        with contextlib.suppress(ShardioError):
            for entry in read_journal(journal, prefix).entries:
                if matches(os.path.join(out, entry.name), entry):
                    os.unlink(os.path.join(out, entry.name))
    writer.abort()


def _results(tasks: Sequence[Task], workers: int) -> Generator[Prepared | InputProblem, None, None]:
    """Each task's result, in task order (so the output does not depend on ``workers``).

    Workers are threads: reading, decoding and encoding run in libsndfile, numpy and file I/O, which release
    the GIL, so threads overlap them with no process start-up (a forkserver pool spent seconds importing
    before its first file) and no pickling of every file's bytes back to the writer. At most
    ``_AHEAD * workers`` results wait for the writer, which bounds memory.
    """
    if workers <= 1:
        yield from map(prepare, tasks)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="shardio-pack")
    pending: deque[Future[Prepared | InputProblem]] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(prepare, task))
            if len(pending) >= _AHEAD * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # on any exit (an error, Ctrl-C, the caller closing us): drop what has not started
        pool.shutdown(wait=True, cancel_futures=True)
