"""Re-mix cost: ``shardio.remix`` in the middle of an epoch of a large synthetic mix; the state's size.

Run ``python benchmarks/remix.py [--samples 2000000] [--runs 3]``. Two in-memory corpora over the planner
benchmark's columns (``big``: ``--samples``, 10,000 shards; ``small``: a quarter of it, 2,500 shards), mixed
0.7/0.3 by duration, an epoch of about one pass over ``small`` (in hours), ``max_duration=600`` in 8 buckets.
The state is mid-epoch after an elastic resume (8 ranks consumed a third of the epoch, then 6 ranks took 10
batches). Cases, each from fresh datasets (what a re-mix in a new process does, less loading the indexes):

- weights: the same corpora, new weights (0.4/0.6);
- drop: ``small`` dropped (its unconsumed positions of the epoch become pending);
- load: loading the re-mixed (weights) state into the new mix and planning the rest of the epoch.

Time: median, min and max of ``--runs`` runs (wall and CPU). Size: the re-mixed state as JSON, and how many
position ranges it holds. Writes ``benchmarks/results/remix.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan import NUM_SHARDS, columns  # noqa: E402  (the planner benchmark's columns)

from shardio import EpochSize, Index, MixedDataset, ShardInfo, World, remix  # noqa: E402
from shardio.bench.measure import timed  # noqa: E402
from shardio.bench.report import write_results  # noqa: E402
from shardio.shards.index import COLUMNS  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
WORLD, NEW_WORLD, MAX_DURATION, BUCKETS, SEED, EPOCH = 8, 6, 600.0, 8, 0, 1


def synthetic_index(n: int, num_shards: int, name: str) -> Index:
    """An in-memory index of ``n`` samples at 16 kHz over the planner benchmark's columns (no keys)."""
    shard_ids, durations = columns(n, num_shards)
    sizes = np.bincount(shard_ids, minlength=num_shards)
    cols = {
        "shard": shard_ids,
        "num_frames": np.round(durations * 16000).astype(np.uint32),
        "sample_rate": np.full(n, 16000, np.uint32),
        "format": np.zeros(n, np.uint8),
    }
    cols.update({column: np.zeros(n, dtype) for column, dtype in COLUMNS.items() if column not in cols})
    shards = [ShardInfo(f"shard-{s:06d}.tar", 0, "", int(size), 0.0) for s, size in enumerate(sizes)]
    return Index(root="", shards=shards, formats=["wav"], columns=cols, fingerprint=f"synthetic-{name}-{n}")


def ranges(state: dict[str, Any]) -> int:
    """Position ranges the state's re-mix record holds (tail and pending)."""
    entry = state["extra"]["remix"]
    held = list((entry.get("tail") or {}).get("positions", {}).values()) + list(
        entry.get("pending", {}).values()
    )
    return sum(len(r) for r in held)


def main() -> None:
    """Measure the cases and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    indexes = {
        "big": synthetic_index(args.samples, NUM_SHARDS, "big"),
        "small": synthetic_index(args.samples // 4, NUM_SHARDS // 4, "small"),
    }

    hours = float(indexes["small"].durations.sum()) / 3600 / 0.3  # about one pass over small at 0.3

    def mix(weights: dict[str, float], world: int) -> MixedDataset:
        return MixedDataset(
            {n: indexes[n] for n in weights},
            weights,
            EpochSize(hours=hours),
            seed=SEED,
            max_duration=MAX_DURATION,
            num_buckets=BUCKETS,
            world=World(0, world),
        )

    first = mix({"big": 0.7, "small": 0.3}, WORLD)
    first.set_epoch(EPOCH)
    third = len(first) // 3
    second = mix({"big": 0.7, "small": 0.3}, NEW_WORLD)
    second.load_state_dict({**first.state_dict(), "start": third})
    state = {**second.state_dict(), "start": 10}
    targets = {"weights": {"big": 0.4, "small": 0.6}, "drop": {"big": 1.0}}
    made = {
        name: remix(state, mix({"big": 0.7, "small": 0.3}, 1), mix(weights, 1))
        for name, weights in targets.items()
    }

    def load() -> Any:
        ds = mix(targets["weights"], NEW_WORLD)
        ds.load_state_dict(made["weights"])
        return len(ds)

    results = []
    cases: list[tuple[str, Callable[[], Any], dict[str, Any] | None]] = [
        (name, lambda w=weights: remix(state, mix({"big": 0.7, "small": 0.3}, 1), mix(w, 1)), made[name])
        for name, weights in targets.items()
    ] + [("load (plan the rest of the epoch)", load, None)]
    for name, function, made_state in cases:
        wall, cpu = timed(function, args.runs)
        row: dict[str, Any] = {"case": name, "time_s": wall, "cpu_s": cpu}
        if made_state is not None:
            row.update(state_bytes=len(json.dumps(made_state)), ranges=ranges(made_state))
        print(
            f"{args.samples:,} + {args.samples // 4:,} samples, {name}: median {wall['median']:.2f} s wall, "
            f"{cpu['median']:.2f} s CPU"
            + (
                f", state {row['state_bytes']:,} bytes, {row['ranges']} ranges"
                if made_state is not None
                else ""
            ),
            flush=True,
        )
        results.append(row)
    command = "python benchmarks/remix.py" + (
        "" if (args.samples, args.runs) == (2_000_000, 3) else f" --samples {args.samples} --runs {args.runs}"
    )
    report = {
        "benchmark": "remix",
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
            "num_buckets": BUCKETS,
            "history": [[WORLD, third]],
            "position": 10,
            "epoch": EPOCH,
            "quotas": first.plan().report["corpora"],
        },
        "results": results,
    }
    lines = [
        "# Re-mix cost (`shardio.remix` mid-epoch)",
        "",
        f"`{command}` on {os.cpu_count()} cores (shared, load average {report['machine']['load_average']}): "
        f"corpora of {args.samples:,} and {args.samples // 4:,} samples mixed 0.7/0.3, an epoch of about one "
        f"pass over the small one (in hours), max_duration={MAX_DURATION:g} in {BUCKETS} buckets, an elastic "
        f"history ({WORLD} ranks for {third} steps, then {NEW_WORLD} ranks for 10). Seconds: median "
        f"(min-max) of {args.runs} runs, fresh datasets each.",
        "",
        "| case | CPU s (median) | min | max | wall s (median) | state JSON bytes | position ranges |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['cpu_s']['median']:.2f} | {r['cpu_s']['min']:.2f} | {r['cpu_s']['max']:.2f} "
        f"| {r['time_s']['median']:.2f} | {r.get('state_bytes', '')} | {r.get('ranges', '')} |"
        for r in results
    ]
    write_results(args.out, "remix", report, "\n".join(lines) + "\n")
    print(f"wrote {args.out / 'remix.json'} and {args.out / 'remix.md'}")


if __name__ == "__main__":
    main()
