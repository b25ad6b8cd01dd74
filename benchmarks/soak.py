"""Soak: epochs over remote shards with 2 DataLoader workers under injected faults; nothing may be lost or
duplicated except the samples of one deliberately corrupted zstd frame, and those must all be reported.

For each backend (``http``: a threaded ``http.server`` with ``Range``; ``s3``: moto's S3 server, both on
127.0.0.1 from ``tests/remote_servers.py``) it runs the same epochs twice: clean, then with random faults on
shard requests (500/503 answers and dropped connections, at most 2 in a row per path, so the default
``RetryPolicy`` of 4 attempts always gets through) plus one corrupt frame read with ``on_error="skip"``.

    python benchmarks/soak.py                      # both backends, writes benchmarks/results/soak.{json,md}
    python benchmarks/soak.py --samples 300 --s3-samples 100 --epochs 1   # a quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from remote_servers import HTTPFileServer, S3Server, aws_test_env
from sample_shards import wav_bytes

from shardio import Index, Reading, ShardDataset, ShardWriter
from shardio.bench.report import write_results

logger = logging.getLogger("soak")


def write_dataset(directory: Path, samples: int, seed: int) -> Index:
    """``samples`` WAV clips of 0.05-0.15 s at 8 kHz, 100 a shard, zstd frames of about 16 KB."""
    rng = np.random.default_rng(seed)
    with ShardWriter(directory, compression="zstd", max_samples=100, frame_bytes=16384) as writer:
        for i in range(samples):
            frames = int(rng.integers(400, 1200))
            audio = (0.1 * rng.standard_normal(frames)).astype(np.float32)
            writer.write(
                f"utt{i:06d}",
                {"wav": wav_bytes(audio, 8000), "txt": f"sample {i}".encode()},
                audio_ext="wav",
                num_frames=frames,
                sample_rate=8000,
                channels=1,
            )
    return Index.load(directory)


def corrupt_one_frame(index: Index, shard: int) -> set[str]:
    """Flip a byte in the middle of the first frame of ``shard`` (same size); the keys that frame holds."""
    columns = index.columns
    first = int(np.flatnonzero(columns["shard"] == shard)[0])
    offset, size = int(columns["frame_offset"][first]), int(columns["frame_size"][first])
    with open(index.shard_path(shard), "r+b") as handle:
        handle.seek(offset + size // 2)
        byte = handle.read(1)
        handle.seek(offset + size // 2)
        handle.write(bytes([byte[0] ^ 0x5A]))
    hit = (columns["shard"] == shard) & (columns["frame_offset"] == offset)
    return {index.keys[i] for i in np.flatnonzero(hit)}


def run_epochs(
    url: str, options: dict[str, Any], epochs: int, workers: int, batch_size: int
) -> dict[str, Any]:
    """Iterate ``epochs`` epochs; per epoch the keys seen, lost, duplicated and reported as skipped."""
    dataset = ShardDataset(
        url, batch_size=batch_size, seed=3, reading=Reading(on_error="skip", storage_options=options)
    )
    everything = set(dataset.index.keys)
    results = []
    started = time.perf_counter()
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        seen: Counter[str] = Counter()
        skipped: dict[str, str] = {}
        batches = 0
        for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
            batches += 1
            seen.update(batch["keys"])
            for line in batch["skipped"]:
                key, _, reason = line.partition(": ")
                skipped[key] = reason
        lost = everything - set(seen)
        results.append(
            {
                "epoch": epoch,
                "batches": batches,
                "planned_batches": len(dataset),
                "samples_seen": sum(seen.values()),
                "lost": sorted(lost),
                "duplicated": sum(n - 1 for n in seen.values() if n > 1),
                "reported": sorted(skipped),
                "reasons": sorted({r.split(": ", 2)[-1][:60] for r in skipped.values()}),
            }
        )
    return {"wall_s": round(time.perf_counter() - started, 2), "epochs": results}


def soak(backend: str, samples: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Clean then faulty epochs of one backend."""
    local = scratch / backend
    index = write_dataset(local, samples, args.seed)
    logger.info("%s: %d samples in %d shards", backend, len(index), len(index.shards))
    if backend == "http":
        server: Any = HTTPFileServer(str(scratch))
        options: dict[str, Any] = {}
    else:
        server = S3Server()
    with server:
        url = f"{server.url}/{backend}" if backend == "http" else server.upload(str(local), "soak", "clean")
        if backend == "s3":
            options = server.storage_options
        clean = run_epochs(url, options, args.epochs, args.workers, args.batch_size)
        logger.info("%s clean: %.1f s", backend, clean["wall_s"])
        corrupt = corrupt_one_frame(index, shard=len(index.shards) // 2)
        if backend == "s3":
            url = server.upload(str(local), "soak", "faulty")
        server.faults.clear()
        server.faults.random(args.fault_rate, seed=args.seed, match="shard-", max_in_row=2)
        faulty = run_epochs(url, options, args.epochs, args.workers, args.batch_size)
        injected = dict(server.faults.injected)
        shard_requests = server.faults.count("shard-")
        logger.info(
            "%s faulty: %.1f s, %s faults in %d shard requests",
            backend,
            faulty["wall_s"],
            injected,
            shard_requests,
        )
    for epoch in faulty["epochs"]:
        epoch["lost_equals_corrupt"] = set(epoch["lost"]) == corrupt
        epoch["all_lost_reported"] = epoch["reported"] == epoch["lost"]
    for run in (clean, faulty):
        for epoch in run["epochs"]:
            epoch["lost_count"], epoch["reported_count"] = len(epoch.pop("lost")), len(epoch.pop("reported"))
    return {
        "samples": len(index),
        "shards": len(index.shards),
        "corrupt_samples": len(corrupt),
        "faults_injected": injected,
        "shard_requests": shard_requests,
        "clean": clean,
        "faulty": faulty,
        "slowdown": round(faulty["wall_s"] / clean["wall_s"], 2),
    }


def markdown(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [
        "# Soak: remote shards under injected faults",
        "",
        (
            f"`{c['command']}` on {c['machine']}: {c['epochs']} epochs, {c['workers']} workers, batch "
            f"{c['batch_size']}, fault rate {c['fault_rate']} per shard request (500/503 or dropped "
            "connection, at most 2 in a row), default RetryPolicy (4 attempts, 0.2 s backoff doubling), one "
            "corrupt zstd frame read with on_error=skip."
        ),
        "",
        (
            "| backend | samples | faults injected / shard requests | lost per epoch (corrupt) | all lost "
            "reported | duplicated | batches = planned | clean s | faulty s | slowdown |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["backends"].items():
        epochs = r["faulty"]["epochs"]
        lost = ", ".join(str(e["lost_count"]) for e in epochs)
        ok_lost = all(e["lost_equals_corrupt"] for e in epochs)
        reported = all(e["all_lost_reported"] for e in epochs)
        dups = sum(e["duplicated"] for run in ("clean", "faulty") for e in r[run]["epochs"])
        planned = all(
            e["batches"] == e["planned_batches"] for run in ("clean", "faulty") for e in r[run]["epochs"]
        )
        clean_lost = sum(e["lost_count"] for e in r["clean"]["epochs"])
        lines.append(
            f"| {name} | {r['samples']} | {sum(r['faults_injected'].values())} / {r['shard_requests']} "
            f"{r['faults_injected']} | {lost} ({r['corrupt_samples']}; = corrupt: {ok_lost}; clean run: "
            f"{clean_lost}) | {reported} | {dups} | {planned} | {r['clean']['wall_s']} "
            f"| {r['faulty']['wall_s']} | {r['slowdown']}x |"
        )
    lines += [
        "",
        "Skip reasons seen: "
        + "; ".join(
            sorted(
                {
                    reason
                    for r in report["backends"].values()
                    for e in r["faulty"]["epochs"]
                    for reason in e["reasons"]
                }
            )
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3000, help="samples in the http dataset")
    parser.add_argument(
        "--s3-samples", type=int, default=1000, help="samples in the s3 dataset (moto is slow)"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fault-rate", type=float, default=0.03)
    parser.add_argument("--backends", default="http,s3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("shardio").setLevel(logging.ERROR)  # retries and skips are counted, not printed
    torch.set_num_threads(1)
    report: dict[str, Any] = {
        "config": {
            "command": " ".join(["python benchmarks/soak.py", *sys.argv[1:]]),
            "epochs": args.epochs,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "fault_rate": args.fault_rate,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"torch {torch.__version__}",
        },
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="shardio-soak-") as scratch, aws_test_env():
        for backend in args.backends.split(","):
            samples = args.samples if backend == "http" else args.s3_samples
            report["backends"][backend] = soak(backend, samples, args, Path(scratch))
    write_results(args.out, "soak", report, markdown(report))
    logger.info("\n%s", markdown(report))
    failed = [
        name
        for name, r in report["backends"].items()
        if not all(
            e["lost_equals_corrupt"]
            and e["all_lost_reported"]
            and e["duplicated"] == 0
            and e["batches"] == e["planned_batches"]
            for e in r["faulty"]["epochs"]
        )
        or any(e["lost_count"] or e["duplicated"] for e in r["clean"]["epochs"])
    ]
    if failed:
        logger.error("soak failed for %s", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
