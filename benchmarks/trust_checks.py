"""What the trust-boundary checks on saved states and outputs cost (docs/security.md, "What each check
costs").

Run ``python benchmarks/trust_checks.py [--runs 7]``. Cases, each a median of ``--runs`` runs:

- reading a state file (``shardio trace/quarantine/remix --state``): the bounded read and the scan of its
  nesting and values (:func:`shardio.storage.statefiles.load_state_file`) against a bare ``json.loads`` of the
  same bytes, for a fresh state, one with a quarantine of 100,000 keys, and one of 1,000,000 keys;
- checking a state's quarantine entries on load (`check_extra`): each id's key
  (and corpus) looked up in the index, per quarantined id, on an index of 1,000,000 keys;
- checking an output path before it is written (:func:`shardio.storage.files.check_output_file`): one stat.

Writes ``benchmarks/results/trust_checks.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardio.bench.report import write_results
from shardio.planning.exclusions import check_extra
from shardio.shards.keys import Keys
from shardio.storage.files import check_output_file
from shardio.storage.statefiles import load_state_file

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SAMPLES = 1_000_000


def median_s(function: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def state_with(keys: Keys, count: int) -> dict[str, Any]:
    """A state (the fields a loader writes) holding one carried quarantine entry of ``count`` samples."""
    ids = list(range(0, SAMPLES, SAMPLES // count))[:count] if count else []
    entry = {
        "epoch": 0,
        "segment": 1,
        "ids": ids,
        "keys": [keys[i] for i in ids],
        "steps": None,
        "carry": True,
        "from_step": 10,
        "consumed": [],
    }
    extra = {"quarantine": [entry]} if count else {}
    return {
        "format": "shardio-state",
        "version": 1,
        "epoch": 0,
        "seed": 0,
        "index": "0" * 32,
        "options": {"batch_size": None, "max_duration": 600.0, "shuffle": True, "shuffle_shards": 16},
        "world_size": 8,
        "history": [[8, 100]],
        "start": 0,
        "yielded": 0,
        "worker": 0,
        "num_workers": 1,
        "extra": extra,
        "options_fingerprint": "0" * 16,
    }


def main() -> None:
    """Measure every case and write the reports."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    keys = Keys.of([f"speaker{i % 2000:04d}/utterance-{i:09d}" for i in range(SAMPLES)])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in (0, 100_000, 1_000_000):
            path = os.path.join(scratch, f"state-{count}.json")
            Path(path).write_text(json.dumps(state_with(keys, count)))
            size = os.path.getsize(path)
            checked = median_s(lambda path=path: load_state_file(path), args.runs)  # type: ignore[misc]
            bare = median_s(
                lambda path=path: json.loads(Path(path).read_bytes()),  # type: ignore[misc]
                args.runs,
            )
            rows.append(
                {
                    "case": f"read a state file, quarantine of {count:,} keys",
                    "bytes": size,
                    "checked_ms": round(checked * 1e3, 3),
                    "json_loads_ms": round(bare * 1e3, 3),
                }
            )
        extra = state_with(keys, 100_000)["extra"]
        per_id = median_s(lambda: check_extra(extra, SAMPLES, keys.__getitem__, lambda i: None), args.runs)
        rows.append(
            {
                "case": "check quarantine entries on load, per quarantined id",
                "bytes": None,
                "checked_ms": round(per_id / 100_000 * 1e3, 6),
                "json_loads_ms": None,
            }
        )
        target = os.path.join(scratch, "out.json")
        Path(target).write_bytes(b"{}")

        def check_many() -> None:
            for _ in range(10_000):
                check_output_file(target)

        stat_s = median_s(check_many, args.runs) / 10_000
        rows.append(
            {
                "case": "check an output path before writing it",
                "bytes": None,
                "checked_ms": round(stat_s * 1e3, 6),
                "json_loads_ms": None,
            }
        )
    for row in rows:
        print(row, flush=True)
    report = {
        "benchmark": "trust_checks",
        "command": "python benchmarks/trust_checks.py",
        "runs": args.runs,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average": round(os.getloadavg()[0], 1),
        },
        "results": rows,
    }
    lines = [
        "# Trust-boundary checks: what they cost",
        "",
        (
            f"`python benchmarks/trust_checks.py` on {os.cpu_count()} cores (shared, load average "
            f"{report['machine']['load_average']}); medians of {args.runs} runs."
        ),
        "",
        "| case | file bytes | checked, ms | bare json.loads, ms |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['case']} | {r['bytes'] or ''} | {r['checked_ms']} | {r['json_loads_ms'] or ''} |" for r in rows
    ]
    write_results(args.out, "trust_checks", report, "\n".join(lines) + "\n")
    print(f"wrote {args.out / 'trust_checks.json'} and {args.out / 'trust_checks.md'}")


if __name__ == "__main__":
    main()
