"""A/B: this checkout's loader against another commit's, interleaved in one process, on the same shards.

Run ``python benchmarks/ab.py --base COMMIT [DATASET] [--rounds 14] [--seconds 0.5]``. The base commit's
``shardio`` package is exported with ``git archive`` into a temporary directory as ``shardio_base`` (the
package imports itself relatively), so both versions run in one process, round by round, and each round
alternates which goes first. On a shared machine whose speed drifts within seconds, the ratio of two
adjacent measurements is far steadier than two separate runs. A version's turn iterates its
``ShardDataset`` (0 workers, batch 16) for at least ``--seconds`` of CPU time and touches one float per
4 KiB page of each batch, as a copy to the GPU would. Without DATASET it reads the WAV dataset that
``python benchmarks/bench.py`` packs (``bench-out/datasets/wav16k-none``).

Both versions share one process's heap, so a change in how much memory a version allocates and frees can move
the other's costs too: glibc's adaptive mmap threshold rises after a large block is freed, and one version's
frees then spare the other's mid-sized arrays their page faults. Confirm such a change with separate
processes, one per version, alternated (an unbatched-mode memory reuse measured 1.19x here and 0.85x so).

Writes ``benchmarks/results/ab.json`` and ``.md`` (or under ``--results``): microseconds per sample of each
version (median, min-max) and the median of the per-round speed-ups.
"""

from __future__ import annotations

import argparse
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATASET = REPO / "bench-out" / "datasets" / "wav16k-none"


def export_base(commit: str, into: Path, name: str = "shardio_base") -> str:
    """Unpack ``commit``'s ``shardio`` package as ``into/NAME``; returns the commit's short hash."""
    archive = subprocess.run(
        ["git", "archive", commit, "shardio"], cwd=REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    if name != "shardio":
        (into / "shardio").rename(into / name)
    return subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def _epoch(dataset: Any) -> int:
    samples = 0
    for batch in dataset:
        samples += len(batch["keys"])
        float(batch["audio"].reshape(-1)[::1024].sum())
    return samples


def _turn(dataset: Any, seconds: float) -> float:
    """CPU microseconds per sample over whole epochs lasting at least ``seconds`` of CPU time."""
    started, samples = time.process_time(), _epoch(dataset)
    while time.process_time() - started < seconds:
        samples += _epoch(dataset)
    return (time.process_time() - started) / samples * 1e6


def compare(dataset: str, base_package: str, *, rounds: int, seconds: float) -> dict[str, Any]:
    """Per-round CPU µs per sample of ``shardio`` (this checkout) and ``base_package``, alternating order."""
    import torch

    torch.set_num_threads(1)
    versions = {"base": importlib.import_module(base_package), "this": importlib.import_module("shardio")}
    datasets = {
        name: module.ShardDataset(dataset, batch_size=16, seed=0) for name, module in versions.items()
    }
    for loader in datasets.values():
        _epoch(loader)  # warm: files mapped, memory pooled
    runs: dict[str, list[float]] = {"base": [], "this": []}
    for index in range(rounds):
        for name in ("base", "this") if index % 2 == 0 else ("this", "base"):
            runs[name].append(_turn(datasets[name], seconds))
    speedups = [b / t for b, t in zip(runs["base"], runs["this"])]
    return {
        "us_per_sample": {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
            for name, v in runs.items()
        },
        "speedup": {
            "median": statistics.median(speedups),
            "min": min(speedups),
            "max": max(speedups),
            "runs": speedups,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dataset", nargs="?", default=str(DEFAULT_DATASET))
    parser.add_argument("--base", required=True, help="the commit to compare against (e.g. HEAD~3, a hash)")
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU seconds per version per round")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if not (Path(args.dataset) / "index.json").exists():
        parser.error(
            f"no shardio dataset at {args.dataset}: run 'python benchmarks/bench.py' first, or name one"
        )
    sys.path.insert(0, str(REPO))
    from shardio.bench.measure import machine_facts
    from shardio.bench.report import write_results

    with tempfile.TemporaryDirectory() as scratch:
        base = export_base(args.base, Path(scratch))
        sys.path.insert(0, scratch)
        try:
            result = compare(args.dataset, "shardio_base", rounds=args.rounds, seconds=args.seconds)
        finally:
            sys.path.remove(scratch)
            for name in [name for name in sys.modules if name.split(".")[0] == "shardio_base"]:
                del sys.modules[name]
    command = "python benchmarks/ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    dataset = Path(args.dataset).resolve()  # recorded relative to the repository: no machine paths in results
    shown = dataset.relative_to(REPO) if dataset.is_relative_to(REPO) else dataset
    report = {
        "command": command,
        "base": base,
        "dataset": str(shown),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "machine": machine_facts(),
        **result,
    }
    us, up = result["us_per_sample"], result["speedup"]
    rows = "".join(
        f"| {name} | {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f}) |\n"
        for name, v in (("base " + base, us["base"]), ("this checkout", us["this"]))
    )
    text = (
        f"# A/B against {base}\n\n`{command}`; {args.rounds} rounds, alternating order; CPU µs per "
        f"sample, median (min-max).\n\n| version | µs per sample |\n|---|---:|\n{rows}\n"
        f"Speed-up (median of per-round ratios): {up['median']:.3f} ({up['min']:.3f}-{up['max']:.3f})\n"
    )
    write_results(args.results, "ab", report, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
