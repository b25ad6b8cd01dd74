"""What moving a batch from a DataLoader worker to the training process costs, against
keeping it in one process.

Run ``python benchmarks/transport.py [--runs 7] [--batches 200]``. A batch here is the audio of 16 padded 5 s
16 kHz utterances: float32 ``(16, 1, 81920)``, 5 MiB. Cases, each a median (min-max) over ``--runs`` runs:

- a private block, reused (what ``ShardDataset`` does with ``num_workers=0`` once the trainer drops a batch),
  and a fresh private block per batch: allocate and write every byte;
- a shared-memory block per batch, as a DataLoader worker must allocate it (torch's ``_new_shared``, what
  its default collate uses): create, write, free;
- a 1-worker DataLoader whose worker yields such blocks: CPU milliseconds per batch in the worker and in the
  training process, which reads one float per 4 KiB page (as a copy to the GPU touches every page);
- the same with the blocks shardio's workers reuse once the trainer drops a batch
  (``shardio.reading.blocks``).

Writes ``benchmarks/results/transport.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardio.bench.measure import cpu_seconds, machine_facts
from shardio.bench.report import write_results
from shardio.reading import blocks

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SHAPE = (16, 1, 81920)
NBYTES = int(np.prod(SHAPE)) * 4
PAGE = 4096


def _ms(seconds: list[float], batches: int) -> dict[str, Any]:
    per_batch = [1e3 * s / batches for s in seconds]
    return {
        "median": round(statistics.median(per_batch), 3),
        "min": round(min(per_batch), 3),
        "max": round(max(per_batch), 3),
    }


def in_process(make: Callable[[], np.ndarray], batches: int) -> float:
    """CPU seconds to make and fully write ``batches`` blocks."""
    started = time.process_time()
    for _ in range(batches):
        block = make()
        block.fill(1.0)
        del block
    return time.process_time() - started


def _shared_tensor() -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(NBYTES)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, SHAPE)


def _shared() -> np.ndarray:
    return _shared_tensor().numpy()


class _Blocks(IterableDataset):
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _ in range(self.batches):
            block = _shared_tensor()
            block.numpy().fill(1.0)
            yield {"audio": block}  # the shared tensor itself: torch.from_numpy of it would be copied again


class _PooledBlocks(_Blocks):
    """As shardio's workers do: batches written into blocks reused once the trainer drops them
    (shardio.reading.blocks)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for _ in range(self.batches):
            block = blocks.take(NBYTES)
            audio = (
                _shared_tensor()
                if block is None
                else torch.empty(0, dtype=torch.float32).set_(block.untyped_storage(), 0, SHAPE)
            )
            audio.numpy().fill(1.0)
            yield blocks.outgoing({"audio": audio})


def across_processes(batches: int, pooled: bool = False) -> tuple[float, float]:
    """(CPU seconds of the worker, of the training process) to move ``batches`` blocks
    through a DataLoader."""
    dataset = _PooledBlocks(batches) if pooled else _Blocks(batches)
    loader = DataLoader(dataset, batch_size=None, num_workers=1, persistent_workers=True)
    for _ in loader:  # start the worker
        break
    main_before, total_before = time.process_time(), cpu_seconds()
    for batch in loader:
        float(batch["audio"].reshape(-1)[:: PAGE // 4].sum())
    main = time.process_time() - main_before
    return cpu_seconds() - total_before - main, main


def measure(runs: int, batches: int) -> list[dict[str, Any]]:
    """Every case, ``runs`` times interleaved."""
    pool = np.empty(SHAPE, np.float32)
    timings: dict[str, list[float]] = {
        name: []
        for name in ("reused", "fresh", "shared", "worker", "trainer", "pooled worker", "pooled trainer")
    }
    for _ in range(runs):
        timings["reused"].append(in_process(lambda: pool, batches))
        timings["fresh"].append(in_process(lambda: np.empty(SHAPE, np.float32), batches))
        timings["shared"].append(in_process(_shared, batches))
        worker, trainer = across_processes(batches)
        timings["worker"].append(worker)
        timings["trainer"].append(trainer)
        worker, trainer = across_processes(batches, pooled=True)
        timings["pooled worker"].append(worker)
        timings["pooled trainer"].append(trainer)
    labels = {
        "reused": "private block, reused (num_workers=0 after the trainer drops a batch)",
        "fresh": "private block, fresh per batch",
        "shared": "shared-memory block per batch (a worker's), create + write + free",
        "worker": "1-worker DataLoader: the worker (shared block, write, send)",
        "trainer": "1-worker DataLoader: the training process (receive, read every page, free)",
        "pooled worker": "1-worker DataLoader, reused blocks (shardio.reading.blocks): the worker (write, "
        "send)",
        "pooled trainer": "1-worker DataLoader, reused blocks: the training process (receive, read, release)",
    }
    return [
        {
            "case": labels[name],
            "ms_per_batch": _ms(values, batches),
            "us_per_page": round(1e6 * statistics.median(values) / batches / (NBYTES / PAGE), 3),
        }
        for name, values in timings.items()
    ]


def markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown report."""
    machine = report["machine"]
    intro = (
        f"`{report['command']}` on {machine['cpu']}, {machine['cores']} cores; Python {machine['python']}, "
        f"torch {machine['torch']}. A batch: float32 {SHAPE}, {NBYTES / 2**20:.0f} MiB; CPU milliseconds per "
        f"batch, median (min-max) of {report['runs']} runs of {report['batches']} batches."
    )
    lines = [
        "# Moving a batch between processes",
        "",
        intro,
        "",
        "| case | CPU ms per batch | µs per 4 KiB page |",
        "|---|---:|---:|",
    ]
    for row in report["results"]:
        ms = row["ms_per_batch"]
        lines.append(
            f"| {row['case']} | {ms['median']:.2f} ({ms['min']:.2f}-{ms['max']:.2f}) "
            f"| {row['us_per_page']:.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Measure and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where transport.json / transport.md go")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = {
        "command": "python benchmarks/transport.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "machine": machine_facts(),
        "runs": args.runs,
        "batches": args.batches,
        "results": measure(args.runs, args.batches),
    }
    text = markdown(report)
    write_results(args.out, "transport", report, text)
    print(text)


if __name__ == "__main__":
    main()
