"""Node plan files: what checking them costs (owner and mode, sizes, digests, values; a private copy of the
rank's share), at 10M samples and per open.

Run ``python benchmarks/planfiles.py [--samples 10000000] [--runs 5]``. Synthetic index columns as in
``benchmarks/plan.py`` (10,000 shards of lognormal sizes, LibriSpeech-like durations), ``batch_size=32``,
for 8 ranks and for 1 (the worst case: one rank reads every id). For each world:

- ``plan``: ``plan_epoch`` (what a process that reads the node plan does not do);
- ``write``: ``planfiles.save`` of every rank's share, digests included, into an empty cache;
- ``read``: ``nodeplan.read`` of rank 0's share (open without following links and ``fstat`` every file, read
  the rank's part into private memory, SHA-256 over it, range checks), page cache warm;
- ``mapped read``: what the read did before the checks: the three files mapped (headers read by one pattern),
  the same value checks on the mapped views, no copy, no digest;
- ``sha256``: hashing the rank's ids alone (the digest's share of ``read``).

Per open: the same two reads of a 12-sample, 1-rank plan (the fixed cost of a process's read: opens,
``fstat``, headers, digests). Times are medians of ``--runs`` calls (``time.perf_counter``). Writes
``benchmarks/results/planfiles.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardio.bench.report import write_results
from shardio.planning.plan import Batching, EpochPlan, plan_epoch
from shardio.runtime import nodeplan, planfiles
from shardio.synth import duration_sample

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NUM_SHARDS = 10_000
BATCH_SIZE = 32
SEED = 0
NAME = "0123456789ab-e000001-0123456789abcdef0123456789abcdef"


def columns(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Shard ids (lognormal shard sizes, each at least one sample) and durations, as benchmarks/plan.py."""
    generator = np.random.default_rng([SEED, n])
    weights = generator.lognormal(0.0, 1.0, NUM_SHARDS)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * (n - NUM_SHARDS)).astype(np.int64) + 1)
    sizes[-1] += n - sizes.sum()
    return np.repeat(np.arange(NUM_SHARDS, dtype=np.uint32), sizes), duration_sample(n, seed=SEED)


def median_ms(function: Callable[[], Any], runs: int) -> dict[str, float]:
    """Median, min and max milliseconds of ``runs`` calls."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return {
        "median": round(statistics.median(times), 3),
        "min": round(min(times), 3),
        "max": round(max(times), 3),
    }


_HEADER = re.compile(
    rb"\{'descr': '([<|][a-z][0-9])', 'fortran_order': False, "
    rb"'shape': \((\d+),(?: (\d+))?\), \}"
)


def mapped(path: str) -> np.ndarray:
    """A plan file mapped read-only, its 128-byte header read by one pattern (as the read before did)."""
    with open(path, "rb") as file:
        head = file.read(128)
        match = _HEADER.match(head, 10)
        assert match is not None
        memory = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    shape = tuple(int(size) for size in match.groups()[1:] if size is not None)
    return np.frombuffer(memory, np.dtype(match[1].decode()), int(np.prod(shape)), 128).reshape(shape)


def mapped_read(directory: str, rank: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The read before this change: mapped views, the same value checks, no copy and no digest."""
    ids, starts, offsets = (
        mapped(os.path.join(directory, f"{name}.npy")) for name in ("ids", "starts", "offsets")
    )
    assert starts[0] == 0 and starts[-1] == ids.shape[0] and bool(np.all(starts[1:] >= starts[:-1]))
    begin, end = int(starts[rank]), int(starts[rank + 1])
    row, mine = offsets[rank], ids[begin:end]
    assert row[0] == 0 and row[-1] == end - begin and bool(np.all(row[1:] >= row[:-1]))
    assert mine.shape[0] == 0 or (0 <= int(mine.min()) and int(mine.max()) < samples)
    return mine, row


def measure(
    plan_of: Callable[[], EpochPlan], samples: int, runs: int, cache: Path, label: str
) -> dict[str, Any]:
    """Every cost for one plan (made by ``plan_of``), whose ids are below ``samples``."""
    os.environ["SHARDIO_CACHE_DIR"] = str(cache)
    started = time.perf_counter()
    plan = plan_of()
    plan_ms = (time.perf_counter() - started) * 1000
    directory = planfiles.path(NAME)

    def write() -> None:
        shutil.rmtree(directory, ignore_errors=True)
        assert planfiles.save(NAME, plan, samples) is not None

    row: dict[str, Any] = {
        "case": label,
        "samples": samples,
        "world_size": plan.world_size,
        "batches_per_rank": plan.num_batches,
        "plan_ms": round(plan_ms, 1),
        "write_ms": median_ms(write, runs),
    }
    share = nodeplan.read(directory, 0, samples)
    assert share is not None
    row["rank_ids"] = int(share.ids.shape[0])
    row["private_bytes"] = int(share.ids.nbytes + share.offsets.nbytes)
    row["read_ms"] = median_ms(lambda: nodeplan.read(directory, 0, samples), runs)
    row["mapped_read_ms"] = median_ms(lambda: mapped_read(directory, 0, samples), runs)
    row["sha256_ms"] = median_ms(lambda: hashlib.sha256(share.ids.data).digest(), runs)
    row["added_ms"] = round(row["read_ms"]["median"] - row["mapped_read_ms"]["median"], 3)
    print(
        f"{label:<34} plan {plan_ms:9.1f} ms  write {row['write_ms']['median']:8.1f} ms  read "
        f"{row['read_ms']['median']:8.3f} ms (mapped {row['mapped_read_ms']['median']:8.3f}, sha256 "
        f"{row['sha256_ms']['median']:7.3f})",
        flush=True,
    )
    return row


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    machine = report["machine"]
    lines = [
        "# Node plan files: the cost of checking them",
        "",
        f"`{report['command']}` on {machine['cpus']} cores (shared, load average "
        f"{machine['load_average']}), Python {machine['python']}, numpy {machine['numpy']}. Medians of "
        f"{report['runs']} calls (x20 per open), page cache warm. `read`: `nodeplan.read` of rank 0 "
        "(trust checks, private copy, SHA-256, value checks); `mapped read`: the read before the checks "
        "(mapped views, the same value checks); `added`: the difference, paid by each process that "
        "reads a node plan, once an epoch.",
        "",
        "| case | ranks | rank 0's ids | plan ms | write ms | read ms | mapped read ms | sha256 ms "
        "| added ms | private MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['case']} | {row['world_size']} | {row['rank_ids']:,} | {row['plan_ms']:,.1f} "
            f"| {row['write_ms']['median']:,.1f} | {row['read_ms']['median']:.3f} "
            f"| {row['mapped_read_ms']['median']:.3f} | {row['sha256_ms']['median']:.3f} "
            f"| {row['added_ms']:.3f} | {row['private_bytes'] / 2**20:.1f} |"
        )
    lines += [
        "",
        "`private MiB`: the rank's ids and offsets each reading process now holds in its own "
        "memory (a fork DataLoader worker shares its training process's copy).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Measure every case and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where planfiles.json / planfiles.md go")
    args = parser.parse_args()
    shard_ids, durations = columns(args.samples)
    by_size = Batching(batch_size=BATCH_SIZE)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for world in (8, 1):

            def plan_for(world_size: int = world) -> EpochPlan:
                return plan_epoch(
                    shard_ids,
                    durations,
                    NUM_SHARDS,
                    seed=SEED,
                    epoch=1,
                    world_size=world_size,
                    batching=by_size,
                )

            results.append(
                measure(
                    plan_for,
                    args.samples,
                    args.runs,
                    Path(scratch) / f"world-{world}",
                    f"{args.samples:,} samples, batch_size={BATCH_SIZE}",
                )
            )
        tiny = EpochPlan(np.arange(12), np.array([0, 5, 12]), np.arange(2)[None, :])
        results.append(
            measure(lambda: tiny, 12, args.runs * 20, Path(scratch) / "tiny", "per open: 12 samples")
        )
    command = "python benchmarks/planfiles.py"
    if args.samples != 10_000_000 or args.runs != 5:
        command += f" --samples {args.samples} --runs {args.runs}"
    report = {
        "benchmark": "planfiles",
        "command": command,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average": round(os.getloadavg()[0], 1),
        },
        "runs": args.runs,
        "config": {"num_shards": NUM_SHARDS, "batch_size": BATCH_SIZE, "seed": SEED},
        "results": results,
    }
    write_results(args.out, "planfiles", report, markdown(report))
    print(f"wrote {args.out / 'planfiles.json'} and {args.out / 'planfiles.md'}")


if __name__ == "__main__":
    main()
