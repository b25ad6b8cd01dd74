"""Remote shards, a decoded cache per node and the node-stable order: what each node downloads an epoch.

Run ``python benchmarks/node_remote.py [--latency 50] [--samples 480] [--workers 2]``. The corpus and the HTTP
server of ``benchmarks/remote.py`` (FLAC of 2-6 s at 16 kHz in ``.tar`` shards of 80, served from a process of
its own that waits ``--latency`` ms before every answer, 800 Mbit/s a connection). Two nodes (ranks 0 and 1
of a world of 2, one rank a node, played one after the other in this process, each through a DataLoader of
``--workers`` workers), each with its own decoded cache (``Reading(decoded_cache=...)``, large enough for
the corpus), read 3 epochs under the global shuffle and under ``Ordering(node_stable=True)``. Per node and
epoch: the bytes and requests the server answered, and samples/s. Writes
``benchmarks/results/node_remote.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from remote import BATCH, RESULTS, Server, make_corpus  # noqa: E402

EPOCHS = 3


def node_epochs(
    url: str, cache: str, rank: int, node_stable: bool, workers: int, server: Server
) -> list[dict[str, Any]]:
    from torch.utils.data import DataLoader

    from shardio import Ordering, Reading, ShardDataset, World

    dataset = ShardDataset(
        url,
        batch_size=BATCH,
        ordering=Ordering(node_stable=node_stable),
        reading=Reading(decoded_cache=cache),
        world=World(rank, 2, ranks_per_node=1),
    )
    rows = []
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=None, num_workers=workers)
        server.reset()
        started = time.perf_counter()
        samples = sum(len(batch["keys"]) for batch in loader)
        seconds = time.perf_counter() - started
        requests, sent = server.counts()
        rows.append(
            {
                "order": "node-stable" if node_stable else "global",
                "node": rank,
                "epoch": epoch + 1,
                "samples": samples,
                "samples_per_s": round(samples / seconds, 1),
                "requests": requests,
                "bytes": sent,
            }
        )
        print(rows[-1], flush=True)
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Remote shards, a decoded cache per node, and the node-stable order",
        "",
        f"`{report['command']}`: {report['note']}",
        "",
        "| order | node | epoch | samples | samples/s | requests | bytes downloaded |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['order']} | {row['node']} | {row['epoch']} | {row['samples']} | "
            f"{row['samples_per_s']} | {row['requests']} | {row['bytes']:,} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=50.0, help="ms before every answer")
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--per-shard", type=int, default=80)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    from shardio.bench.report import write_results

    work = Path(tempfile.mkdtemp(prefix="shardio-node-remote-"))
    rows: list[dict[str, Any]] = []
    try:
        dataset = make_corpus(work, args.samples, args.per_shard)
        os.environ["SHARDIO_CACHE_DIR"] = str(work / "shardio-cache")
        server = Server(str(dataset.parent), args.latency / 1000, 800e6 / 8)
        try:
            url = f"http://127.0.0.1:{server.port}/ds"
            for node_stable in (False, True):
                for rank in range(2):
                    cache = str(work / f"decoded-{int(node_stable)}-{rank}")
                    rows += node_epochs(url, cache, rank, node_stable, args.workers, server)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "command": "python benchmarks/node_remote.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": (
            f"{args.samples} FLAC samples (2-6 s, 16 kHz) in .tar shards of {args.per_shard} over HTTP at "
            f"{args.latency:g} ms; batch_size {BATCH}; {args.workers} workers; two nodes of one rank, each "
            "with its own decoded cache that holds the corpus; one run (load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, a shared, loaded "
            "machine: the rates are noisy, the bytes are exact)."
        ),
        "rows": rows,
    }
    write_results(args.out, "node_remote", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
