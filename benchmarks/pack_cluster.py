"""Partitioned packing: the local engine at ``-j 1`` and ``-j 2``, Ray (a local cluster of 2 CPUs), and a
projection for N machines from measured per-partition costs.

Run ``python benchmarks/pack_cluster.py [--quick]``. The corpus is generated (``shardio.synth``: WAV, 16 kHz,
1-5 s) so the figures do not depend on shared files. Every timing is the median of 3 runs (1 with
``--quick``), page cache warm. The Ray cluster is started once (its start time is reported apart) and the
runs reuse it. The projection divides the measured per-partition seconds over N machines (longest first,
each to the least loaded machine) and adds the measured plan and merge times: it assumes the shards'
storage keeps up and each machine packs at this machine's per-core rate; it is a projection, not a
measurement. Writes ``benchmarks/results/pack_cluster.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import heapq
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shardio.bench.report import write_results
from shardio.packing.engines import pack_partitioned
from shardio.packing.merging import merge_partitions
from shardio.packing.pack import pack
from shardio.packing.partitions import PackOptions, pack_partition, plan_partitions
from shardio.synth import make_corpus

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PARTITION_BYTES = 8 * 10**6
SHARD_BYTES = 4 * 10**6


def timed_runs(action: Any, out: Path, runs: int) -> dict[str, float]:
    seconds = []
    for _ in range(runs):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return dict(seconds=statistics.median(seconds), min=min(seconds), max=max(seconds))


def makespan(costs: list[float], machines: int) -> float:
    """Longest-first list scheduling of ``costs`` over ``machines``: the finishing time of the busiest."""
    loads = [0.0] * machines
    heapq.heapify(loads)
    for cost in sorted(costs, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + cost)
    return max(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run per figure and a smaller corpus")
    args = parser.parse_args()
    runs, files = (1, 300) if args.quick else (3, 1000)
    with tempfile.TemporaryDirectory(prefix="shardio-cluster-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        paths = make_corpus(corpus, num_files=files, formats=("wav",), min_seconds=1.0, max_seconds=5.0)
        input_bytes = sum(p.stat().st_size for p in paths)
        for path in paths:
            path.read_bytes()
        out = work / "out"
        common = dict(
            partition_bytes=PARTITION_BYTES, shard_bytes=SHARD_BYTES, compression="zstd", progress=False
        )
        figures: dict[str, dict[str, float]] = {}
        figures["pack (unpartitioned) -j 1"] = timed_runs(
            lambda: pack(corpus, out, shard_bytes=SHARD_BYTES, compression="zstd", progress=False), out, runs
        )
        figures["local engine -j 1"] = timed_runs(
            lambda: pack_partitioned(corpus, out, workers=1, **common), out, runs
        )
        figures["local engine -j 2"] = timed_runs(
            lambda: pack_partitioned(corpus, out, workers=2, **common), out, runs
        )
        ray_start = None
        try:
            import ray

            start = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            ray_start = time.perf_counter() - start
            figures["ray local cluster, 2 CPUs"] = timed_runs(
                lambda: pack_partitioned(corpus, out, engine="ray", **common), out, runs
            )
            ray.shutdown()
        except ImportError:
            pass
        # per-partition costs, measured one at a time in this process
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        plan = plan_partitions(
            corpus,
            out,
            options=PackOptions(shard_bytes=SHARD_BYTES, compression="zstd"),
            partition_bytes=PARTITION_BYTES,
        )
        plan_seconds = time.perf_counter() - start
        costs = []
        for number in range(len(plan.partitions)):
            start = time.perf_counter()
            pack_partition(plan.job(number))
            costs.append(time.perf_counter() - start)
        start = time.perf_counter()
        merge_partitions(plan)
        merge_seconds = time.perf_counter() - start
    projection = {n: plan_seconds + makespan(costs, n) + merge_seconds for n in (1, 2, 4, 8, 16, 64)}
    report = dict(
        benchmark="pack_cluster",
        quick=args.quick,
        runs=runs,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        machine=f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
        corpus=dict(files=files, input_bytes=input_bytes, about="generated WAV 16 kHz 1-5 s"),
        partition_bytes=PARTITION_BYTES,
        shard_bytes=SHARD_BYTES,
        figures=figures,
        ray_start_seconds=ray_start,
        partitions=len(costs),
        partition_seconds=costs,
        plan_seconds=plan_seconds,
        merge_seconds=merge_seconds,
        projected_seconds=projection,
    )
    write_results(RESULTS, "pack_cluster", report, markdown(report))
    print(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    corpus = report["corpus"]
    lines = [
        "# Partitioned packing: engines and a projection for N machines",
        "",
        f"`python benchmarks/pack_cluster.py{' --quick' if report['quick'] else ''}` on {report['machine']}; "
        f"{report['runs']} run(s) per figure: median (min-max). Corpus: {corpus['about']}, {corpus['files']} "
        f"files, {corpus['input_bytes'] / 1e6:.1f} MB; partitions of ~{report['partition_bytes'] / 1e6:.0f} "
        f"MB input, zstd shards of {report['shard_bytes'] / 1e6:.0f} MB.",
        "",
        "## Measured",
        "",
        "| run | seconds | MB/s of input |",
        "|---|---:|---:|",
    ]
    for name, figure in report["figures"].items():
        lines.append(
            f"| {name} | {figure['seconds']:.2f} ({figure['min']:.2f}-{figure['max']:.2f}) | "
            f"{corpus['input_bytes'] / 1e6 / figure['seconds']:.1f} |"
        )
    if report["ray_start_seconds"] is not None:
        lines += [
            "",
            f"Starting the local Ray cluster took {report['ray_start_seconds']:.1f} s (not in the Ray row).",
        ]
    costs = report["partition_seconds"]
    lines += [
        "",
        f"{report['partitions']} partitions packed one at a time: {statistics.median(costs):.3f} s median "
        f"({min(costs):.3f}-{max(costs):.3f}), {sum(costs):.2f} s in all; plan {report['plan_seconds']:.2f} "
        f"s, merge {report['merge_seconds']:.3f} s.",
        "",
        "## Projected for N machines (one partition at a time each)",
        "",
        "plan + longest-first makespan of the measured partition costs + merge; assumes storage keeps up.",
        "",
        "| machines | projected seconds | speed-up |",
        "|---:|---:|---:|",
    ]
    base = report["projected_seconds"][1]
    for machines, seconds in report["projected_seconds"].items():
        lines.append(f"| {machines} | {seconds:.2f} | {base / seconds:.1f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
