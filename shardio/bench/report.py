"""Rendering of ``shardio bench`` results: a Markdown report, a PNG chart and the JSON file (the targets they
list are checked in :mod:`shardio.bench.targets`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..storage.files import check_output_file, write_atomic

__all__ = ["chart", "markdown", "write_report", "write_results"]

logger = logging.getLogger(__name__)


def _fig(stat: dict[str, Any], digits: int = 0) -> str:
    return f"{stat['median']:,.{digits}f} ({stat['min']:,.{digits}f}-{stat['max']:,.{digits}f})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(result: dict[str, Any]) -> str:
    """The results as a Markdown report: the targets first, then one table per comparison."""
    machine = result["machine"]
    kernel = machine.get("kernel", "kernel not recorded")
    out = [
        "# shardio bench",
        "",
        (
            f"`{result['command']}` on {machine['cpu']}, {machine['cores']} cores, {kernel} "
            f"(load average at start {machine['load_average_start'][0]:.1f}, at end "
            f"{machine.get('load_average_end', [0])[0]:.1f}); Python {machine['python']}, torch "
            f"{machine['torch']}, numpy {machine['numpy']}, libsndfile "
            f"{machine['libsndfile'].removeprefix('libsndfile-')}, webdataset {machine['webdataset']}. "
            f"Medians of {result['reps']} interleaved rounds (min-max); batch size {result['batch_size']}; "
            f"{'QUICK run: not figures. ' if result['quick'] else ''}{result['seconds']:.0f} s in all."
        ),
        "",
        "## Corpora",
        "",
    ]
    out += _table(
        ["corpus", "source", "format", "samples", "audio h", "shards", ".tar MB", "zstd-3 size"],
        [
            [
                c["name"],
                c["source"],
                c["audio_format"],
                str(c["samples"]),
                f"{c['audio_seconds'] / 3600:.2f}",
                str(c["shards"]),
                f"{c['shard_bytes'] / 1e6:.1f}",
                f"{c['zstd3_size_vs_tar']:.1%}",
            ]
            for c in result["corpora"]
        ],
    )
    out += ["", "## Targets (medians of per-round ratios, same run)", ""]
    out += [
        "Per core = per CPU-second of the loader's processes; ratios of the same round, then the median.",
        "",
    ]
    out += _table(
        ["corpus", "target", "ratio", "needed", "met"],
        [
            [
                t["corpus"],
                t["target"],
                f"{t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f})",
                f"{t['threshold']:.2f}",
                "yes" if t["met"] else "**no**",
            ]
            for t in result["targets"]
        ],
    )
    out += [
        "",
        "## Throughput (end to end: read, decompress, decode, collate)",
        "",
        (
            "Per CPU-s: samples per CPU-second of the loader's processes (main + workers), i.e. per core; "
            "cores used: CPU-seconds per wall second (below the worker count when the machine is shared). "
            "MB: shard bytes (for floors, audio member bytes). Trainer CPU: the share of that CPU spent in "
            "the process that iterates (where a training loop runs). Peak RSS: the process and its workers, "
            "summed."
        ),
        "",
    ]
    out += _table(
        [
            "corpus",
            "case",
            "samples/s (wall)",
            "samples per CPU-s",
            "audio s per CPU-s",
            "MB per CPU-s",
            "cores used",
            "trainer CPU",
            "peak RSS MB",
        ],
        [
            [
                r["corpus"],
                r["case"],
                _fig(r["samples_per_s"]),
                _fig(r["samples_per_cpu_s"]),
                _fig(r["audio_s_per_cpu_s"]),
                _fig(r["mb_per_cpu_s"], 1),
                _fig(r["cores_used"], 2),
                _fig(r["trainer_cpu_share"], 2) if "trainer_cpu_share" in r else "-",
                f"{r['peak_rss_mb']:.0f}",
            ]
            for r in result["throughput"]
        ],
    )
    out += ["", "## Shard compression (read in shard order, 0 workers)", ""]
    out += _table(
        ["codec", "reader", "size vs .tar", "samples/s (wall)", "samples per CPU-s", "MB on disk per CPU-s"],
        [
            [
                r["codec"],
                r["loader"],
                f"{r['size_vs_tar']:.1%}",
                _fig(r["samples_per_s"]),
                _fig(r["samples_per_cpu_s"]),
                _fig(r["mb_per_cpu_s"], 1),
            ]
            for r in result["compression"]
        ],
    )
    out += ["", "## Resume: seconds to the first batch (fresh dataset, load_state_dict, next(iter))", ""]
    out += _table(
        ["position", "loader", "seconds"],
        [
            [f"{r['position']:.0%}", r["loader"], _fig(r["seconds_to_first_batch"], 3)]
            for r in result["resume"]
        ],
    )
    out += [
        "",
        (
            "## Balance: batches and audio per rank (uneven shards: metadata of 24 shards of 10-400 "
            "samples, 1-15 s)"
        ),
        "",
    ]
    out += _table(
        ["world", "loader", "batches per rank", "batch spread", "audio max/min", "idle rank-batches"],
        [
            [
                str(r["world_size"]),
                r["loader"],
                " ".join(map(str, r["batches_per_rank"])),
                str(r["batch_spread"]),
                f"{r['audio_max_over_min']:.2f}",
                str(r["idle_rank_batches"]),
            ]
            for r in result["balance"]
        ],
    )
    out += ["", "## Training-loop stall: share of the loop's time spent waiting for data", ""]
    out += _table(
        ["loader", "workers", "step ms", "wait share", "wait ms per batch"],
        [
            [
                r["loader"],
                str(r["workers"]),
                f"{r['step_ms']:g}",
                _fig(r["wait_share"], 2),
                _fig(r["wait_ms_per_batch"], 1),
            ]
            for r in result["stall"]
        ],
    )
    return "\n".join(out) + "\n"


def chart(result: dict[str, Any], path: str | Path) -> bool:
    """A bar chart of samples/s per core (min-max error bars) per corpus, and of compression; False without
    matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'shardio[bench]'): no chart")
        return False
    corpora = [c["name"] for c in result["corpora"]]
    fig, axes = plt.subplots(1, len(corpora) + 1, figsize=(6 * (len(corpora) + 1), 5.5))
    for axis, corpus in zip(axes, corpora):
        rows = [r for r in result["throughput"] if r["corpus"] == corpus]
        _bars(
            axis,
            [r["case"] for r in rows],
            [r["samples_per_cpu_s"] for r in rows],
            [_colour(r["loader"]) for r in rows],
        )
        axis.set_title(f"{corpus}: samples per CPU-second")
    rows = [r for r in result["compression"] if r["loader"] == "shardio"] or result["compression"]
    _bars(
        axes[-1],
        [f"{r['codec']} ({r['size_vs_tar']:.0%})" for r in rows],
        [r["samples_per_cpu_s"] for r in rows],
        [_colour(r["loader"]) for r in rows],
    )
    axes[-1].set_title(f"codec (size vs .tar): {rows[0]['loader'] if rows else ''} samples per CPU-s")
    fig.suptitle(
        f"shardio bench, {result['machine']['cpu']}, {result['machine']['cores']} cores; "
        f"medians of {result['reps']} rounds, bars min-max"
    )
    fig.tight_layout()
    check_output_file(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _colour(loader: str) -> str:
    return {
        "shardio": "tab:blue",
        "webdataset": "tab:orange",
        "soundfile floor": "tab:gray",
        "numpy floor": "tab:green",
    }.get(loader, "tab:purple")


def _bars(axis: Any, labels: list[str], figures: list[dict[str, Any]], colours: list[str]) -> None:
    medians = [f["median"] for f in figures]
    errors = [
        [m - f["min"] for m, f in zip(medians, figures)],
        [f["max"] - m for m, f in zip(medians, figures)],
    ]
    axis.barh(range(len(labels)), medians, xerr=errors, color=colours, capsize=3)
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.invert_yaxis()
    if max(medians) > 20 * max(min(medians), 1e-9):
        axis.set_xscale("log")
    axis.grid(axis="x", alpha=0.3)
    for y, (value, figure) in enumerate(zip(medians, figures)):
        axis.text(figure["max"], y, f"  {value:,.0f}", va="center", fontsize=7)
    axis.margins(x=0.15)


def write_report(result: dict[str, Any], directory: str | Path) -> dict[str, str]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` (when matplotlib is there) into ``directory``;
    returns the file names written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": "bench.json", "markdown": "bench.md"}
    if chart(result, out / "bench.png"):
        files["chart"] = "bench.png"
    write_results(out, "bench", {**result, "files": files}, markdown(result))
    return files


def write_results(directory: str | Path, name: str, report: dict[str, Any], text: str) -> None:
    """Write a benchmark's ``{name}.json`` (``report``) and ``{name}.md`` (``text``) into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(str(out / f"{name}.json"), (json.dumps(report, indent=1) + "\n").encode("utf-8"))
    write_atomic(str(out / f"{name}.md"), text.encode("utf-8"))
