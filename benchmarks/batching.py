"""Batching efficiency: how much of each batch is audio, not padding, for fixed-size, max-duration and
bucketed batching, as the planner forms them (``shardio.plan.plan_epoch``, metadata only).

Run ``python benchmarks/batching.py [--quick] [--plan-samples N]``. Corpora: the shared real corpora
(``../shared/corpora``: FSDD digits and Asterisk prompts, durations read with ``soundfile.info``, no index
needed) when present, and a synthetic LibriSpeech-like distribution (``shardio.synth.duration_sample``: most
utterances 10-17 s, a tail from 1 to 35 s). For each corpus the fixed batch size is the mean batch size of
max-duration batching, so the methods compare at the same number of samples per batch.

Figures: the padding ratio (padded seconds that are not audio, over the epoch) and the useful-audio share
per batch (audio / padded seconds of each batch: mean, 10th percentile, minimum). Also the time to plan an
epoch of ``--plan-samples`` synthetic samples with and without bucketing. Writes
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

from shardio.benchreport import write_results
from shardio.bucketing import batch_audio
from shardio.plan import Batching, Ordering, plan_epoch
from shardio.synth import duration_sample

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "corpora"
RESULTS = REPO / "benchmarks" / "results"
SHARD_SAMPLES = {"fsdd": 100, "asterisk": 50, "librispeech-like": 1000}


def real_corpora() -> dict[str, dict[str, Any]]:
    """Durations of the shared real corpora that are present (read from the WAV headers)."""
    found = {}
    for name, folder, note in (("fsdd", "fsdd", "FSDD spoken digits, 8 kHz WAV"),
                               ("asterisk", "asterisk_core_sounds_en", "Asterisk prompts, 8 kHz WAV")):
        files = sorted((SHARED / folder).rglob("*.wav"))
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
    plan = plan_epoch(shard_ids, durations, int(shard_ids[-1]) + 1, seed=seed, epoch=0, world_size=1,
                      batching=batching, ordering=Ordering())
    seconds = time.perf_counter() - started
    audio, padded = batch_audio(durations[plan.samples], plan.offsets)
    share = audio / padded
    sizes = np.diff(plan.offsets)
    return {"batches": int(sizes.shape[0]), "mean_batch_size": round(float(sizes.mean()), 2),
            "mean_audio_s": round(float(audio.mean()), 2), "mean_padded_s": round(float(padded.mean()), 2),
            "padding_ratio": round(1 - float(audio.sum() / padded.sum()), 4),
            "useful_share_mean": round(float(share.mean()), 4),
            "useful_share_p10": round(float(np.percentile(share, 10)), 4),
            "useful_share_min": round(float(share.min()), 4), "excluded": plan.excluded,
            "plan_s": round(seconds, 3)}


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
            durations, shard, Batching(max_duration=max_duration, num_buckets=buckets)),
    }
    return {"source": corpus["source"], "samples": int(durations.shape[0]),
            "hours": round(float(durations.sum()) / 3600, 2),
            "duration_range_s": [round(float(durations.min()), 2), round(float(durations.max()), 2)],
            "shard_samples": shard, "methods": methods}


def plan_timing(n: int) -> dict[str, float]:
    """Seconds to plan one epoch of ``n`` synthetic samples, without and with bucketing."""
    durations = duration_sample(n, seed=1)
    return {label: measure(durations, 1000, batching)["plan_s"]
            for label, batching in (("max_duration", Batching(max_duration=600.0)),
                                    ("bucketed (30 buckets)", Batching(max_duration=600.0, num_buckets=30)))}


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    lines = ["# Batching efficiency", "",
             f"`{report['command']}` on {report['machine']}. One epoch planned per method (seed 0), world of 1; "
             "padding ratio = padded seconds that are not audio; useful share = audio / padded seconds per batch.",
             ""]
    for name, corpus in report["corpora"].items():
        lines += [f"## {name}", "", f"{corpus['source']}; {corpus['samples']} samples, {corpus['hours']} h, "
                  f"{corpus['duration_range_s'][0]}-{corpus['duration_range_s'][1]} s; "
                  f"{corpus['shard_samples']} samples per shard.", "",
                  "| batching | batches | samples/batch | audio s/batch | padding ratio | useful share mean | "
                  "p10 | min |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for method, m in corpus["methods"].items():
            lines.append(f"| {method} | {m['batches']} | {m['mean_batch_size']} | {m['mean_audio_s']} | "
                         f"{m['padding_ratio']:.3f} | {m['useful_share_mean']:.3f} | {m['useful_share_p10']:.3f} | "
                         f"{m['useful_share_min']:.3f} |")
        lines.append("")
    if report.get("plan_seconds"):
        lines += [f"## Planning time, {report['plan_samples']} synthetic samples", "",
                  "| batching | seconds |", "|---|---:|"]
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
    args = parser.parse_args()
    corpora = real_corpora() if SHARED.is_dir() else {}
    notes = [] if corpora else [f"the shared corpora ({SHARED}) are absent: synthetic durations only"]
    settings = {"fsdd": (30.0, 10), "asterisk": (150.0, 10), "librispeech-like": (600.0, 30)}
    corpora["librispeech-like"] = synthetic(20_000 if args.quick else 200_000)
    results = {name: compare(name, corpus, *settings[name]) for name, corpus in corpora.items()}
    command = "python benchmarks/batching.py" + (" --quick" if args.quick else "")
    report: dict[str, Any] = {
        "command": command, "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, "
                                       f"numpy {np.__version__}, load average {os.getloadavg()[0]:.1f}",
        "corpora": results, "notes": notes}
    if not args.quick:
        report["plan_samples"] = args.plan_samples
        report["plan_seconds"] = plan_timing(args.plan_samples)
    write_results(RESULTS, "batching", report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
