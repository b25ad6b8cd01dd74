"""``shardio bench``: decode throughput against WebDataset and against the floors, on the same shards.

:func:`run_bench` measures, in one run and interleaved round by round (so that a noisy machine slows every
competitor alike): shardio end to end with 0, 1 and 2 DataLoader workers on ``.tar`` (and in unbatched mode,
samples collated by the DataLoader) and ``.tar.zst``; with 1 and 2 workers of its own
:class:`~shardio.ShardLoader` (the headline: the set-up the README recommends); ``dtype="int16"`` with 0 and 2
workers; WebDataset + soundfile on the same ``.tar`` shards through a DataLoader with the same workers (and
reading int16 with 2); the soundfile decoder floor, for PCM WAV the numpy raw floor
(bytes already in memory), and the zstd floor (the same frames decompressed from memory); shard compression
(none, zstd 1/3/19, gzip, bz2: size and read speed); resume latency at 0/50/90% of an epoch; per-rank balance
against WebDataset's ``split_by_node``; and the share of a training loop's time spent waiting for data. Figures
are medians of several rounds with min and max; ratios (the targets) are medians of per-round ratios. Results
go to ``bench.json``, ``bench.md`` and ``bench.png`` (see :mod:`shardio.bench.report`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..errors import OptionError
from . import cases, floors
from .data import (Corpus, audio_members, dataset_corpus, make_variant, prepare_corpora, shard_files,
                   zstd_frames)
from .measure import Case, machine_facts, measure_rounds, stats
from .parallel import parallel_floor
from .report import evaluate_targets, write_report

__all__ = ["FULL", "QUICK", "BenchConfig", "run_bench"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and repetitions of one bench run."""

    wav_files: int = 800
    flac_repeats: int = 4
    flac_files: int = 128
    flac_limit: int | None = None
    """Use only the first this many shared FLACs."""
    samples_per_shard: int = 100
    compression_samples: int = 200
    reps: int = 5
    min_round_seconds: float = 0.5
    """A timed pass repeats its case until this long has passed: a pass of a fast case over a small corpus
    would otherwise last a tenth of a second, and its figure would be mostly scheduling noise."""
    resume_reps: int = 3
    stall_reps: int = 3
    stall_batches: int = 40
    workers: tuple[int, ...] = (0, 1, 2)
    world_sizes: tuple[int, ...] = (2, 4, 8)


FULL = BenchConfig()
QUICK = BenchConfig(wav_files=24, flac_repeats=1, flac_files=8, flac_limit=8, samples_per_shard=6,
                    compression_samples=12, reps=2, min_round_seconds=0.0, resume_reps=1, stall_reps=1,
                    stall_batches=2)


def _throughput_cases(plain: Corpus, zstd: Corpus, config: BenchConfig, batch_size: int) -> list[Case]:
    """The cases in the order a round runs them: each next to the cases a target compares it with."""
    shards = shard_files(plain)
    members = audio_members(plain)
    frames = zstd_frames(zstd)
    ext = members[0][0]
    member_mb = sum(len(data) for _, data in members) / 1e6

    def shardio(corpus: Corpus, codec: str, workers: int, unbatched: bool = False, dtype: str = "float32",
                lean: bool = False) -> Case:
        suffix = ".tar" if codec == "none" else f".tar.zst ({codec})"
        suffix += " unbatched (DataLoader batches)" if unbatched else ""
        suffix += " ShardLoader" if lean else ""
        suffix += f" {dtype}" if dtype != "float32" else ""
        return Case(plain.name, f"shardio {suffix}, {workers}w", "shardio", codec, workers,
                     corpus.shard_bytes / 1e6,
                     partial(cases.shardio_epoch, corpus.directory, workers=workers, batch_size=batch_size,
                             unbatched=unbatched, dtype=dtype, lean=lean))

    def webdataset(workers: int, dtype: str = "float32") -> Case:
        suffix = f" {dtype}" if dtype != "float32" else ""
        return Case(plain.name, f"webdataset + soundfile .tar{suffix}, {workers}w", "webdataset", "none", workers,
                    plain.shard_bytes / 1e6,
                    partial(cases.webdataset_epoch, shards, ext=ext, workers=workers, batch_size=batch_size,
                            dtype=dtype))

    first, *more = config.workers
    zstd_first, *zstd_more = sorted({min(config.workers), max(config.workers)})
    return [
        webdataset(first),
        shardio(plain, "none", first),
        Case(plain.name, "soundfile floor (bytes in memory)", "soundfile floor", "-", 0, member_mb,
              lambda: floors.soundfile_floor(members)),
        Case(plain.name, _FILE_FLOOR, "soundfile floor", "-", 0, member_mb, lambda: floors.memory_file_floor(members)),
        Case(plain.name, "numpy raw floor (bytes in memory)", "numpy floor", "-", 0, member_mb,
              lambda: floors.numpy_floor(members)),
        Case(plain.name, "numpy raw floor into padded batches", "numpy floor", "-", 0, member_mb,
              lambda: floors.numpy_batch_floor(members, batch_size)),
        Case(plain.name, _PYTHON_FLOOR, "python floor", "none", 0, plain.shard_bytes / 1e6,
             lambda: floors.python_floor(plain.directory, batch_size)),
        Case(plain.name, "zstd-3 decompression floor (frames in memory)", "zstd floor", "zstd-3", 0,
              zstd.shard_bytes / 1e6, lambda: floors.zstd_floor(frames)),
        shardio(zstd, "zstd-3", zstd_first),
        *(case for workers in more for case in (shardio(plain, "none", workers), shardio(plain, "none", workers, lean=True),
                                                webdataset(workers))),
        *([Case(plain.name, _PARALLEL, "parallel floor", "none", 0, plain.shard_bytes / 1e6,
                partial(parallel_floor, plain.directory, processes=2, batch_size=batch_size))]
          if 2 in more else []),
        shardio(plain, "none", max(config.workers), dtype="int16"),
        shardio(plain, "none", first, dtype="int16"),
        shardio(plain, "none", max(config.workers), dtype="int16", lean=True),
        webdataset(max(config.workers), dtype="int16"),
        shardio(plain, "none", first, unbatched=True),
        shardio(plain, "none", max(config.workers), unbatched=True),
        *(shardio(zstd, "zstd-3", workers) for workers in zstd_more),
    ]


_PARALLEL = "shardio .tar, 2 processes x 0w (parallel floor)"
"""Two reader processes at once, no transport (:mod:`shardio.bench.parallel`): what 2 workers can reach here."""

_PYTHON_FLOOR = "pure-Python floor (mapped .tar: members, key, JSON, WAV header, cast into reused rows)"
""":func:`~shardio.bench.floors.python_floor`: the per-sample work shardio must do, in the least Python."""

_FILE_FLOOR = "soundfile floor (bytes in a memory file, as shardio reads FLAC)"

_LEAN = "shardio .tar ShardLoader, 2w"
"""shardio's own loader (:class:`~shardio.ShardLoader`) with 2 workers: the set-up the README recommends."""

_LEAN_INT16 = "shardio .tar ShardLoader int16, 2w"
"""The same with ``dtype="int16"``, compared with WebDataset reading int16 too (soundfile copies 16-bit PCM as
stored, as shardio does)."""

_PAIRS = {  # ratio name: (case, reference case, basis)
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
    "webdataset_int16_vs_float32_2w": ("webdataset + soundfile .tar int16, 2w", "webdataset + soundfile .tar, 2w",
                                       "cpu"),
}
_ZSTD_FLOOR = ("shardio .tar.zst (zstd-3), 0w", "zstd-3 decompression floor (frames in memory)", "shardio .tar, 0w")
"""zstd_vs_floor: the ``.tar.zst`` path against its floor, decompressing the same frames plus the ``.tar`` path
(per CPU-s; the floor's time per sample is the sum of the two)."""


def _ratios(rates: dict[str, Any], corpus: str) -> dict[str, dict[str, Any]]:
    """Per-round ratios between the cases of ``corpus`` that the targets compare."""
    found = {}
    for name, (top, bottom, basis) in _PAIRS.items():
        a, b = rates.get(f"{corpus}|{top}"), rates.get(f"{corpus}|{bottom}")
        if a and b:
            found[name] = {**stats([x / y for x, y in zip(a[basis], b[basis])]), "basis": basis}
    zstd, floor, tar = (rates.get(f"{corpus}|{case}") for case in _ZSTD_FLOOR)
    if zstd and floor and tar:
        found["zstd_vs_floor"] = {**stats([z * (1 / f + 1 / t) for z, f, t in zip(zstd["cpu"], floor["cpu"],
                                                                                       tar["cpu"])]), "basis": "cpu"}
    return found


def _compression(source: Corpus, work: Path, config: BenchConfig, batch_size: int,
                 progress: bool) -> list[dict[str, Any]]:
    """Size and sequential read speed of the first samples of ``source`` under each shard codec."""
    count = config.compression_samples
    variants = [("none", 0), ("zstd", 1), ("zstd", 3), ("zstd", 19), ("gzip", 0), ("bz2", 0)]
    made: dict[str, Corpus] = {}
    for codec, level in tqdm(variants, desc="compressing", disable=not progress, leave=False):
        variant = make_variant(source, codec, work, level=level, samples=count)
        if variant is not None:
            made[f"zstd-{level}" if codec == "zstd" else codec] = variant
    plain = made["none"]
    ext = audio_members(plain, limit=1)[0][0]
    items = []
    for label, corpus in made.items():
        if corpus.audio_seconds:  # indexed: shardio reads it (in shard order: stream codecs cannot seek)
            items.append(Case(label, "shardio, sequential, 0w", "shardio", label, 0,
                               corpus.shard_bytes / 1e6, partial(cases.shardio_epoch, corpus.directory, workers=0,
                                                                 batch_size=batch_size, shuffle=False, fresh=True)))
        if not label.startswith("zstd"):
            items.append(Case(label, "webdataset + soundfile, 0w", "webdataset", label, 0,
                               corpus.shard_bytes / 1e6, partial(cases.webdataset_epoch, shard_files(corpus), ext=ext,
                                                                 workers=0, batch_size=batch_size)))
    rows, _ = measure_rounds(items, max(1, config.reps // 2), progress, config.min_round_seconds)
    for row in rows:
        corpus = made[row["codec"]]
        row.update(corpus=f"{source.name}, first {corpus.samples} samples", shard_bytes=corpus.shard_bytes,
                   size_vs_tar=round(corpus.shard_bytes / plain.shard_bytes, 4))
    return rows


def _resume(corpus: Corpus, config: BenchConfig, batch_size: int) -> list[dict[str, Any]]:
    shards, ext = shard_files(corpus), audio_members(corpus, limit=1)[0][0]
    rows = []
    for fraction in (0.0, 0.5, 0.9):
        runs: dict[str, list[float]] = {"shardio, 0w": [], "shardio, 2w": [], "webdataset (skips by reading)": []}
        for _ in range(config.resume_reps):
            runs["shardio, 0w"].append(cases.resume_latency(corpus.directory, fraction=fraction,
                                                            batch_size=batch_size, workers=0))
            runs["shardio, 2w"].append(cases.resume_latency(corpus.directory, fraction=fraction,
                                                            batch_size=batch_size, workers=2))
            runs["webdataset (skips by reading)"].append(cases.webdataset_skip_latency(
                shards, ext=ext, fraction=fraction, samples=corpus.samples, batch_size=batch_size))
        rows += [{"position": fraction, "loader": name, "seconds_to_first_batch": stats(values)}
                 for name, values in runs.items()]
    return rows


def _stall(corpus: Corpus, config: BenchConfig, batch_size: int, step_ms: float) -> list[dict[str, Any]]:
    shards, ext = shard_files(corpus), audio_members(corpus, limit=1)[0][0]
    rows = []
    for workers in (1, 2):
        makers = {"shardio": lambda w=workers: cases.shardio_loader(corpus.directory, workers=w,
                                                                    batch_size=batch_size, persistent=False),
                  "shardio ShardLoader": lambda w=workers: cases.shardio_loader(
                      corpus.directory, workers=w, batch_size=batch_size, persistent=False, lean=True),
                  "webdataset + soundfile": lambda w=workers: cases.DataLoader(
                      cases.webdataset_pipeline(shards, ext=ext, batch_size=batch_size), batch_size=None,
                      num_workers=w)}
        for loader, make in makers.items():
            runs = [cases.stall(make(), step_seconds=step_ms / 1000, batches=config.stall_batches)
                    for _ in range(config.stall_reps)]
            rows.append({"loader": loader, "workers": workers, "step_ms": step_ms,
                         "batches": runs[0]["batches"], "wait_share": stats([r["wait_share"] for r in runs]),
                         "wait_ms_per_batch": stats([r["wait_ms_per_batch"] for r in runs])})
    return rows


def _corpora(directory: str | os.PathLike[str] | None, out: Path, config: BenchConfig) -> list[Corpus]:
    if directory is None:
        return prepare_corpora(out, wav_files=config.wav_files, flac_repeats=config.flac_repeats,
                               flac_files=config.flac_files, flac_limit=config.flac_limit,
                               samples_per_shard=config.samples_per_shard)
    user = dataset_corpus(directory, Path(directory).resolve().name, "user dataset")
    if user.codec == "none":
        return [user]
    plain = make_variant(user, "none", out / "datasets")
    if plain is None:
        raise OptionError(f"{directory}: cannot make a plain .tar copy of this dataset to compare against")
    return [plain]


def run_bench(directory: str | os.PathLike[str] | None = None, *, out_dir: str | os.PathLike[str],
              quick: bool = False, reps: int | None = None, batch_size: int = 16, step_ms: float = 10.0,
              progress: bool = True, command: str = "shardio bench") -> dict[str, Any]:
    """Run the bench on the dataset at ``directory`` (or on corpora generated into ``out_dir``); return the
    results and write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``.

    ``quick`` uses tiny corpora and fewer rounds (a smoke test, not figures); ``reps`` overrides the number
    of timed rounds; ``step_ms`` is the training step of the stall figure.
    """
    config = QUICK if quick else FULL
    if reps is not None:
        if reps < 1:
            raise OptionError(f"reps must be at least 1, not {reps}")
        config = replace(config, reps=reps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = machine_facts()
    corpora = _corpora(directory, out, config)
    throughput: list[dict[str, Any]] = []
    ratios: dict[str, dict[str, Any]] = {}
    zstd_sizes: dict[str, float] = {}
    for corpus in corpora:
        logger.info("bench: %s (%s), %d samples, %.0f s of audio", corpus.name, corpus.source, corpus.samples,
                    corpus.audio_seconds)
        zstd = make_variant(corpus, "zstd", out / "datasets", level=3)
        assert zstd is not None
        rows, rates = measure_rounds(_throughput_cases(corpus, zstd, config, batch_size), config.reps, progress,
                              config.min_round_seconds)
        throughput += rows
        ratios[corpus.name] = _ratios(rates, corpus.name)
        zstd_sizes[corpus.name] = round(zstd.shard_bytes / max(corpus.shard_bytes, 1), 4)
    first = corpora[0]
    logger.info("bench: compression, resume, balance, stall")
    result: dict[str, Any] = {
        "command": command,
        "quick": quick,
        "reps": config.reps,
        "batch_size": batch_size,
        "machine": machine,
        "corpora": [{**c.as_dict(), "directory": Path(c.directory).name,
                     "zstd3_size_vs_tar": zstd_sizes[c.name]}
                    for c in corpora],
        "throughput": throughput,
        "ratios": ratios,
        "compression": _compression(first, out / "compression", config, batch_size, progress),
        "resume": _resume(first, config, batch_size),
        "balance": cases.balance(*cases.uneven_shards(), world_sizes=config.world_sizes, batch_size=batch_size),
        "stall": _stall(first, config, batch_size, step_ms),
    }
    result["targets"] = evaluate_targets(result)
    machine["load_average_end"] = list(os.getloadavg())
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["files"] = write_report(result, out)
    return result
