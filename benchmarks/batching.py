"""Batching efficiency: how much of each batch is audio, not padding, for fixed-size, max-duration and
bucketed batching, as the planner forms them (``shardio.planning.plan.plan_epoch``, metadata only).

Run ``python benchmarks/batching.py [--quick] [--plan-samples N]``. Corpora: the shared real corpora
(``../shared/corpora``: FSDD digits and Asterisk prompts, durations read with ``soundfile.info``, no index
needed) when present, and a synthetic LibriSpeech-like distribution (``shardio.synth.duration_sample``: most
utterances 10-17 s, a tail from 1 to 35 s). For each corpus the fixed batch size is the mean batch size of
max-duration batching, so the methods compare at the same number of samples per batch.

Figures: the padding ratio (padded seconds that are not audio, over the epoch) and the useful-audio share
per batch (audio / padded seconds of each batch: mean, 10th percentile, minimum). Also the time to plan an
epoch of ``--plan-samples`` synthetic samples with and without bucketing.

Step balance: DDP waits for the slowest rank at each step, so for worlds of 8 and 64 ranks the step
efficiency is the mean over steps of (mean rank cost / max rank cost), under a padded cost (count x longest)
and a quadratic one (count x (d + d**2/15) of the longest d), for max-duration batching and bucketing, without
and with ``sync_buckets``, and bucketing with ``quadratic_duration=15``; the last step (padded by repeats) is
left out; the window jump beside them measures read locality. Writes
``benchmarks/results/batching.json`` and ``benchmarks/results/batching.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from shardio.bench.report import write_results
from shardio.planning.batches import batch_audio
from shardio.planning.order import window_order
from shardio.planning.plan import Batching, Ordering, plan_epoch
from shardio.synth import duration_sample

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "corpora"
RESULTS = REPO / "benchmarks" / "results"
SHARD_SAMPLES = {"fsdd": 100, "asterisk": 50, "librispeech-like": 1000}


def real_corpora(shared: Path = SHARED) -> dict[str, dict[str, Any]]:
    """Durations of the shared real corpora that are present (read from the WAV headers)."""
    found = {}
    for name, folder, note in (
        ("fsdd", "fsdd", "FSDD spoken digits, 8 kHz WAV"),
        ("asterisk", "asterisk_core_sounds_en", "Asterisk prompts, 8 kHz WAV"),
    ):
        files = sorted((shared / folder).rglob("*.wav"))
        if files:
            durations = np.array([soundfile.info(str(f)).duration for f in files])
            found[name] = {"durations": durations, "source": f"real: {note}, {len(files)} files"}
    return found


def synthetic(n: int) -> dict[str, Any]:
    """A LibriSpeech-like duration distribution."""
    return {"durations": duration_sample(n, seed=0), "source": f"synthetic: LibriSpeech-like, {n} utterances"}


def measure(durations: np.ndarray, shard_samples: int, batching: Batching, seed: int = 0) -> dict[str, Any]:
    """One epoch's batches (world of 1) and how much of them is audio."""
    shard_ids = (np.arange(durations.shape[0]) // shard_samples).astype(np.uint32)
    started = time.perf_counter()
    plan = plan_epoch(
        shard_ids,
        durations,
        int(shard_ids[-1]) + 1,
        seed=seed,
        epoch=0,
        world_size=1,
        batching=batching,
        ordering=Ordering(),
    )
    seconds = time.perf_counter() - started
    audio, padded = batch_audio(durations[plan.samples], plan.offsets)
    share = audio / padded
    sizes = np.diff(plan.offsets)
    return {
        "batches": int(sizes.shape[0]),
        "mean_batch_size": round(float(sizes.mean()), 2),
        "mean_audio_s": round(float(audio.mean()), 2),
        "mean_padded_s": round(float(padded.mean()), 2),
        "padding_ratio": round(1 - float(audio.sum() / padded.sum()), 4),
        "useful_share_mean": round(float(share.mean()), 4),
        "useful_share_p10": round(float(np.percentile(share, 10)), 4),
        "useful_share_min": round(float(share.min()), 4),
        "excluded": plan.excluded,
        "plan_s": round(seconds, 3),
    }


def compare(name: str, corpus: dict[str, Any], max_duration: float, buckets: int) -> dict[str, Any]:
    """Fixed-size, max-duration and bucketed batching of one corpus."""
    durations = corpus["durations"]
    shard = SHARD_SAMPLES[name]
    by_duration = measure(durations, shard, Batching(max_duration=max_duration))
    size = max(1, round(by_duration["mean_batch_size"]))
    methods = {
        f"fixed size ({size})": measure(durations, shard, Batching(batch_size=size)),
        f"max duration ({max_duration:g} s)": by_duration,
        f"bucketed ({buckets} buckets, {max_duration:g} s)": measure(
            durations, shard, Batching(max_duration=max_duration, num_buckets=buckets)
        ),
    }
    return {
        "source": corpus["source"],
        "samples": int(durations.shape[0]),
        "hours": round(float(durations.sum()) / 3600, 2),
        "duration_range_s": [round(float(durations.min()), 2), round(float(durations.max()), 2)],
        "shard_samples": shard,
        "methods": methods,
        "step_balance": step_balance(name, durations, max_duration, buckets),
    }


QUADRATIC = 15.0
"""``Q`` of the quadratic cost model (and of the ``quadratic_duration`` batching measured beside it)."""


def step_efficiency(durations: np.ndarray, plan: Any, quadratic: float | None) -> float:
    """Mean over steps (the padded last one left out) of mean rank cost / max rank cost."""
    costs = (
        durations[plan.samples]
        if quadratic is None
        else durations[plan.samples] + durations[plan.samples] ** 2 / quadratic
    )
    batch = np.maximum.reduceat(costs, plan.offsets[:-1]) * np.diff(plan.offsets)
    steps = batch[plan.rank_batches[:, :-1]]
    return round(float((steps.mean(axis=0) / steps.max(axis=0)).mean()), 4) if steps.size else 1.0


def window_jump(plan: Any, windows: np.ndarray) -> float:
    """Read locality: shard windows between a rank's consecutive batches (first sample's), mean over ranks."""
    first = windows[plan.samples[plan.offsets[:-1]]][plan.rank_batches]
    return round(float(np.abs(np.diff(first, axis=1)).mean()), 2) if plan.num_batches > 1 else 0.0


def step_balance(name: str, durations: np.ndarray, max_duration: float, buckets: int) -> list[dict[str, Any]]:
    """Step efficiency and padding of each batching (without and with ``sync_buckets``), worlds 8 and 64."""
    shard_ids = (np.arange(durations.shape[0]) // SHARD_SAMPLES[name]).astype(np.uint32)
    windows = window_order(shard_ids, int(shard_ids[-1]) + 1, Ordering(), (0, 0))[1]
    methods = {
        f"max duration ({max_duration:g} s)": Batching(max_duration=max_duration),
        f"max duration ({max_duration:g} s), sync_buckets=True": Batching(
            max_duration=max_duration, sync_buckets=True
        ),
    }
    for quadratic in (None, QUADRATIC):
        for sync in (False, True):
            label = f"{buckets} buckets" + (f", quadratic_duration={quadratic:g}" if quadratic else "")
            methods[f"{label}, sync_buckets={sync}"] = Batching(
                max_duration=max_duration,
                num_buckets=buckets,
                quadratic_duration=quadratic,
                sync_buckets=sync,
            )
    rows = []
    for world_size in (8, 64):
        for label, batching in methods.items():
            plan = plan_epoch(
                shard_ids,
                durations,
                int(shard_ids[-1]) + 1,
                seed=0,
                epoch=0,
                world_size=world_size,
                batching=batching,
                ordering=Ordering(),
            )
            rows.append(
                {
                    "world_size": world_size,
                    "batching": label,
                    "steps": plan.num_batches,
                    "padding_ratio": plan.report["padding_ratio"],
                    "step_efficiency_padded": step_efficiency(durations, plan, None),
                    "step_efficiency_quadratic": step_efficiency(durations, plan, QUADRATIC),
                    "window_jump": window_jump(plan, windows),
                }
            )
    return rows


def plan_timing(n: int) -> dict[str, float]:
    """Seconds to plan one epoch of ``n`` synthetic samples, without and with bucketing."""
    durations = duration_sample(n, seed=1)
    return {
        label: measure(durations, 1000, batching)["plan_s"]
        for label, batching in (
            ("max_duration", Batching(max_duration=600.0)),
            ("bucketed (30 buckets)", Batching(max_duration=600.0, num_buckets=30, sync_buckets=False)),
            ("bucketed (30 buckets), sync_buckets", Batching(max_duration=600.0, num_buckets=30)),
        )
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    lines = [
        "# Batching efficiency",
        "",
        f"`{report['command']}` on {report['machine']}. One epoch planned per method (seed 0), world of 1; "
        "padding ratio = padded seconds that are not audio; useful share = audio / padded seconds per batch.",
        "",
    ]
    for name, corpus in report["corpora"].items():
        lines += [
            f"## {name}",
            "",
            f"{corpus['source']}; {corpus['samples']} samples, {corpus['hours']} h, "
            f"{corpus['duration_range_s'][0]}-{corpus['duration_range_s'][1]} s; "
            f"{corpus['shard_samples']} samples per shard.",
            "",
            "| batching | batches | samples/batch | audio s/batch | padding ratio | useful share mean | "
            "p10 | min |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for method, m in corpus["methods"].items():
            lines.append(
                f"| {method} | {m['batches']} | {m['mean_batch_size']} | {m['mean_audio_s']} | "
                f"{m['padding_ratio']:.3f} | {m['useful_share_mean']:.3f} | {m['useful_share_p10']:.3f} | "
                f"{m['useful_share_min']:.3f} |"
            )
        lines.append("")
        lines += [
            "Step balance: step efficiency = mean over steps of mean rank cost / max rank cost, under a "
            f"padded and a quadratic (Q = {QUADRATIC:g}) cost model; padding ratio beside it.",
            "",
            "| world | batching | steps | padding ratio | step efficiency, padded | quadratic "
            "| window jump |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {row['world_size']} | {row['batching']} | {row['steps']} | {row['padding_ratio']:.4f} | "
            f"{row['step_efficiency_padded']:.4f} | {row['step_efficiency_quadratic']:.4f} | "
            f"{row['window_jump']} |"
            for row in corpus["step_balance"]
        ]
        lines.append("")
    if report.get("plan_seconds"):
        lines += [
            f"## Planning time, {report['plan_samples']} synthetic samples",
            "",
            "| batching | seconds |",
            "|---|---:|",
        ]
        lines += [f"| {label} | {seconds} |" for label, seconds in report["plan_seconds"].items()]
        lines.append("")
    if report.get("notes"):
        lines += ["## Notes", ""] + [f"- {note}" for note in report["notes"]] + [""]
    return "\n".join(lines)


def main() -> None:
    """Run the comparison and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller synthetic corpus, no planning timing")
    parser.add_argument("--plan-samples", type=int, default=1_000_000, help="samples for the planning timing")
    parser.add_argument(
        "--corpora",
        type=Path,
        default=SHARED,
        help="the shared corpora folder (default: ../shared/corpora beside the repository)",
    )
    args = parser.parse_args()
    corpora = real_corpora(args.corpora) if args.corpora.is_dir() else {}
    notes = [] if corpora else ["the shared corpora are absent: synthetic durations only"]
    notes.append(
        "step balance: the real corpora are small (FSDD 11 steps at world 8, Asterisk 3): at world 64 "
        "they fit in one step, and their figures mostly reflect leftover rounds"
    )
    notes.append(
        "window jump: shard windows (of shuffle_shards=16 shards) between a rank's consecutive batches, "
        "a measure of read locality; sync_buckets trades some for balance"
    )
    notes.append("planning is deterministic: the figures do not depend on the machine's load, the timings do")
    settings = {"fsdd": (30.0, 10), "asterisk": (150.0, 10), "librispeech-like": (600.0, 30)}
    corpora["librispeech-like"] = synthetic(20_000 if args.quick else 200_000)
    results = {name: compare(name, corpus, *settings[name]) for name, corpus in corpora.items()}
    command = "python benchmarks/batching.py" + (" --quick" if args.quick else "")
    report: dict[str, Any] = {
        "command": command,
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}, load average {os.getloadavg()[0]:.1f}",
        "corpora": results,
        "notes": notes,
    }
    if not args.quick:
        report["plan_samples"] = args.plan_samples
        report["plan_seconds"] = plan_timing(args.plan_samples)
    write_results(RESULTS, "batching", report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
