"""The reading half of ``benchmarks/peers.py``: each peer's batches (16 or by duration, 0 or 2 workers, FLAC
and WAV) timed in alternated rounds, its exact resume and its batches per rank; Markdown tables and a plot."""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import peer_reading
from peer_kill import killed
from peer_reading import RANKS, READERS, resume

CONFIGS = [(size, workers) for size in (16, None) for workers in (0, 2)]


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def label(size: int | None, workers: int) -> str:
    return f"{size if size else f'<= {peer_reading.MAX_SECONDS:.0f} s'} / {workers} workers"


def read_figures(outs: dict[str, dict[str, Path]], samples: int, rounds: int) -> dict[str, Any]:
    """``outs[format][peer]``: its packed corpus. Per format, peer and configuration: medians of wall, CPU and
    time to the first batch; None where the peer offers no such batching."""
    runs: list[tuple[str, str, int | None, int]] = [
        (fmt, peer, size, workers) for fmt in outs for peer in outs[fmt] for size, workers in CONFIGS
    ]
    times: dict[tuple[str, str, int | None, int], list[tuple[float, float, float]]] = {
        run: [] for run in runs
    }
    for number in range(rounds + 1):  # round 0 warms up
        turn = number * 7 % len(runs)
        for run in runs[turn:] + runs[:turn]:
            fmt, peer, size, workers = run
            multiprocessing.set_start_method("fork", force=True)  # LitData's optimize sets spawn
            wall, cpu = time.perf_counter(), cpu_seconds()
            batches = READERS[peer](outs[fmt][peer], size, workers)
            if batches is None:
                continue
            first = None
            count = 0
            for keys in batches:
                first = first if first is not None else time.perf_counter() - wall
                count += len(keys)
            assert count == samples, (run, count, samples)
            if number:
                times[run].append((time.perf_counter() - wall, cpu_seconds() - cpu, first or 0.0))
    figures: dict[str, Any] = {}
    for (fmt, peer, size, workers), values in times.items():
        row = figures.setdefault(fmt, {}).setdefault(peer, {})
        if not values:
            row[label(size, workers)] = None
            continue
        wall, cpu, first = (statistics.median(v[i] for v in values) for i in range(3))
        row[label(size, workers)] = dict(
            wall=wall, cpu=cpu, first_batch=first, per_cpu_s=samples / cpu, per_wall_s=samples / wall
        )
    return figures


def traits(outs: dict[str, Path], samples: int) -> dict[str, Any]:
    """Per peer: exact resume after 3 batches of 3 with 0 and 2 workers (the keys read, then those read on
    from the saved state in new objects, against an unbroken epoch of the same loader), the same after a
    SIGKILL mid-epoch (:func:`peer_kill.killed`), and batches of 3 per rank at world 2 and 8."""
    found: dict[str, Any] = {}
    for peer, out in outs.items():
        multiprocessing.set_start_method("fork", force=True)
        found[peer] = dict(
            resume={}, killed={}, ranks={str(world): RANKS[peer](out, 3, world) for world in (2, 8)}
        )
        for workers in (0, 2):
            found[peer]["killed"][str(workers)] = killed(peer, out, 3, workers)
            resumed = resume(peer, out, 3, 3, workers)
            found[peer]["resume"][str(workers)] = (
                None
                if resumed is None
                else dict(
                    before=len(resumed[1]), after=len(resumed[2]), exact=resumed[1] + resumed[2] == resumed[0]
                )
            )
    return found


def markdown(report: dict[str, Any]) -> list[str]:
    lines = []
    for fmt, peers in report["reads"].items():
        configs = [label(size, workers) for size, workers in CONFIGS]
        lines += [
            f"### Reading {fmt}: samples per CPU-second (per wall-second; first batch after, s)",
            "",
            f"| peer | {' | '.join(configs)} |",
            f"|---|{'---:|' * len(configs)}",
        ]
        for peer, row in peers.items():
            cells = [
                "not offered"
                if row[c] is None
                else f"{row[c]['per_cpu_s']:.0f} ({row[c]['per_wall_s']:.0f}; {row[c]['first_batch']:.2f})"
                for c in configs
            ]
            lines.append(f"| {peer} | {' | '.join(cells)} |")
        lines.append("")
    lines += costs(report)
    lines += [
        "### Exact resume and batches per rank (batches of 3)",
        "",
        "| peer | resumed after 3 batches, 0 workers | 2 workers | batches per rank, world 2 | world 8 |",
        "|---|---|---|---|---|",
    ]
    for peer, t in report["traits"].items():
        cells = []
        for workers in ("0", "2"):
            r = t["resume"][workers]
            verdict = "" if r is None else "exact" if r["exact"] else "NOT the unbroken epoch's keys"
            cells.append("no mechanism" if r is None else f"{r['before']} + {r['after']} samples: {verdict}")
        lines.append(f"| {peer} | {' | '.join(cells)} | {t['ranks']['2']} | {t['ranks']['8']} |")
    lines += [
        "",
        "### Resume after SIGKILL (batches of 3, the state saved every 5 batches; benchmarks/peer_kill.py)",
        "",
        "| peer | 0 workers | 2 workers |",
        "|---|---|---|",
    ]
    for peer, t in report["traits"].items():
        lines.append(f"| {peer} | {killed_cell(t['killed']['0'])} | {killed_cell(t['killed']['2'])} |")
    return [*lines, ""]


def costs(report: dict[str, Any]) -> list[str]:
    """Per format: CPU milliseconds a sample in batches of 16 with 0 workers, beside what soundfile alone
    takes to decode the same bytes from memory (the floor of the peers that decode with it), and what
    decoding alone costs by soundfile and by shardio's decoder (on other clips too, where measured)."""
    lines = [
        "### Decoding alone: CPU ms an audio second (ms a file), bytes in memory, batches of 16 padded",
        "",
        "| files | count | s each | rates | soundfile from BytesIO | shardio's decoder |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for name, floor in report.get("floors", {}).items():
        files, seconds = floor["files"], floor["seconds"]
        lines.append(
            f"| {name} | {files} | {seconds / files:.2f} | {', '.join(map(str, floor['rates']))} | "
            + " | ".join(
                f"{1000 * floor[key] / seconds:.3f} ({1000 * floor[key] / files:.3f})"
                for key in ("cpu", "shardio_cpu")
            )
            + " |"
        )
    lines.append("")
    for fmt, peers in report["reads"].items():
        floor = report["floors"][fmt]
        files = floor["files"]
        lines += [
            f"### Where the CPU goes, {fmt}: ms a sample, batches of 16, 0 workers",
            "",
            "| peer | ms a sample | above soundfile alone | above its decoder alone |",
            "|---|---:|---:|---:|",
        ]
        for peer, row in peers.items():
            cell = row[label(16, 0)]
            if cell is not None:
                per = 1000 * cell["cpu"] / files
                own = floor["shardio_cpu" if peer == "shardio" else "cpu"]
                lines.append(
                    f"| {peer} | {per:.3f} | {per - 1000 * floor['cpu'] / files:+.3f} | "
                    f"{per - 1000 * own / files:+.3f} |"
                )
        lines.append("")
    return lines


def killed_cell(found: dict[str, Any] | None) -> str:
    if found is None:
        return "no mechanism"
    where = (
        "ended before the kill"
        if found["ended_before_kill"]
        else f"killed after {found['killed_after']} batches"
    )
    verdict = (
        "exact"
        if found["exact"]
        else f"NOT exact: {found['repeated']} repeated, {found['skipped']} skipped of {found['samples']}"
    )
    return f"{where}, resumed from batch {found['checkpoint']}: {verdict}"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = list(report["reads"])
    figure, axes = plt.subplots(1, len(formats), figsize=(6 * len(formats), 4), squeeze=False)
    configs = [label(size, workers) for size, workers in CONFIGS]
    for axis, fmt in zip(axes[0], formats, strict=True):
        peers = report["reads"][fmt]
        width = 0.8 / len(peers)
        for index, (peer, row) in enumerate(peers.items()):
            values = [0 if row[c] is None else row[c]["per_cpu_s"] for c in configs]
            axis.bar([i + index * width for i in range(len(configs))], values, width, label=peer)
        axis.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))], configs, fontsize=7)
        axis.set_title(f"{fmt}: samples per CPU-second (batch / workers)")
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"python benchmarks/peers.py, {report['date']}, {report['corpus']}", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
