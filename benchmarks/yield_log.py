"""What the yield log (``SHARDIO_YIELD_LOG``, docs/guides/check-resume.md) costs per batch.

Run ``python benchmarks/yield_log.py [--rounds 7] [--files 400]``. Cases:

- one batch's record (:meth:`shardio.runtime.yieldlog.YieldLog.batch`: its keys' digest, one JSON line,
  one ``write``) for batches of 16 and 256 keys, without and with the keys themselves
  (``SHARDIO_YIELD_LOG_KEYS=1``), a median over ``--calls`` calls per round;
- the check when unset (:func:`~shardio.runtime.yieldlog.recorder`: one environment lookup, once per
  iteration);
- an epoch of a ``ShardLoader`` (0 workers, so that the recording is in the measured process) over a synthetic
  corpus of ``--files`` utterances, unset and set, alternated round by round: seconds per batch and the ratio.

Writes ``benchmarks/results/yield_log.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shardio import ShardDataset, ShardLoader
from shardio.bench.report import write_results
from shardio.packing.pack import pack
from shardio.runtime import yieldlog
from shardio.synth import make_corpus

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def per_call_us(function: Any, calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - started) / calls)
    return round(statistics.median(times) * 1e6, 3)


def record_cost(directory: Path, size: int, keys: bool, calls: int, rounds: int) -> float:
    os.environ[yieldlog.KEYS_ENV] = "1" if keys else "0"
    log = yieldlog.YieldLog(str(directory / f"records-{size}-{keys}"))
    batch = {
        "epoch": 3,
        "batch_index": 1234,
        "keys": [f"speaker{i:04d}/utterance-{i:06d}" for i in range(size)],
    }
    import torch

    batch["repeat"] = torch.zeros(size, dtype=torch.bool)
    fields = dict(src="0123456789ab", rank=0, world=8, worker=None, it="12345.140000000000000.1")
    return per_call_us(lambda: log.batch(batch, **fields), calls, rounds)


def epoch_seconds(data: Path, log: Path | None) -> tuple[float, int]:
    if log is None:
        os.environ.pop(yieldlog.ENV, None)
    else:
        os.environ[yieldlog.ENV] = str(log)
    loader = ShardLoader(ShardDataset(data, batch_size=16, seed=0), num_workers=0)
    started = time.perf_counter()
    count = sum(1 for _ in loader)
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for size in (16, 256):
            for keys in (False, True):
                us = record_cost(root, size, keys, args.calls, args.rounds)
                rows.append(
                    {"case": f"record a batch of {size} keys" + (", keys kept" if keys else ""), "us": us}
                )
        os.environ.pop(yieldlog.ENV, None)
        rows.append(
            {"case": "unset: the check per iteration", "us": per_call_us(yieldlog.recorder, 100_000, 5)}
        )
        make_corpus(root / "corpus", num_files=args.files, min_seconds=0.5, max_seconds=2.0)
        pack(root / "corpus", root / "data", samples_per_shard=100, progress=False)
        epoch_seconds(root / "data", None)  # warm: index, page cache
        unset, on = [], []
        batches = 0
        for number in range(args.rounds):
            seconds, batches = epoch_seconds(root / "data", None)
            unset.append(seconds / batches)
            seconds, batches = epoch_seconds(root / "data", root / f"epoch-log-{number}")
            on.append(seconds / batches)
        os.environ.pop(yieldlog.ENV, None)
    unset_ms, on_ms = statistics.median(unset) * 1e3, statistics.median(on) * 1e3
    epoch = {
        "batches": batches,
        "unset_ms_per_batch": round(unset_ms, 4),
        "set_ms_per_batch": round(on_ms, 4),
    }
    epoch["ratio"] = round(on_ms / unset_ms, 4)
    for row in rows:
        print(row, flush=True)
    print(epoch)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    machine["load_average"] = round(os.getloadavg()[0], 1)
    command = (
        f"python benchmarks/yield_log.py --rounds {args.rounds} --calls {args.calls} --files {args.files}"
    )
    report = {
        "benchmark": "yield_log",
        "command": command,
        "machine": machine,
        "results": rows,
        "epoch": epoch,
    }
    lines = [
        "# The yield log: what it costs per batch",
        "",
        f"`{command}` on {os.cpu_count()} cores (shared, load average {machine['load_average']}); medians of "
        f"{args.rounds} rounds.",
        "",
        "| case | µs |",
        "|---|---:|",
        *(f"| {row['case']} | {row['us']} |" for row in rows),
        "",
        f"An epoch of {batches} batches of 16 (ShardLoader, 0 workers, WAV), rounds alternated: "
        f"{epoch['unset_ms_per_batch']} ms a batch unset, {epoch['set_ms_per_batch']} ms set "
        f"(ratio {epoch['ratio']}).",
    ]
    write_results(args.out, "yield_log", report, "\n".join(lines) + "\n")
    print(f"wrote {args.out / 'yield_log.json'} and {args.out / 'yield_log.md'}")


if __name__ == "__main__":
    main()
