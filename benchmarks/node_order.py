"""Node-stable order against the global shuffle: what ``Ordering(node_stable=True)`` costs in shuffle quality.

Run ``python benchmarks/node_order.py [--epochs 3]``. Pure planning (no audio is read): a synthetic index
shaped like a two-corpus speech job, packed as real corpora are (a speaker's utterances consecutive, shards of
200 consecutive samples): ``books`` (24,000 utterances of 2-20 s, 60 per speaker) and ``web`` (8,000 of 1-8 s,
20 per speaker), 160 shards, about 86 hours. Each world (8 ranks as 1 node: the global shuffle; 2 nodes of
4; 4 of 2; 8 of 1; 16 ranks as 4 nodes of 4) is planned with ``batch_size=16`` and with
``max_duration=240, num_buckets=10``, ``shuffle_shards=16``, for ``--epochs`` epochs. Per epoch:

- ``same shard pairs``: per batch, the share of its sample pairs that come from one shard (mean over batches);
- ``shards/step``, ``speakers/step``: distinct shards and speakers among a global step's samples (every
  rank's batch ``j``; median over steps);
- ``web share sd``: the standard deviation over steps of the share of ``web`` samples in a step;
- ``node overlap``: the share of a node's samples of epoch ``e + 1`` that it also read in epoch ``e`` (what
  a node-local cache of one epoch can hit: 1/nodes under the global shuffle, 1.0 node-stable);
- ``reachable pairs``: the share of sample pairs that can ever share a rank's batch (1/nodes node-stable);
- ``step efficiency`` and ``padded`` samples (the plan's report).

Medians over the epochs. Writes ``benchmarks/results/node_order.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardio.bench.report import write_results
from shardio.planning.plan import Batching, EpochPlan, Ordering, plan_epoch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PER_SHARD = 200
WORLDS = ((8, 1), (8, 2), (8, 4), (8, 8), (16, 4))
BATCHINGS = {
    "batch_size=16": Batching(batch_size=16),
    "max_duration=240, 10 buckets": Batching(max_duration=240.0, num_buckets=10),
}


def corpus() -> dict[str, np.ndarray]:
    """The synthetic index: per sample its shard, duration, speaker and corpus (0 books, 1 web)."""
    generator = np.random.default_rng(0)
    books, web = 24_000, 8_000
    durations = np.concatenate(
        [np.clip(generator.gamma(4.0, 3.0, books), 2, 20), np.clip(generator.gamma(3.0, 1.3, web), 1, 8)]
    ).round(2)
    speakers = np.concatenate([np.arange(books) // 60, books // 60 + np.arange(web) // 20])
    corpora = np.repeat([0, 1], [books, web])
    shard_ids = (np.arange(books + web) // PER_SHARD).astype(np.uint32)
    return {"shard_ids": shard_ids, "durations": durations, "speakers": speakers, "corpora": corpora}


def step_samples(plan: EpochPlan) -> list[np.ndarray]:
    """Every global step's samples: batch ``j`` of every rank."""
    return [
        np.concatenate([plan.batch(r, j) for r in range(plan.world_size)]) for j in range(plan.num_batches)
    ]


def same_shard_pairs(plan: EpochPlan, shard_ids: np.ndarray) -> float:
    shares = []
    for b in range(plan.offsets.shape[0] - 1):
        shards = shard_ids[plan.samples[plan.offsets[b] : plan.offsets[b + 1]]]
        n = shards.shape[0]
        if n < 2:
            continue
        counts = np.unique(shards, return_counts=True)[1]
        shares.append(float((counts * (counts - 1)).sum()) / (n * (n - 1)))
    return float(np.mean(shares))


def node_sets(plan: EpochPlan, nodes: int) -> list[set[int]]:
    each = plan.world_size // nodes
    return [
        set(
            np.concatenate(
                [plan.batch(r, j) for r in range(n * each, n * each + each) for j in range(plan.num_batches)]
            ).tolist()
        )
        for n in range(nodes)
    ]


def measure(
    columns: dict[str, np.ndarray], world: tuple[int, int], batching: Batching, node_stable: bool, epochs: int
) -> dict[str, Any]:
    ranks, nodes = world
    shard_ids, durations = columns["shard_ids"], columns["durations"]
    rows: dict[str, list[float]] = {}
    previous: list[set[int]] | None = None
    for epoch in range(epochs):
        began = time.perf_counter()
        plan = plan_epoch(
            shard_ids,
            durations,
            int(shard_ids.max()) + 1,
            seed=1,
            epoch=epoch,
            world_size=ranks,
            batching=batching,
            ordering=Ordering(shuffle_shards=16, node_stable=node_stable),
            nodes=nodes if node_stable else 1,
        )
        seconds = time.perf_counter() - began
        steps = step_samples(plan)
        found = {
            "plan_s": seconds,
            "same_shard_pairs": same_shard_pairs(plan, shard_ids),
            "shards_per_step": float(np.median([np.unique(shard_ids[s]).shape[0] for s in steps])),
            "speakers_per_step": float(
                np.median([np.unique(columns["speakers"][s]).shape[0] for s in steps])
            ),
            "web_share_sd": float(np.std([columns["corpora"][s].mean() for s in steps])),
            "step_efficiency": float(plan.report["step_efficiency"]),
            "padded": float(plan.padded),
            "batches_per_rank": float(plan.num_batches),
        }
        sets = node_sets(plan, nodes)
        if previous is not None:
            found["node_overlap"] = float(
                np.mean([len(a & b) / max(len(b), 1) for a, b in zip(previous, sets)])
            )
        previous = sets
        for name, value in found.items():
            rows.setdefault(name, []).append(value)
    medians = {name: round(float(np.median(values)), 4) for name, values in rows.items()}
    medians["reachable_pairs"] = round(1 / nodes if node_stable else 1.0, 4)
    return medians


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Node-stable order against the global shuffle",
        "",
        f"`{report['command']}`: {report['samples']} samples, {report['shards']} shards, "
        f"{report['hours']:.1f} h; medians over {report['epochs']} epochs (see the script's docs).",
        "",
        "| batching | ranks | nodes | order | same-shard pairs | shards/step | speakers/step | web share sd "
        "| node overlap | reachable pairs | step efficiency | padded | plan s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['batching']} | {row['ranks']} | {row['nodes']} | {row['order']} | "
            f"{row['same_shard_pairs']:.4f} | {row['shards_per_step']:g} | {row['speakers_per_step']:g} | "
            f"{row['web_share_sd']:.4f} | {row.get('node_overlap', float('nan')):.3f} | "
            f"{row['reachable_pairs']:.3f} | {row['step_efficiency']:.4f} | {row['padded']:g} | "
            f"{row['plan_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    columns = corpus()
    rows = []
    for name, batching in BATCHINGS.items():
        for world in WORLDS:
            for node_stable in (False, True) if world[1] > 1 else (False,):
                found = measure(columns, world, batching, node_stable, args.epochs)
                order = "node-stable" if node_stable else "global"
                rows.append({"batching": name, "ranks": world[0], "nodes": world[1], "order": order, **found})
                print(rows[-1], flush=True)
    report = {
        "command": f"python benchmarks/node_order.py --epochs {args.epochs}",
        "samples": int(columns["durations"].shape[0]),
        "shards": int(columns["shard_ids"].max()) + 1,
        "hours": float(columns["durations"].sum()) / 3600,
        "epochs": args.epochs,
        "rows": rows,
    }
    write_results(args.out, "node_order", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
