"""A/B with workers: this checkout's loaders against another commit's, in separate processes, alternated.

Run ``python benchmarks/ab_workers.py --base COMMIT [DATASET] [--rounds 8] [--seconds 1.0]``.
:mod:`benchmarks.ab` runs both versions in one process, which cannot hold worker processes of two versions;
this script starts one process per version per round (the base commit's ``shardio`` package exported with
``git archive``, imported ahead of any installed one; workers start by ``fork``, so they run the same
version), and each round alternates which version goes first. A process measures one loader, after one
warm-up epoch, for at least ``--seconds`` of wall time, and reports CPU microseconds per sample (its own and
its workers', from ``/proc``), batch 16, the public API only:

- ``ShardLoader, 2 workers`` and ``ShardLoader, 0 workers`` (persistent workers): their ratio, samples per
  CPU-second with 2 workers over 0 workers, is the settled target (>= 0.85);
- ``DataLoader, 2 workers`` (``batch_size=None``, the dataset batches).

Epochs are as long as the dataset: a small one weighs the per-epoch work (a worker's plan for the epoch, read
from the node's plan files under a lock) more than a real corpus would. Without DATASET it reads the WAV
dataset that ``python benchmarks/bench.py`` packs (``bench-out/datasets/wav16k-none``).

Writes ``benchmarks/results/ab_workers.json`` and ``.md`` (or under ``--results``): per loader and version the
median microseconds per sample, the median per-round ratio (base over this checkout: above 1, this checkout is
cheaper) and in how many rounds this checkout was cheaper.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ab import export_base  # benchmarks/ is the script's directory, first on sys.path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATASET = REPO / "bench-out" / "datasets" / "wav16k-none"
LOADERS = ("ShardLoader, 2 workers", "ShardLoader, 0 workers", "DataLoader, 2 workers")
SETTLED = 0.85  # ShardLoader's samples per CPU-second with workers, at least this share of 0 workers'


def child(package_root: str, dataset: str, name: str, seconds: float) -> float:
    """In a fresh process: CPU microseconds per sample of loader ``name`` (one of :data:`LOADERS`), with the
    ``shardio`` under ``package_root``."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in repr(finder).lower()]
    sys.path.insert(0, package_root)
    import multiprocessing

    import torch.utils.data

    import shardio
    from shardio.bench.measure import cpu_seconds  # the version's own (unchanged since 86f47bf)

    assert Path(shardio.__file__).resolve().is_relative_to(Path(package_root).resolve()), shardio.__file__
    fork = multiprocessing.get_context("fork")
    workers = 2 if "2 workers" in name else 0
    source = shardio.ShardDataset(dataset, batch_size=16)
    if name.startswith("ShardLoader"):
        batches: Any = shardio.ShardLoader(
            source, num_workers=workers, persistent_workers=workers > 0, multiprocessing_context=fork
        )
    else:
        batches = torch.utils.data.DataLoader(
            source,
            batch_size=None,
            num_workers=workers,
            persistent_workers=workers > 0,
            multiprocessing_context=fork,
        )

    def epoch() -> int:
        # bench.cases.count_batches does this since 86f47bf's private _count: a base commit may lack it
        samples = 0
        for batch in batches:
            samples += len(batch["keys"])
            float(batch["audio"].reshape(-1)[::1024].sum())  # a page in 4 KiB touched, as a copy to a GPU
        return samples

    epoch()  # a warm-up epoch
    used, started, samples = cpu_seconds(), time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        samples += epoch()
    return (cpu_seconds() - used) / samples * 1e6


def run_version(package_root: str, dataset: str, name: str, seconds: float) -> float:
    """Loader ``name``'s CPU microseconds per sample with the ``shardio`` under ``package_root``, measured in
    a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            package_root,
            dataset,
            "--loader",
            name,
            "--seconds",
            str(seconds),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(dataset: str, base_root: str, *, rounds: int, seconds: float) -> dict[str, Any]:
    """``rounds`` rounds: in each, every loader measured in one process per version, alternating which
    version goes first."""
    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    roots = {"base": base_root, "this": str(REPO)}
    for number in range(rounds):
        for version in runs:
            runs[version].append({})
        for name in LOADERS:
            for version in ("base", "this") if number % 2 == 0 else ("this", "base"):
                runs[version][-1][name] = run_version(roots[version], dataset, name, seconds)
    loaders = {}
    for name in LOADERS:
        base = [run[name] for run in runs["base"]]
        this = [run[name] for run in runs["this"]]
        ratios = [b / t for b, t in zip(base, this, strict=True)]
        loaders[name] = {
            "base_us_per_sample": statistics.median(base),
            "this_us_per_sample": statistics.median(this),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "this_cheaper_rounds": sum(ratio > 1 for ratio in ratios),
        }
    settled = {
        version: statistics.median(
            run["ShardLoader, 0 workers"] / run["ShardLoader, 2 workers"] for run in runs[version]
        )
        for version in runs
    }
    return {"rounds": rounds, "seconds": seconds, "loaders": loaders, "settled": settled, "runs": runs}


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    lines = [
        "# A/B with workers (`python benchmarks/ab_workers.py`)",
        "",
        f"`{report['command']}`: {report['rounds']} rounds, one process per version per round, alternated; "
        f"dataset `{report['dataset']}` ({report['samples']} samples); base {report['base']}, this checkout "
        f"{report['this']}. CPU microseconds per sample (the process and its workers), medians; ratio: "
        "base over this checkout, per round (above 1: this checkout is cheaper).",
        "",
        "| loader | base us/sample | this us/sample | ratio (min-max) | this cheaper in |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in report["loaders"].items():
        lines.append(
            f"| {name} | {row['base_us_per_sample']:.1f} | {row['this_us_per_sample']:.1f} | "
            f"{row['ratio_median']:.3f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) | "
            f"{row['this_cheaper_rounds']} of {report['rounds']} |"
        )
    settled = report["settled"]
    lines += [
        "",
        f"ShardLoader with 2 workers, samples per CPU-second over 0 workers' (target >= {SETTLED}): "
        f"base {settled['base']:.3f}, this checkout {settled['this']:.3f}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", default=str(DEFAULT_DATASET))
    parser.add_argument("--base", help="the commit to compare against (e.g. HEAD~3, a hash)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.0, help="wall seconds per loader per process")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--loader", choices=LOADERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dataset, args.loader, args.seconds)))
        return 0
    if not args.base:
        parser.error("--base is required")
    with tempfile.TemporaryDirectory() as tmp:
        base = export_base(args.base, Path(tmp), name="shardio")
        report = compare(args.dataset, tmp, rounds=args.rounds, seconds=args.seconds)
    this = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=7"],  # -dirty: uncommitted changes measured too
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    samples = json.loads((Path(args.dataset) / "index.json").read_text(encoding="utf-8"))["samples"]
    named = "" if Path(args.dataset) == DEFAULT_DATASET else f" {Path(args.dataset).name}"  # no local paths
    command = (
        f"python benchmarks/ab_workers.py --base {args.base}{named} --rounds {args.rounds} "
        f"--seconds {args.seconds:g}"
    )
    report.update(command=command, dataset=Path(args.dataset).name, base=base, this=this, samples=samples)
    from shardio.bench.report import write_results  # here: a child imports the version it measures

    text = markdown(report)
    write_results(args.results, "ab_workers", report, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
