"""The cost of checking an index's fingerprint at load (issue 46, item 5): ``Index.load`` with the check and
with it switched off, alternated within each round.

Run ``python benchmarks/index_fingerprint.py [--samples 1000000] [--shards 1000] [--rounds 7]``. It writes an
index of ``--samples`` samples in ``--shards`` shards (columns only: nothing reads a shard) into a temporary
directory and measures medians of the wall time of:

- ``Index.load`` on a fresh node cache (the columns file hashed against ``index.json``, as the first load on a
  node does), with and without :func:`~shardio.shards.indexheader.check_fingerprint`;
- ``Index.load`` again (the columns' hash remembered by the node cache: what every later load costs);
- the check alone, on the parsed header.

Writes ``benchmarks/results/index_fingerprint.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import shardio.shards.indexload as indexload
from shardio.bench.report import write_results
from shardio.shards.index import COLUMNS, Index, ShardInfo
from shardio.shards.indexheader import check_fingerprint

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def write_index(root: Path, samples: int, shards: int) -> None:
    """An index of ``samples`` 16 kHz mono WAV samples in ``shards`` equal shards (no shard files)."""
    rng = np.random.default_rng(0)
    per = samples // shards
    columns = {name: np.zeros(per * shards, kind) for name, kind in COLUMNS.items()}
    frames = rng.integers(1000, 30000, per * shards).astype(np.uint32)
    columns.update(
        shard=np.repeat(np.arange(shards, dtype=np.uint32), per),
        num_frames=frames,
        sample_rate=np.full(per * shards, 16000, np.uint32),
        channels=np.ones(per * shards, np.uint8),
        member_size=(frames * 2 + 44).astype(np.uint32),
        frame_size=(frames * 2 + 44).astype(np.uint32),
        member_offset=(np.tile(np.arange(per), shards) * 70000).astype(np.uint32),
    )
    columns["frame_offset"] = columns["member_offset"].astype(np.uint64)
    infos = [ShardInfo(f"s{s:05d}.tar", 70000 * per + 2**20, "0" * 64, per, 1.0) for s in range(shards)]
    keys = [f"utt{i:09d}" for i in range(per * shards)]
    Index(root=str(root), shards=infos, formats=["wav"], columns=columns, _keys=keys).save()


def timed_load(root: Path, checked: bool, fresh: bool) -> float:
    if fresh:
        os.environ["SHARDIO_CACHE_DIR"] = tempfile.mkdtemp(prefix="fingerprint-cache-")
    original = indexload.check_fingerprint
    if not checked:
        indexload.check_fingerprint = lambda header, where: str(header.get("fingerprint"))  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        Index.load(str(root))
        return time.perf_counter() - start
    finally:
        indexload.check_fingerprint = original  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fingerprint-") as directory:
        root = Path(directory) / "data"
        root.mkdir()
        write_index(root, args.samples, args.shards)
        header = json.loads((root / "index.json").read_text())
        times: dict[str, list[float]] = {
            f"{kind}, {way}": [] for kind in ("first load", "later load") for way in ("checked", "unchecked")
        }
        times["the check alone"] = []
        for round_ in range(args.rounds):
            ways = [True, False] if round_ % 2 == 0 else [False, True]
            for checked in ways:
                way = "checked" if checked else "unchecked"
                times[f"first load, {way}"].append(timed_load(root, checked, fresh=True))
                times[f"later load, {way}"].append(timed_load(root, checked, fresh=False))
            start = time.perf_counter()
            check_fingerprint(header, "index.json")
            times["the check alone"].append(time.perf_counter() - start)
        json_bytes = (root / "index.json").stat().st_size
    medians = {name: round(statistics.median(values) * 1000, 2) for name, values in times.items()}
    report: dict[str, Any] = {
        "samples": args.samples,
        "shards": args.shards,
        "rounds": args.rounds,
        "index_json_bytes": json_bytes,
        "median_ms": medians,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
    }
    lines = [
        "# Checking an index's fingerprint at load",
        "",
        f"`python benchmarks/index_fingerprint.py --samples {args.samples} --shards {args.shards} "
        f"--rounds {args.rounds}` ({json_bytes} bytes of index.json; medians, ways alternated per round)",
        "",
        "| what | median ms |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in medians.items()],
        "",
    ]
    text = "\n".join(lines)
    write_results(RESULTS, "index_fingerprint", report, text)
    print(text)


if __name__ == "__main__":
    main()
