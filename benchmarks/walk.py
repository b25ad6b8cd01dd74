"""The walk: how many shardio source files a batch, an epoch's start and a resume pass through.

Run ``python benchmarks/walk.py``. A contributor reading the code follows the same path as the interpreter:
the fewer files a batch enters and the fewer times execution switches between them, the shorter the walk.
``sys.setprofile`` records every Python call into a shardio module; for each stretch of work this
script counts the distinct shardio files entered and the switches (consecutive events in different files).

The dataset: 4 ``.tar`` shards of 16 WAV samples each (8 kHz, 0.1-0.5 s), ``batch_size=4``. Stretches:

- ``set_epoch(0)`` and the first batch, with 0 workers;
- each later batch (the median of batches 2-9), with 0 workers;
- ``load_state_dict(state)`` on a fresh dataset, with a state saved mid-epoch;
- in a fork DataLoader worker (1 worker): the first batch and a later batch (the median of batches 2-9),
  stretches cut where torch's fetcher returns a batch.

Writes ``benchmarks/results/walk.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

import shardio
from shardio import ShardDataset, ShardWriter
from shardio.bench.report import write_results

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PACKAGE = str(Path(shardio.__file__).resolve().parent)
SHARDS, PER_SHARD, RATE, BATCH = 4, 16, 8000, 4


class Walk:
    """A profile hook that records the shardio file of each call event, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(PACKAGE):
                self.events.append(name[len(PACKAGE) + 1 :])

    def cut(self) -> list[str]:
        """The events recorded since the last cut."""
        taken, self.events = self.events, []
        return taken


def figures(events: list[str]) -> dict[str, int]:
    """Distinct files entered and switches between files in one stretch of events."""
    switches = sum(1 for before, after in zip(events, events[1:], strict=False) if before != after)
    return {"files": len(set(events)), "switches": switches}


def median_figures(stretches: list[list[str]]) -> dict[str, float]:
    """The median files and switches over several stretches."""
    each = [figures(stretch) for stretch in stretches]
    return {key: statistics.median(f[key] for f in each) for key in ("files", "switches")}


def make_dataset(directory: Path) -> None:
    """Write the benchmark's shards and index into ``directory``."""
    rng = np.random.default_rng(0)
    writer = ShardWriter(directory)
    for shard in range(SHARDS):
        if shard:
            writer.end_shard()
        for i in range(PER_SHARD):
            key = f"s{shard}_{i:03d}"
            frames = int(rng.uniform(0.1, 0.5) * RATE)
            buffer = io.BytesIO()
            soundfile.write(buffer, rng.uniform(-0.5, 0.5, frames), RATE, subtype="PCM_16", format="WAV")
            meta = json.dumps({"text": key}).encode()
            writer.write(
                key,
                {"wav": buffer.getvalue(), "json": meta},
                audio_ext="wav",
                num_frames=frames,
                sample_rate=RATE,
                channels=1,
            )
    writer.close()


def profiled(walk: Walk, action: Callable[[], Any]) -> list[str]:
    """The events of one call of ``action``."""
    walk.cut()
    sys.setprofile(walk)
    try:
        action()
    finally:
        sys.setprofile(None)
    return walk.cut()


def in_process(root: Path) -> dict[str, Any]:
    """Stretches with 0 workers, and a resume."""
    walk = Walk()
    dataset = ShardDataset(root, batch_size=BATCH, seed=0)
    batches: Iterator[Any] = iter(())

    def start() -> None:
        nonlocal batches
        dataset.set_epoch(0)
        batches = iter(dataset)
        next(batches)

    first = profiled(walk, start)
    later = [profiled(walk, lambda: next(batches)) for _ in range(8)]
    state = dataset.state_dict()
    fresh = ShardDataset(root, batch_size=BATCH, seed=0)
    resume = profiled(walk, lambda: fresh.load_state_dict(state))
    return {
        "set_epoch and first batch": figures(first),
        "later batch (median)": median_figures(later),
        "load_state_dict": figures(resume),
    }


def worker_walk(_: int) -> None:
    """A DataLoader worker's init: profile every event, cutting where torch's fetcher returns a batch."""
    walk = Walk()
    stretches: list[list[str]] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        walk(frame, event, arg)
        if event == "return" and frame.f_code.co_name == "fetch" and "_utils" in frame.f_code.co_filename:
            stretches.append(walk.cut())
            if len(stretches) == 9:
                sys.setprofile(None)
                out = {
                    "first batch": figures(stretches[0]),
                    "later batch (median)": median_figures(stretches[1:]),
                }
                Path(WORKER_OUT).write_text(json.dumps(out), encoding="utf-8")

    sys.setprofile(hook)


WORKER_OUT = ""


def in_worker(root: Path, out: Path) -> dict[str, Any]:
    """Stretches in one fork DataLoader worker."""
    import torch.utils.data

    global WORKER_OUT
    WORKER_OUT = str(out)
    dataset = ShardDataset(root, batch_size=BATCH, seed=0)
    dataset.set_epoch(0)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=1,
        worker_init_fn=worker_walk,
        multiprocessing_context=multiprocessing.get_context("fork"),
    )
    for _ in loader:
        pass
    return json.loads(out.read_text(encoding="utf-8"))


def main() -> None:
    """Measure every stretch and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        make_dataset(root)
        report = {"0 workers": in_process(root), "fork worker": in_worker(root, Path(tmp) / "worker.json")}
    lines = [
        "# The walk: shardio files entered and switches between them (`python benchmarks/walk.py`)",
        "",
        f"{SHARDS} `.tar` shards of {PER_SHARD} WAV samples, `batch_size={BATCH}`.",
        "",
        "| where | stretch | files entered | switches |",
        "| --- | --- | ---: | ---: |",
    ]
    for where, stretches in report.items():
        for stretch, value in stretches.items():
            lines.append(f"| {where} | {stretch} | {value['files']:g} | {value['switches']:g} |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.out, "walk", report, text)


if __name__ == "__main__":
    main()
