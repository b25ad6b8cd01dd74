"""Planner cost: time and peak memory of ``plan_epoch`` for 1M and 10M samples over 10k shards.

Run ``python benchmarks/plan.py [--sizes 1000000 10000000] [--runs 3]``. Synthetic index columns (what
``Index`` hands the planner): 10,000 shards of uneven sizes (lognormal), LibriSpeech-like durations
(``shardio.synth.duration_sample``: mostly 10-17 s, 1-35 s). Cases, all for 8 ranks:

- ``batch_size=32``;
- ``max_duration=600`` (padded seconds per batch, greedy);
- elastic re-plan: ``max_duration=600`` for 6 ranks after a segment in which 8 ranks consumed half of
  their batches (``history=(Segment(8, half),)``: the planner re-plans that segment to find what it
  consumed, then plans the rest).

Time: median, min and max of ``--runs`` runs (``time.perf_counter``, tracemalloc off). Memory: the
``tracemalloc`` peak of one more run (numpy reports its buffers to tracemalloc), beyond the input
columns, and the process's max RSS at the end. Writes ``benchmarks/results/plan.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardio.bench.report import write_results
from shardio.planning.plan import Batching, EpochPlan, Segment, plan_epoch
from shardio.synth import duration_sample

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NUM_SHARDS = 10_000
WORLD_SIZE = 8
ELASTIC_WORLD_SIZE = 6
BATCH_SIZE = 32
MAX_DURATION = 600.0
SEED = 0
EPOCH = 1


def columns(n: int, num_shards: int = NUM_SHARDS) -> tuple[np.ndarray, np.ndarray]:
    """Shard ids (shards of lognormal sizes, each at least one sample, in index order) and durations."""
    generator = np.random.default_rng([SEED, n])
    weights = generator.lognormal(0.0, 1.0, num_shards)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * (n - num_shards)).astype(np.int64) + 1)
    sizes[-1] += n - sizes.sum()
    shard_ids = np.repeat(np.arange(num_shards, dtype=np.uint32), sizes)
    return shard_ids, duration_sample(n, seed=SEED)


def timed(function: Callable[[], EpochPlan], runs: int) -> tuple[dict[str, Any], EpochPlan]:
    """Median, min and max seconds of ``runs`` calls, and the last plan."""
    seconds = []
    plan = None
    for _ in range(runs):
        started = time.perf_counter()
        plan = function()
        seconds.append(time.perf_counter() - started)
    assert plan is not None
    return {
        "median": round(statistics.median(seconds), 3),
        "min": round(min(seconds), 3),
        "max": round(max(seconds), 3),
        "runs": [round(s, 3) for s in seconds],
    }, plan


def peak_mib(function: Callable[[], Any]) -> float:
    """The tracemalloc peak of one call, in MiB (allocations made during the call only)."""
    tracemalloc.start()
    try:
        function()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return round(peak / 2**20, 1)


def cases(n: int, runs: int) -> list[dict[str, Any]]:
    """Every case at ``n`` samples."""
    shard_ids, durations = columns(n)
    by_size = Batching(batch_size=BATCH_SIZE)
    by_duration = Batching(max_duration=MAX_DURATION)

    def plan(
        batching: Batching, world_size: int = WORLD_SIZE, history: tuple[Segment, ...] = ()
    ) -> EpochPlan:
        return plan_epoch(
            shard_ids,
            durations,
            NUM_SHARDS,
            seed=SEED,
            epoch=EPOCH,
            world_size=world_size,
            batching=batching,
            history=history,
        )

    half = plan(by_duration).num_batches // 2
    specs: list[tuple[str, Callable[[], EpochPlan], dict[str, Any]]] = [
        (f"batch_size={BATCH_SIZE}", lambda: plan(by_size), {"world_size": WORLD_SIZE}),
        (f"max_duration={MAX_DURATION:g}", lambda: plan(by_duration), {"world_size": WORLD_SIZE}),
        (
            f"elastic re-plan, max_duration={MAX_DURATION:g}",
            lambda: plan(by_duration, ELASTIC_WORLD_SIZE, (Segment(WORLD_SIZE, half),)),
            {"world_size": ELASTIC_WORLD_SIZE, "history": [[WORLD_SIZE, half]]},
        ),
    ]
    found = []
    for name, function, extra in specs:
        time_s, result = timed(function, runs)
        row = {
            "samples": n,
            "shards": NUM_SHARDS,
            "case": name,
            **extra,
            "time_s": time_s,
            "peak_mib": peak_mib(function),
            "batches_per_rank": result.num_batches,
            "planned_samples": int(result.samples.shape[0]),
        }
        print(
            f"{n:>10,} {name:<36} median {time_s['median']:.3f} s (min {time_s['min']:.3f}, "
            f"max {time_s['max']:.3f}), peak {row['peak_mib']} MiB",
            flush=True,
        )
        found.append(row)
    return found


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    machine = report["machine"]
    intro = (
        f"`{report['command']}` on {machine['cpus']} cores (shared, load average {machine['load_average']}), "
        f"Python {machine['python']}, numpy {machine['numpy']}. Synthetic columns: {NUM_SHARDS:,} shards of "
        f"lognormal sizes, LibriSpeech-like durations (1-35 s); {WORLD_SIZE} ranks. Time: median (min-max) "
        f"of {report['runs']} runs. Peak: tracemalloc peak of one more run, allocations during planning "
        "only (the input columns, 12 bytes a sample, come on top)."
    )
    lines = [
        "# Planner cost",
        "",
        intro,
        "",
        "| samples | case | ranks | batches/rank | time s (median) | min | max | peak MiB | peak B/sample |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        per_sample = row["peak_mib"] * 2**20 / row["samples"]
        lines.append(
            f"| {row['samples']:,} | {row['case']} | {row['world_size']} | {row['batches_per_rank']:,} "
            f"| {row['time_s']['median']:.3f} | {row['time_s']['min']:.3f} | {row['time_s']['max']:.3f} "
            f"| {row['peak_mib']:.1f} | {per_sample:.0f} |"
        )
    note = (
        f"Max RSS of the whole run: {report['max_rss_mib']:.0f} MiB. The elastic re-plan plans twice "
        "(the finished segment, to know what it consumed, then the rest)."
    )
    lines += ["", note, ""]
    return "\n".join(lines)


def main() -> None:
    """Measure every case at every size and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where plan.json / plan.md go")
    args = parser.parse_args()
    results = [row for n in args.sizes for row in cases(n, args.runs)]
    command = "python benchmarks/plan.py"
    if args.sizes != [1_000_000, 10_000_000] or args.runs != 3:
        command += f" --sizes {' '.join(map(str, args.sizes))} --runs {args.runs}"
    report = {
        "benchmark": "plan",
        "command": command,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average": round(os.getloadavg()[0], 1),
        },
        "runs": args.runs,
        "config": {
            "num_shards": NUM_SHARDS,
            "world_size": WORLD_SIZE,
            "elastic_world_size": ELASTIC_WORLD_SIZE,
            "batch_size": BATCH_SIZE,
            "max_duration": MAX_DURATION,
            "seed": SEED,
            "epoch": EPOCH,
            "durations": "shardio.synth.duration_sample (librispeech profile)",
        },
        "results": results,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    write_results(args.out, "plan", report, markdown(report))
    print(f"wrote {args.out / 'plan.json'} and {args.out / 'plan.md'}")


if __name__ == "__main__":
    main()
