"""Ledger cost: ``shardio trace`` for one step and for one key on a 10M-sample synthetic index.

Run ``python benchmarks/trace.py [--samples 10000000] [--runs 3]``. The index is in memory: the synthetic
columns of ``benchmarks/plan.py`` (10,000 shards of lognormal sizes, LibriSpeech-like durations) plus one
key per sample; ``max_duration=600``, 8 ranks. The state is mid-epoch after an elastic resume (8 ranks
consumed half the epoch, then 6 ranks took 10 batches), so the trace re-plans the finished segment as the
loader does. Cases, each from a fresh :class:`shardio.Trace` (what one ``shardio trace`` call does, less
loading the index):

- one step: every rank's batch at one step of the current segment, with keys and durations;
- one key: every (step, rank) of one key in that epoch (the key resolved through the index's keys).

Time: median, min and max of ``--runs`` runs. Memory: the ``tracemalloc`` peak of one more run, beyond the
index. Writes ``benchmarks/results/trace.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan import NUM_SHARDS, columns, peak_mib  # noqa: E402  (the planner benchmark's columns and peak)

from shardio import Index, ShardDataset, ShardInfo, Trace, World  # noqa: E402
from shardio.bench.measure import timed  # noqa: E402
from shardio.bench.report import write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
WORLD, NEW_WORLD, MAX_DURATION, SEED, EPOCH = 8, 6, 600.0, 0, 1


def synthetic_index(n: int) -> Index:
    """An in-memory index of ``n`` samples at 16 kHz over the planner benchmark's columns,
    keyed ``uNNNNNNNNN``."""
    shard_ids, durations = columns(n)
    sizes = np.bincount(shard_ids, minlength=NUM_SHARDS)
    cols = {
        "shard": shard_ids,
        "num_frames": np.round(durations * 16000).astype(np.uint32),
        "sample_rate": np.full(n, 16000, np.uint32),
    }
    shards = [ShardInfo(f"shard-{s:06d}.tar", 0, "", int(size), 0.0) for s, size in enumerate(sizes)]
    return Index(
        root="",
        shards=shards,
        formats=["wav"],
        columns=cols,
        fingerprint=f"synthetic-{n}",
        _keys=[f"u{i:09d}" for i in range(n)],
    )


def main() -> None:
    """Measure both cases and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    index = synthetic_index(args.samples)
    build_s = time.perf_counter() - started
    first = ShardDataset(index, max_duration=MAX_DURATION, seed=SEED, world=World(0, WORLD))
    first.set_epoch(EPOCH)
    half = len(first) // 2
    state = {**first.state_dict(), "start": half}
    second = ShardDataset(index, max_duration=MAX_DURATION, seed=SEED, world=World(0, NEW_WORLD))
    second.load_state_dict(state)
    state = {**second.state_dict(), "start": 10}
    step = half + 20
    probe = Trace(second, state)
    key = probe.row(probe.steps(EPOCH, step, rank=NEW_WORLD - 1)[0])["keys"][0]

    def fresh() -> ShardDataset:  # a dataset that has planned nothing yet, as in a new process
        return ShardDataset(index, max_duration=MAX_DURATION, seed=SEED, world=World(0, NEW_WORLD))

    def one_step() -> Any:
        trace = Trace(fresh(), state)
        return [trace.row(record) for record in trace.steps(EPOCH, step)]

    def one_key() -> Any:
        return Trace(fresh(), state).find([key], [EPOCH])

    assert [(f["step"], f["rank"]) for f in one_key()] == [(step, NEW_WORLD - 1)]
    results = []
    for name, function in (("one step (all ranks, keys and durations)", one_step), ("one key", one_key)):
        wall, cpu = timed(function, args.runs)
        row = {"case": name, "time_s": wall, "cpu_s": cpu, "peak_mib": peak_mib(function)}
        print(
            f"{args.samples:,} samples, {name}: median {wall['median']:.2f} s wall, {cpu['median']:.2f} s "
            f"CPU, peak {row['peak_mib']} MiB",
            flush=True,
        )
        results.append(row)
    command = "python benchmarks/trace.py" + (
        ""
        if (args.samples, args.runs) == (10_000_000, 3)
        else f" --samples {args.samples} --runs {args.runs}"
    )
    report = {
        "benchmark": "trace",
        "command": command,
        "samples": args.samples,
        "runs": args.runs,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average": round(os.getloadavg()[0], 1),
        },
        "config": {
            "world_size": WORLD,
            "elastic_world_size": NEW_WORLD,
            "max_duration": MAX_DURATION,
            "history": [[WORLD, half]],
            "position": 10,
            "step": step,
            "epoch": EPOCH,
        },
        "index_build_s": round(build_s, 1),
        "results": results,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    lines = [
        "# Ledger cost (`shardio trace`)",
        "",
        f"`{command}` on {os.cpu_count()} cores (shared, load average {report['machine']['load_average']}): "
        f"{args.samples:,} samples, {NUM_SHARDS:,} shards, max_duration={MAX_DURATION:g}, an elastic history "
        f"({WORLD} ranks for {half} steps, then {NEW_WORLD}). Each run builds a fresh Trace (plans both "
        f"segments). CPU and wall seconds: median (min-max) of {args.runs} runs; peak: tracemalloc, beyond "
        "the index.",
        "",
        "| case | CPU s (median) | min | max | wall s (median) | peak MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['cpu_s']['median']:.2f} | {r['cpu_s']['min']:.2f} | {r['cpu_s']['max']:.2f} "
        f"| {r['time_s']['median']:.2f} | {r['peak_mib']:.0f} |"
        for r in results
    ]
    lines += [
        "",
        f"Max RSS of the whole run (the index and its keys included): {report['max_rss_mib']:.0f} MiB.",
        "",
    ]
    write_results(args.out, "trace", report, "\n".join(lines))
    print(f"wrote {args.out / 'trace.json'} and {args.out / 'trace.md'}")


if __name__ == "__main__":
    main()
