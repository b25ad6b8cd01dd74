"""Rank balance: batches and audio seconds per rank, WebDataset's shard splitting against shardio's plan.

Run ``python benchmarks/balance.py``. One dataset of 8 shards of very different sizes (real 8 kHz WAV
samples of 0.5-6 s, written by ``ShardWriter`` into a temporary directory) is read, for world sizes 2, 4
and 8, by every rank in turn, each through a real ``DataLoader`` with 2 workers:

- WebDataset 1.x: ``WebDataset(urls, nodesplitter=split_by_node, workersplitter=split_by_worker)``
  then ``.batched(8)``: shards are dealt to ranks (``RANK``/``WORLD_SIZE`` from the environment, as
  ``torchrun`` sets them), then to workers, and each worker batches its own stream;
- shardio: ``ShardDataset(dir, batch_size=8)`` and ``ShardDataset(dir, max_duration=...)`` with
  ``world=World(rank=r, world_size=R)``.

For each, per rank: batches, samples and audio seconds (min, max, spread = max - min), and over all ranks
the samples never seen and the repeats. Unequal batch counts are the DDP hang: the rank that runs out
first leaves the loop while the others wait in their next all-reduce. Writes
``benchmarks/results/balance.json`` and ``benchmarks/results/balance.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import torch
import webdataset as wds
from torch.utils.data import DataLoader

from shardio import Batching, Index, ShardDataset, World
from shardio.bench.report import write_results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "tests"))
from sample_shards import make_uneven_dataset  # the shared test helper that writes real shards

SHARD_SIZES = (2, 7, 150, 11, 64, 1, 38, 27)
"""Samples per shard: 300 in all, from 1 to 150 per shard."""
DURATION_RANGE = (0.5, 6.0)
BATCH_SIZE = 8
MAX_DURATION = 30.0
NUM_WORKERS = 2
WORLD_SIZES = (2, 4, 8)
SEED = 0


def keys_of(samples: list[dict[str, Any]]) -> list[str]:
    """WebDataset collation: a batch is the list of its samples' keys (no decoding needed to count)."""
    return [sample["__key__"] for sample in samples]


def webdataset_rank(urls: list[str], rank: int, *, world_size: int) -> list[list[str]]:
    """The batches (as key lists) that rank ``rank`` of ``world_size`` gets from a WebDataset pipeline."""
    with patch.dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size)):  # what split_by_node reads
        pipeline = wds.WebDataset(
            urls,
            shardshuffle=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        pipeline = pipeline.batched(BATCH_SIZE, collation_fn=keys_of, partial=True)
        return [list(batch) for batch in DataLoader(pipeline, batch_size=None, num_workers=NUM_WORKERS)]


def shardio_rank(directory: Path, rank: int, *, world_size: int, **options: Any) -> list[list[str]]:
    """The batches (as key lists) that rank ``rank`` of ``world_size`` gets from ``ShardDataset``."""
    dataset = ShardDataset(directory, seed=SEED, world=World(rank=rank, world_size=world_size), **options)
    return [list(batch["keys"]) for batch in DataLoader(dataset, batch_size=None, num_workers=NUM_WORKERS)]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Min, max and max - min."""
    low, high = float(min(values)), float(max(values))
    mean = float(np.mean(values))
    return {
        "min": round(low, 3),
        "max": round(high, 3),
        "spread": round(high - low, 3),
        "relative_spread": round((high - low) / mean, 4) if mean else 0.0,
    }


def measure(
    name: str,
    world_size: int,
    rank_batches: Callable[[int], list[list[str]]],
    seconds: dict[str, float],
    all_keys: Iterable[str],
) -> dict[str, Any]:
    """Every rank's batches of one loader at one world size, and what they add up to."""
    started = time.perf_counter()
    per_rank = []
    seen: Counter[str] = Counter()
    for rank in range(world_size):
        batches = rank_batches(rank)
        keys = [key for batch in batches for key in batch]
        seen.update(keys)
        per_rank.append(
            {
                "rank": rank,
                "batches": len(batches),
                "samples": len(keys),
                "audio_s": round(sum(seconds[key] for key in keys), 3),
            }
        )
    counts = [r["batches"] for r in per_rank]
    return {
        "loader": name,
        "world_size": world_size,
        "per_rank": per_rank,
        "batches": spread(counts),
        "audio_s": spread([r["audio_s"] for r in per_rank]),
        "samples": spread([r["samples"] for r in per_rank]),
        "equal_batches": len(set(counts)) == 1,
        "hang_steps": max(counts) - min(counts),
        "missing": sum(1 for key in all_keys if key not in seen),
        "repeated": sum(seen.values()) - len(seen),
        "seconds": round(time.perf_counter() - started, 2),
    }


def empty_workers(num_shards: int, world_size: int) -> int:
    """(rank, worker) pairs that split_by_node + split_by_worker leave without a shard (WebDataset's default
    ``empty_check=True`` raises there)."""
    shards = list(range(num_shards))
    return sum(
        1
        for rank in range(world_size)
        for worker in range(NUM_WORKERS)
        if not shards[rank::world_size][worker::NUM_WORKERS]
    )


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    config, data, machine = report["config"], report["dataset"], report["machine"]
    sizes = ", ".join(map(str, data["shard_sizes"]))
    low, high = config["duration_range"]
    intro = (
        f"`{report['command']}` on {machine['cpus']} cores, Python {machine['python']}, torch "
        f"{machine['torch']}, webdataset {machine['webdataset']}. Dataset: {data['samples']} real 8 kHz WAV "
        f"samples ({data['audio_s']:.1f} s of audio, {low}-{high} s each) in {len(data['shard_sizes'])} "
        f"shards of {sizes} samples. Each rank reads through a DataLoader with {config['num_workers']} "
        f"workers; batch size {config['batch_size']} (WebDataset `.batched(partial=True)` per worker), or "
        f"shardio `max_duration={config['max_duration']}`."
    )
    legend = (
        "`hang steps`: batches the longest rank still has when the shortest one is done; under DDP those "
        "ranks block in their next all-reduce until the collective timeout. `missing` / `repeated`: "
        "samples of the epoch no rank saw / seen more than once (shardio pads the last round with "
        'repeats so that every rank has the same count; `remainder="drop"` leaves it out instead). '
        "Audio seconds count repeats. shardio deals each round's batches longest first to the ranks with "
        "the least audio so far, so its spread stays within about one batch (here 5-8 batches per rank "
        "at 8 ranks, so one batch is a large share)."
    )
    header = (
        "| loader | batches per rank | min | max | hang steps | audio s min | max | spread | missing "
        "| repeated |"
    )
    lines = ["# Rank balance: WebDataset split_by_node vs shardio", "", intro, "", legend, ""]
    for world_size in config["world_sizes"]:
        lines += [f"## {world_size} ranks", "", header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for row in report["results"]:
            if row["world_size"] != world_size:
                continue
            counts = " ".join(str(r["batches"]) for r in row["per_rank"])
            audio = row["audio_s"]
            lines.append(
                f"| {row['loader']} | {counts} | {row['batches']['min']:.0f} | {row['batches']['max']:.0f} "
                f"| {row['hang_steps']} | {audio['min']:.1f} | {audio['max']:.1f} "
                f"| {audio['spread']:.1f} ({100 * audio['relative_spread']:.0f}%) "
                f"| {row['missing']} | {row['repeated']} |"
            )
        empty = report["webdataset_empty_workers"][str(world_size)]
        if empty:
            lines += [
                "",
                (
                    f"WebDataset leaves {empty} of {world_size * config['num_workers']} DataLoader workers "
                    "without a shard here: with its default `empty_check=True` each of them raises "
                    "`ValueError: No samples found` (these runs pass `empty_check=False`)."
                ),
            ]
        lines.append("")
    verdict = report["verdict"]
    summary = (
        f"WebDataset gave unequal batch counts at world sizes {verdict['webdataset_unequal_at']} "
        f"(up to {verdict['webdataset_max_hang_steps']} hang steps); shardio gave equal counts at "
        f"{verdict['shardio_equal_at']}, with every sample once (plus the reported padding) "
        'or, with `remainder="drop"`, once except the dropped last round.'
    )
    lines += ["## Verdict", "", summary, ""]
    return "\n".join(lines)


def main() -> None:
    """Write the dataset, measure every loader at every world size, write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="where balance.json / balance.md go")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "uneven"
        index: Index = make_uneven_dataset(directory, SHARD_SIZES, seed=SEED, duration_range=DURATION_RANGE)
        seconds = dict(zip(index.keys, index.durations.tolist()))
        urls = [str(directory / shard.name) for shard in index.shards]
        results = []
        for world_size in WORLD_SIZES:
            loaders: list[tuple[str, Callable[[int], list[list[str]]]]] = [
                ("webdataset split_by_node", functools.partial(webdataset_rank, urls, world_size=world_size)),
                (
                    f"shardio batch_size={BATCH_SIZE}",
                    functools.partial(shardio_rank, directory, world_size=world_size, batch_size=BATCH_SIZE),
                ),
                (
                    f"shardio max_duration={MAX_DURATION:g}",
                    functools.partial(
                        shardio_rank, directory, world_size=world_size, max_duration=MAX_DURATION
                    ),
                ),
                (
                    f"shardio max_duration={MAX_DURATION:g} drop",
                    functools.partial(
                        shardio_rank,
                        directory,
                        world_size=world_size,
                        batching=Batching(max_duration=MAX_DURATION, remainder="drop"),
                    ),
                ),
            ]
            results += [measure(name, world_size, batches, seconds, index.keys) for name, batches in loaders]
            for row in results[-4:]:
                print(
                    f"R={world_size} {row['loader']:<28} batches {[r['batches'] for r in row['per_rank']]} "
                    f"audio spread {row['audio_s']['spread']:.1f} s",
                    flush=True,
                )
    wds_rows = [r for r in results if r["loader"].startswith("webdataset")]
    ours = [r for r in results if r["loader"].startswith("shardio")]
    report = {
        "benchmark": "balance",
        "command": "python benchmarks/balance.py",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "webdataset": getattr(wds, "__version__", "unknown"),
        },
        "config": {
            "shard_sizes": list(SHARD_SIZES),
            "duration_range": list(DURATION_RANGE),
            "batch_size": BATCH_SIZE,
            "max_duration": MAX_DURATION,
            "num_workers": NUM_WORKERS,
            "world_sizes": list(WORLD_SIZES),
            "seed": SEED,
        },
        "dataset": {
            "samples": len(index),
            "shard_sizes": [s.samples for s in index.shards],
            "audio_s": round(index.total_duration, 3),
        },
        "webdataset_empty_workers": {str(r): empty_workers(len(SHARD_SIZES), r) for r in WORLD_SIZES},
        "results": results,
        "verdict": {
            "webdataset_unequal_at": [r["world_size"] for r in wds_rows if not r["equal_batches"]],
            "webdataset_max_hang_steps": max(r["hang_steps"] for r in wds_rows),
            "shardio_equal_at": sorted({r["world_size"] for r in ours if r["equal_batches"]}),
            "shardio_all_equal": all(r["equal_batches"] for r in ours),
        },
    }
    write_results(args.out, "balance", report, markdown(report))
    print(f"wrote {args.out / 'balance.json'} and {args.out / 'balance.md'}")


if __name__ == "__main__":
    main()
