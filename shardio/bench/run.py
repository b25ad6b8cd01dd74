"""``shardio bench``: decode throughput against WebDataset and against the floors, on the same shards.

:func:`run_bench` measures, in one run and interleaved round by round (so that a noisy machine slows every
competitor alike): shardio end to end with 0, 1 and 2 DataLoader workers on ``.tar`` (and in unbatched mode,
samples collated by the DataLoader) and ``.tar.zst``; with 1 and 2 workers of its own
:class:`~shardio.ShardLoader` (the headline: the set-up the README recommends); ``dtype="int16"`` with 0 and 2
workers; WebDataset + soundfile on the same ``.tar`` shards through a DataLoader with the same workers (and
reading int16 with 2); the soundfile decoder floor, for PCM WAV the numpy raw floor
(bytes already in memory), and the zstd floor (the same frames decompressed from memory); shard compression
(none, zstd 1/3/19, gzip, bz2: size and read speed); resume latency at 0/50/90% of an epoch; per-rank balance
against WebDataset's ``split_by_node``; and the share of a training loop's time spent waiting for data.
Figures are medians of several rounds with min and max; ratios (the targets) are medians of per-round ratios
(the throughput cases and their pairs: :mod:`shardio.bench.throughput`). Results go to ``bench.json``,
``bench.md`` and ``bench.png`` (see :mod:`shardio.bench.report`).
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
from . import cases
from .data import Corpus, audio_members, dataset_corpus, make_variant, prepare_corpora, shard_files
from .measure import Case, machine_facts, measure_rounds, stats
from .report import write_report
from .targets import evaluate_targets
from .throughput import throughput_cases, throughput_ratios

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
QUICK = BenchConfig(
    wav_files=24,
    flac_repeats=1,
    flac_files=8,
    flac_limit=8,
    samples_per_shard=6,
    compression_samples=12,
    reps=2,
    min_round_seconds=0.0,
    resume_reps=1,
    stall_reps=1,
    stall_batches=2,
)


def _compression(
    source: Corpus, work: Path, config: BenchConfig, batch_size: int, progress: bool
) -> list[dict[str, Any]]:
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
            items.append(
                Case(
                    label,
                    "shardio, sequential, 0w",
                    "shardio",
                    label,
                    0,
                    corpus.shard_bytes / 1e6,
                    partial(
                        cases.shardio_epoch,
                        corpus.directory,
                        workers=0,
                        batch_size=batch_size,
                        shuffle=False,
                        fresh=True,
                    ),
                )
            )
        if not label.startswith("zstd"):
            items.append(
                Case(
                    label,
                    "webdataset + soundfile, 0w",
                    "webdataset",
                    label,
                    0,
                    corpus.shard_bytes / 1e6,
                    partial(
                        cases.webdataset_epoch, shard_files(corpus), ext=ext, workers=0, batch_size=batch_size
                    ),
                )
            )
    rows, _ = measure_rounds(items, max(1, config.reps // 2), progress, config.min_round_seconds)
    for row in rows:
        corpus = made[row["codec"]]
        row.update(
            corpus=f"{source.name}, first {corpus.samples} samples",
            shard_bytes=corpus.shard_bytes,
            size_vs_tar=round(corpus.shard_bytes / plain.shard_bytes, 4),
        )
    return rows


def _resume(corpus: Corpus, config: BenchConfig, batch_size: int) -> list[dict[str, Any]]:
    shards, ext = shard_files(corpus), audio_members(corpus, limit=1)[0][0]
    rows = []
    for fraction in (0.0, 0.5, 0.9):
        runs: dict[str, list[float]] = {
            "shardio, 0w": [],
            "shardio, 2w": [],
            "webdataset (skips by reading)": [],
        }
        for _ in range(config.resume_reps):
            runs["shardio, 0w"].append(
                cases.resume_latency(corpus.directory, fraction=fraction, batch_size=batch_size, workers=0)
            )
            runs["shardio, 2w"].append(
                cases.resume_latency(corpus.directory, fraction=fraction, batch_size=batch_size, workers=2)
            )
            runs["webdataset (skips by reading)"].append(
                cases.webdataset_skip_latency(
                    shards, ext=ext, fraction=fraction, samples=corpus.samples, batch_size=batch_size
                )
            )
        rows += [
            {"position": fraction, "loader": name, "seconds_to_first_batch": stats(values)}
            for name, values in runs.items()
        ]
    return rows


def _stall(corpus: Corpus, config: BenchConfig, batch_size: int, step_ms: float) -> list[dict[str, Any]]:
    shards, ext = shard_files(corpus), audio_members(corpus, limit=1)[0][0]
    rows = []
    for workers in (1, 2):
        makers = {
            "shardio": lambda w=workers: cases.shardio_loader(
                corpus.directory, workers=w, batch_size=batch_size, persistent=False
            ),
            "shardio ShardLoader": lambda w=workers: cases.shardio_loader(
                corpus.directory, workers=w, batch_size=batch_size, persistent=False, lean=True
            ),
            "webdataset + soundfile": lambda w=workers: cases.DataLoader(
                cases.webdataset_pipeline(shards, ext=ext, batch_size=batch_size),
                batch_size=None,
                num_workers=w,
            ),
        }
        for loader, make in makers.items():
            runs = [
                cases.stall(make(), step_seconds=step_ms / 1000, batches=config.stall_batches)
                for _ in range(config.stall_reps)
            ]
            rows.append(
                {
                    "loader": loader,
                    "workers": workers,
                    "step_ms": step_ms,
                    "batches": runs[0]["batches"],
                    "wait_share": stats([r["wait_share"] for r in runs]),
                    "wait_ms_per_batch": stats([r["wait_ms_per_batch"] for r in runs]),
                }
            )
    return rows


def _corpora(directory: str | os.PathLike[str] | None, out: Path, config: BenchConfig) -> list[Corpus]:
    if directory is None:
        return prepare_corpora(
            out,
            wav_files=config.wav_files,
            flac_repeats=config.flac_repeats,
            flac_files=config.flac_files,
            flac_limit=config.flac_limit,
            samples_per_shard=config.samples_per_shard,
        )
    user = dataset_corpus(directory, Path(directory).resolve().name, "user dataset")
    if user.codec == "none":
        return [user]
    plain = make_variant(user, "none", out / "datasets")
    if plain is None:
        raise OptionError(f"{directory}: cannot make a plain .tar copy of this dataset to compare against")
    return [plain]


def run_bench(
    directory: str | os.PathLike[str] | None = None,
    *,
    out_dir: str | os.PathLike[str],
    quick: bool = False,
    reps: int | None = None,
    batch_size: int = 16,
    step_ms: float = 10.0,
    progress: bool = True,
    command: str = "shardio bench",
) -> dict[str, Any]:
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
        logger.info(
            "bench: %s (%s), %d samples, %.0f s of audio",
            corpus.name,
            corpus.source,
            corpus.samples,
            corpus.audio_seconds,
        )
        zstd = make_variant(corpus, "zstd", out / "datasets", level=3)
        assert zstd is not None
        rows, rates = measure_rounds(
            throughput_cases(corpus, zstd, config.workers, batch_size),
            config.reps,
            progress,
            config.min_round_seconds,
        )
        throughput += rows
        ratios[corpus.name] = throughput_ratios(rates, corpus.name)
        zstd_sizes[corpus.name] = round(zstd.shard_bytes / max(corpus.shard_bytes, 1), 4)
    first = corpora[0]
    logger.info("bench: compression, resume, balance, stall")
    result: dict[str, Any] = {
        "command": command,
        "quick": quick,
        "reps": config.reps,
        "batch_size": batch_size,
        "machine": machine,
        "corpora": [
            {**c.as_dict(), "directory": Path(c.directory).name, "zstd3_size_vs_tar": zstd_sizes[c.name]}
            for c in corpora
        ],
        "throughput": throughput,
        "ratios": ratios,
        "compression": _compression(first, out / "compression", config, batch_size, progress),
        "resume": _resume(first, config, batch_size),
        "balance": cases.balance(
            *cases.uneven_shards(), world_sizes=config.world_sizes, batch_size=batch_size
        ),
        "stall": _stall(first, config, batch_size, step_ms),
    }
    result["targets"] = evaluate_targets(result)
    machine["load_average_end"] = list(os.getloadavg())
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["files"] = write_report(result, out)
    return result
