"""The throughput matrix of ``shardio bench``: which cases a round times, and the ratios the targets read.

:func:`throughput_cases` lists, for one corpus, shardio end to end (0, 1 and 2 DataLoader workers; ``.tar``,
``.tar.zst``, unbatched, ``dtype="int16"``; its own :class:`~shardio.ShardLoader`), WebDataset + soundfile on
the same shards, and the floors (soundfile, memory file, numpy, pure Python, zstd, two parallel readers), each
next to the cases a target compares it with, so that a noisy machine slows both sides of a ratio alike.
:func:`throughput_ratios` turns the timed rounds into the per-round ratios of the pairs in :data:`PAIRS` (and
the ``.tar.zst`` path against its floor) that :func:`shardio.bench.targets.evaluate_targets` checks.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from . import cases, floors
from .data import Corpus, audio_members, shard_files, zstd_frames
from .measure import Case, stats
from .parallel import parallel_floor

__all__ = ["PAIRS", "throughput_cases", "throughput_ratios"]


def throughput_cases(
    plain: Corpus, zstd: Corpus, worker_counts: tuple[int, ...], batch_size: int
) -> list[Case]:
    """The cases of ``plain`` (and its ``zstd`` copy) in the order a round runs them, each next to the cases a
    target compares it with; ``worker_counts``: the DataLoader worker counts to time."""
    shards = shard_files(plain)
    members = audio_members(plain)
    frames = zstd_frames(zstd)
    ext = members[0][0]
    member_mb = sum(len(data) for _, data in members) / 1e6

    def shardio(
        corpus: Corpus,
        codec: str,
        workers: int,
        unbatched: bool = False,
        dtype: str = "float32",
        lean: bool = False,
        decoded_cache: str | None = None,
    ) -> Case:
        suffix = ".tar" if codec == "none" else f".tar.zst ({codec})"
        suffix += " unbatched (DataLoader batches)" if unbatched else ""
        suffix += " ShardLoader" if lean else ""
        suffix += f" {dtype}" if dtype != "float32" else ""
        suffix += " through the decoded cache (warm)" if decoded_cache else ""
        return Case(
            plain.name,
            f"shardio {suffix}, {workers}w",
            "shardio",
            codec,
            workers,
            corpus.shard_bytes / 1e6,
            partial(
                cases.shardio_epoch,
                corpus.directory,
                workers=workers,
                batch_size=batch_size,
                unbatched=unbatched,
                dtype=dtype,
                lean=lean,
                decoded_cache=decoded_cache,
            ),
        )

    def webdataset(workers: int, dtype: str = "float32") -> Case:
        suffix = f" {dtype}" if dtype != "float32" else ""
        return Case(
            plain.name,
            f"webdataset + soundfile .tar{suffix}, {workers}w",
            "webdataset",
            "none",
            workers,
            plain.shard_bytes / 1e6,
            partial(
                cases.webdataset_epoch, shards, ext=ext, workers=workers, batch_size=batch_size, dtype=dtype
            ),
        )

    first, *more = worker_counts
    zstd_first, *zstd_more = sorted({min(worker_counts), max(worker_counts)})
    return [
        webdataset(first),
        shardio(plain, "none", first),
        Case(
            plain.name,
            "soundfile floor (bytes in memory)",
            "soundfile floor",
            "-",
            0,
            member_mb,
            lambda: floors.soundfile_floor(members),
        ),
        Case(
            plain.name,
            _FILE_FLOOR,
            "soundfile floor",
            "-",
            0,
            member_mb,
            lambda: floors.memory_file_floor(members),
        ),
        Case(
            plain.name,
            "numpy raw floor (bytes in memory)",
            "numpy floor",
            "-",
            0,
            member_mb,
            lambda: floors.numpy_floor(members),
        ),
        Case(
            plain.name,
            "numpy raw floor into padded batches",
            "numpy floor",
            "-",
            0,
            member_mb,
            lambda: floors.numpy_batch_floor(members, batch_size),
        ),
        Case(
            plain.name,
            _PYTHON_FLOOR,
            "python floor",
            "none",
            0,
            plain.shard_bytes / 1e6,
            lambda: floors.python_floor(plain.directory, batch_size),
        ),
        Case(
            plain.name,
            "zstd-3 decompression floor (frames in memory)",
            "zstd floor",
            "zstd-3",
            0,
            zstd.shard_bytes / 1e6,
            lambda: floors.zstd_floor(frames),
        ),
        shardio(zstd, "zstd-3", zstd_first),
        shardio(
            plain,
            "none",
            first,
            decoded_cache=os.path.join(os.path.dirname(plain.directory), "decoded-cache"),
        ),
        *(
            case
            for workers in more
            for case in (
                shardio(plain, "none", workers),
                shardio(plain, "none", workers, lean=True),
                webdataset(workers),
            )
        ),
        *(
            [
                Case(
                    plain.name,
                    _PARALLEL,
                    "parallel floor",
                    "none",
                    0,
                    plain.shard_bytes / 1e6,
                    partial(parallel_floor, plain.directory, processes=2, batch_size=batch_size),
                )
            ]
            if 2 in more
            else []
        ),
        shardio(plain, "none", max(worker_counts), dtype="int16"),
        shardio(plain, "none", first, dtype="int16"),
        shardio(plain, "none", max(worker_counts), dtype="int16", lean=True),
        webdataset(max(worker_counts), dtype="int16"),
        shardio(plain, "none", first, unbatched=True),
        shardio(plain, "none", max(worker_counts), unbatched=True),
        *(shardio(zstd, "zstd-3", workers) for workers in zstd_more),
    ]


_PARALLEL = "shardio .tar, 2 processes x 0w (parallel floor)"
"""Two reader processes at once, no transport (:mod:`shardio.bench.parallel`): what 2
workers can reach here."""

_PYTHON_FLOOR = "pure-Python floor (mapped .tar: members, key, JSON, WAV header, cast into reused rows)"
""":func:`~shardio.bench.floors.python_floor`: the per-sample work shardio must do, in the least Python."""

_FILE_FLOOR = "soundfile floor (bytes in a memory file, as shardio reads FLAC)"

_LEAN = "shardio .tar ShardLoader, 2w"
"""shardio's own loader (:class:`~shardio.ShardLoader`) with 2 workers: the set-up the README recommends."""

_LEAN_INT16 = "shardio .tar ShardLoader int16, 2w"
"""The same with ``dtype="int16"``, compared with WebDataset reading int16 too (soundfile copies 16-bit PCM as
stored, as shardio does)."""

PAIRS = {  # ratio name: (case, reference case, basis)
    "shardio_vs_webdataset": ("shardio .tar, 0w", "webdataset + soundfile .tar, 0w", "cpu"),
    "shardio_vs_webdataset_2w": ("shardio .tar, 2w", "webdataset + soundfile .tar, 2w", "cpu"),
    "shard_loader_vs_webdataset_2w": (_LEAN, "webdataset + soundfile .tar, 2w", "cpu"),
    "shard_loader_vs_zero": (_LEAN, "shardio .tar, 0w", "wall"),
    "shard_loader_vs_zero_per_cpu_s": (_LEAN, "shardio .tar, 0w", "cpu"),
    "shard_loader_vs_parallel_floor_per_cpu_s": (_LEAN, _PARALLEL, "cpu"),
    "shard_loader_vs_dataloader_2w": (_LEAN, "shardio .tar, 2w", "cpu"),
    "shardio_vs_soundfile_floor": ("shardio .tar, 0w", "soundfile floor (bytes in memory)", "cpu"),
    "shardio_2w_vs_soundfile_floor": ("shardio .tar, 2w", "soundfile floor (bytes in memory)", "cpu"),
    "shard_loader_vs_soundfile_floor": (_LEAN, "soundfile floor (bytes in memory)", "cpu"),
    "shardio_vs_memory_file_floor": ("shardio .tar, 0w", _FILE_FLOOR, "cpu"),
    "shard_loader_vs_memory_file_floor": (_LEAN, _FILE_FLOOR, "cpu"),
    "shardio_vs_numpy_floor": ("shardio .tar, 0w", "numpy raw floor (bytes in memory)", "cpu"),
    "shardio_vs_numpy_batch_floor": ("shardio .tar, 0w", "numpy raw floor into padded batches", "cpu"),
    "shardio_vs_python_floor": ("shardio .tar, 0w", _PYTHON_FLOOR, "cpu"),
    "python_floor_vs_webdataset": (_PYTHON_FLOOR, "webdataset + soundfile .tar, 0w", "cpu"),
    "zstd_vs_tar": ("shardio .tar.zst (zstd-3), 0w", "shardio .tar, 0w", "cpu"),
    "two_workers_vs_zero": ("shardio .tar, 2w", "shardio .tar, 0w", "wall"),
    "two_workers_vs_zero_per_cpu_s": ("shardio .tar, 2w", "shardio .tar, 0w", "cpu"),
    "two_workers_vs_one": ("shardio .tar, 2w", "shardio .tar, 1w", "wall"),
    "parallel_floor_vs_zero": (_PARALLEL, "shardio .tar, 0w", "wall"),
    "parallel_floor_vs_zero_per_cpu_s": (_PARALLEL, "shardio .tar, 0w", "cpu"),
    "two_workers_vs_parallel_floor_per_cpu_s": ("shardio .tar, 2w", _PARALLEL, "cpu"),
    "unbatched_vs_batched": ("shardio .tar unbatched (DataLoader batches), 0w", "shardio .tar, 0w", "cpu"),
    "int16_vs_float32_2w": ("shardio .tar int16, 2w", "shardio .tar, 2w", "cpu"),
    "int16_vs_float32_0w": ("shardio .tar int16, 0w", "shardio .tar, 0w", "cpu"),
    "int16_shard_loader_vs_webdataset_2w": (_LEAN_INT16, "webdataset + soundfile .tar int16, 2w", "cpu"),
    "int16_shard_loader_vs_zero_per_cpu_s": (_LEAN_INT16, "shardio .tar int16, 0w", "cpu"),
    "webdataset_int16_vs_float32_2w": (
        "webdataset + soundfile .tar int16, 2w",
        "webdataset + soundfile .tar, 2w",
        "cpu",
    ),
}
_ZSTD_FLOOR = (
    "shardio .tar.zst (zstd-3), 0w",
    "zstd-3 decompression floor (frames in memory)",
    "shardio .tar, 0w",
)
"""zstd_vs_floor: the ``.tar.zst`` path against its floor, decompressing the same frames plus the ``.tar``
path (per CPU-s; the floor's time per sample is the sum of the two)."""


def throughput_ratios(rates: dict[str, Any], corpus: str) -> dict[str, dict[str, Any]]:
    """Per-round ratios between the cases of ``corpus`` that the targets compare (``rates``: what
    :func:`~shardio.bench.measure.measure_rounds` returns, per ``corpus|case`` label)."""
    found = {}
    for name, (top, bottom, basis) in PAIRS.items():
        a, b = rates.get(f"{corpus}|{top}"), rates.get(f"{corpus}|{bottom}")
        if a and b:
            found[name] = {**stats([x / y for x, y in zip(a[basis], b[basis])]), "basis": basis}
    zstd, floor, tar = (rates.get(f"{corpus}|{case}") for case in _ZSTD_FLOOR)
    if zstd and floor and tar:
        found["zstd_vs_floor"] = {
            **stats([z * (1 / f + 1 / t) for z, f, t in zip(zstd["cpu"], floor["cpu"], tar["cpu"])]),
            "basis": "cpu",
        }
    return found
