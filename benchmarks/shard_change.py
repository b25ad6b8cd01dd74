"""The cost of noticing a local shard rewritten or replaced under a run (``ShardChanged``, issue 41).

Run ``python benchmarks/shard_change.py [--shards 64] [--rounds 15]``. It writes a dataset of ``--shards``
plain ``.tar`` shards of 16 samples (8 kHz WAVs of 0.1-0.5 s) into a temporary directory and measures, in
rounds (the checked and unchecked ways alternated within each round), medians of the CPU time of:

- one shard open as the reader does it (``open_regular`` and a :class:`LocalShard`), with and without the
  first check (``check_unchanged``: one ``fstat`` of the descriptor against the index's load time);
- one sample's bytes read as a view of the shard's map (``LocalShard.view``), with and without the check each
  read makes;
- one sample read whole by a :class:`Reader` (``members``: bytes, tar headers, keys; the check included), and
  one sample of an epoch of ``ShardDataset(batch_size=16)`` (decoded and batched), for scale.

Writes ``benchmarks/results/shard_change.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from shardio import ShardDataset
from shardio.bench.report import write_results
from shardio.reading.reader import Reader
from shardio.shards.index import Index
from shardio.shards.writer import ShardWriter
from shardio.storage.localshard import LocalShard, open_regular

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def write_dataset(root: Path, shards: int) -> Index:
    """``shards`` shards of 16 short WAV samples each in ``root``; their index, loaded."""
    rng = np.random.default_rng(0)
    with ShardWriter(root) as writer:
        for shard in range(shards):
            if shard:
                writer.end_shard()
            for number in range(16):
                frames = int(8000 * rng.uniform(0.1, 0.5))
                buffer = io.BytesIO()
                sf.write(
                    buffer,
                    rng.uniform(-0.3, 0.3, frames).astype(np.float32),
                    8000,
                    format="WAV",
                    subtype="PCM_16",
                )
                writer.write(
                    f"s{shard:04d}_{number:02d}",
                    {"wav": buffer.getvalue()},
                    audio_ext="wav",
                    num_frames=frames,
                    sample_rate=8000,
                    channels=1,
                )
    return Index.load(root)


def per_call_ns(action: Callable[[], object], calls: int) -> float:
    """CPU nanoseconds of this process per call of ``action`` over ``calls`` calls (CPU time, not wall: on a
    shared machine other processes' load would swamp a difference of a microsecond)."""
    start = time.process_time_ns()
    for _ in range(calls):
        action()
    return (time.process_time_ns() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    times: dict[str, list[float]] = {
        name: []
        for name in (
            "open_unchecked",
            "open_checked",
            "view_unchecked",
            "view_checked",
            "sample_members",
            "sample_decoded",
        )
    }
    with tempfile.TemporaryDirectory() as scratch:
        index = write_dataset(Path(scratch), args.shards)
        paths = [index.shard_path(s) for s in range(args.shards)]
        since = index.loaded_ns
        spans = [
            (
                int(index.columns["shard"][i]),
                int(index.columns["frame_offset"][i]),
                int(index.columns["member_size"][i]),
            )
            for i in range(len(index))
        ]

        def opens(checked: bool) -> None:
            for path in paths:
                fd, size = open_regular(path)
                shard = LocalShard(fd, size, since if checked else None)
                shard.check_unchanged(path)
                shard.close()

        def views(handles: list[LocalShard]) -> None:
            for shard, offset, size in spans:
                handles[shard].view(offset, size, "")

        handles = {
            checked: [LocalShard(*open_regular(p), since if checked else None) for p in paths]
            for checked in (False, True)
        }
        reader = Reader(index)
        dataset = ShardDataset(index, batch_size=16, shuffle=False)
        for i in range(len(index)):  # warm: every map made, every page in the page cache
            reader.members(i)
        views(handles[True])
        views(handles[False])
        for round_number in range(args.rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for checked in order:
                name = "checked" if checked else "unchecked"
                times[f"open_{name}"].append(per_call_ns(lambda c=checked: opens(c), 20) / len(paths))
                times[f"view_{name}"].append(
                    per_call_ns(lambda c=checked: views(handles[c]), 20) / len(spans)
                )
            times["sample_members"].append(
                per_call_ns(lambda: [reader.members(i) for i in range(len(index))], 3) / len(index)
            )
            times["sample_decoded"].append(per_call_ns(lambda: [b for b in dataset], 1) / len(index))
        for group in handles.values():
            for handle in group:
                handle.close()
    median = {name: round(statistics.median(values), 1) for name, values in times.items()}
    report: dict[str, Any] = {
        "command": f"python benchmarks/shard_change.py --shards {args.shards} --rounds {args.rounds}",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": list(os.getloadavg()),
        },
        "shards": args.shards,
        "samples": len(spans),
        "median_ns": median,
        "runs_ns": {name: [round(v, 1) for v in values] for name, values in times.items()},
    }
    open_cost = median["open_checked"] - median["open_unchecked"]
    view_cost = median["view_checked"] - median["view_unchecked"]
    text = "\n".join(
        [
            "# Local shard change detection: what the check costs",
            "",
            f"`{report['command']}` on {report['machine']['cpu']} ({report['machine']['cores']} cores, load "
            f"average {report['machine']['load_average'][0]:.1f}: a shared machine; medians of {args.rounds} "
            "rounds of CPU time, the checked and unchecked ways alternated in each round).",
            "",
            f"{len(spans)} samples in {args.shards} plain `.tar` shards, in the page cache.",
            "",
            "| per call (ns) | unchecked | checked | the check |",
            "|---|---|---|---|",
            f"| open a shard (`open_regular` + `LocalShard`) | {median['open_unchecked']:.0f} | "
            f"{median['open_checked']:.0f} | {open_cost:+.0f} |",
            f"| one sample's bytes (`LocalShard.view`) | {median['view_unchecked']:.0f} | "
            f"{median['view_checked']:.0f} | {view_cost:+.0f} |",
            f"| one sample read whole (`Reader.members`, checked) | | {median['sample_members']:.0f} | "
            f"{100 * view_cost / median['sample_members']:.1f}% of it |",
            "| one sample decoded in a batch of 16 (`ShardDataset`, checked) | | "
            f"{median['sample_decoded']:.0f} | {100 * view_cost / median['sample_decoded']:.1f}% of it |",
            "",
        ]
    )
    write_results(RESULTS, "shard_change", report, text)
    print(text)


if __name__ == "__main__":
    main()
