"""inspect: what a dataset holds, from its index alone (no shard is read)."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from ..errors import shown_path
from ..shards.index import Index

__all__ = ["HISTOGRAM_EDGES", "inspect_dataset", "render_report"]

HISTOGRAM_EDGES = (0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
"""Left edges (seconds) of the duration histogram's bins; the last bin is open-ended."""


def _counts(values: np.ndarray, names: list[str] | None = None) -> dict[str, int]:
    unique, counts = np.unique(values, return_counts=True)
    return {(names[int(v)] if names else str(int(v))): int(c) for v, c in zip(unique, counts)}


def inspect_dataset(directory: str | os.PathLike[str], *, allow_outside_root: bool = False) -> dict[str, Any]:
    """A JSON-ready summary of the dataset at ``directory``: shards, samples, hours, bytes, codecs, audio
    formats, sample rates, channels, where sample metadata lives (``metadata``: ``"index"`` for a dataset
    indexed in place with its manifest, else ``"members"``), duration statistics and a duration histogram
    (``allow_outside_root``: as :meth:`Index.load`'s)."""
    index = Index.load(directory, allow_outside_root=allow_outside_root)
    durations = index.durations
    edges = [*HISTOGRAM_EDGES, float("inf")]
    binned = (
        np.histogram(durations, bins=edges)[0] if len(index) else np.zeros(len(HISTOGRAM_EDGES), np.int64)
    )
    histogram = [
        {"from": lo, "to": None if hi == float("inf") else hi, "samples": int(n)}
        for lo, hi, n in zip(edges[:-1], edges[1:], binned)
    ]
    stats = {"min": 0.0, "mean": 0.0, "median": 0.0, "max": 0.0}
    if len(index):
        stats = {
            "min": float(durations.min()),
            "mean": float(durations.mean()),
            "median": float(np.median(durations)),
            "max": float(durations.max()),
        }
    return {
        "root": str(index.root),
        "fingerprint": index.fingerprint,
        "shards": len(index.shards),
        "samples": len(index),
        "hours": index.total_duration / 3600,
        "seconds": index.total_duration,
        "bytes": sum(s.bytes for s in index.shards),
        "codecs": dict(Counter(s.codec for s in index.shards)),
        "formats": _counts(index.columns["format"], index.formats),
        "sample_rates": _counts(index.columns["sample_rate"]),
        "channels": _counts(index.columns["channels"]),
        "metadata": "index" if index.has_metadata else "members",
        "duration": stats,
        "histogram": histogram,
    }


def render_report(report: dict[str, Any], width: int = 40) -> str:
    """``report`` (from :func:`inspect_dataset`) as readable text with a bar chart of durations."""

    def listing(counts: dict[str, int]) -> str:
        return ", ".join(f"{name} ({count})" for name, count in counts.items()) or "-"

    stats = report["duration"]
    lines = [
        f"dataset      {shown_path(report['root'])}",
        f"fingerprint  {report['fingerprint']}",
        f"shards       {report['shards']} ({listing(report['codecs'])}), {report['bytes'] / 1e6:.1f} MB",
        f"samples      {report['samples']}",
        f"audio        {report['hours']:.3f} h ({report['seconds']:.1f} s)",
        f"formats      {listing(report['formats'])}",
        f"sample rates {listing(report['sample_rates'])}",
        f"channels     {listing(report['channels'])}",
        f"duration     min {stats['min']:.2f} s, median {stats['median']:.2f} s, mean {stats['mean']:.2f} s, "
        f"max {stats['max']:.2f} s",
        "histogram (seconds: samples)",
    ]
    if report.get("metadata") == "index":  # kept in the index (a NeMo dataset indexed in place)
        lines.insert(8, "metadata     in the index")
    peak = max((b["samples"] for b in report["histogram"]), default=0) or 1
    for bin_ in report["histogram"]:
        label = (
            f"{bin_['from']:>4g}-{bin_['to']:<4g}" if bin_["to"] is not None else f"{bin_['from']:>4g}+   "
        )
        bar = "#" * round(width * bin_["samples"] / peak)
        lines.append(f"  {label} {bin_['samples']:>8} {bar}")
    return "\n".join(lines)
