"""Remote reads: shardio against WebDataset streaming, the same shards over HTTP with added latency.

Run ``python benchmarks/remote.py [--latencies 0 5 20 50] [--samples 480] [--reps 1] [--bandwidth-mbps 800]``.
A LibriSpeech-like corpus (16 kHz mono FLAC of 2-6 s of noise, a JSON transcript each) packed by shardio as
plain ``.tar`` shards of ``--per-shard`` samples, served by a local HTTP server that answers byte ranges,
waits ``latency`` before every answer (time to the first byte) and sends at most ``--bandwidth-mbps``
per connection. The server runs in a process of its own (not a thread competing for the loader's GIL) with a
listen backlog of 1024 (socketserver's default of 5 dropped the SYNs of concurrent read-ahead connections:
1 s TCP retransmits that no object store charges). Cases (one epoch each, ``batch_size=16``, decoded to
tensors), at 0 and 2 workers:

- ``shardio, ranges``: ``read_ahead=0``, one request per sample when it is needed (what main did);
- ``shardio, read-ahead``: the default, coalesced and concurrent reads of the next batches;
- ``shardio, cache cold`` / ``cache warm``: ``cache_bytes`` set: whole shards through the node cache,
  first from the server, then from the disk;
- ``webdataset``: ``wds.WebDataset`` streaming each shard whole (``curl``), soundfile decode, same collate.

Plus shardio on moto's S3 server (no added latency). Reported: samples/s, requests and bytes per sample (as
the server counted them). Writes ``benchmarks/results/remote.json`` and ``.md``. The machine this was written
on was shared and loaded (about 10 on 2 cores): single runs, noisy.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BATCH = 16


class _Server(ThreadingHTTPServer):
    """The HTTP server, run in its own process (:class:`Server`): an object store is not in the trainer's
    process, and a server thread there would compete for its GIL with the loader it measures."""

    daemon_threads = True
    # socketserver's default backlog of 5 drops SYNs once more than 5 connections arrive at once (16
    # read-ahead threads in each of 2 workers do): each dropped SYN costs the client a 1 s retransmit, which
    # no real object store charges.
    request_queue_size = 1024

    def __init__(self, root: str, latency: float, bandwidth: float, counters: Any) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.latency, self.bandwidth = root, latency, bandwidth
        self.counters = counters  # shared [requests, bytes]


def _serve(root: str, latency: float, bandwidth: float, counters: Any, port: Any) -> None:
    server = _Server(root, latency, bandwidth, counters)
    port.value = server.server_address[1]
    server.serve_forever()


class Server:
    """The benchmark's HTTP server in a child process; ``requests`` and ``bytes`` count what it served."""

    def __init__(self, root: str, latency: float, bandwidth: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._counters = context.Array("q", 2)
        port = context.Value("i", 0)
        self._process = context.Process(
            target=_serve, args=(root, latency, bandwidth, self._counters, port), daemon=True
        )
        self._process.start()
        while not port.value:
            if not self._process.is_alive():
                raise RuntimeError("the benchmark's HTTP server did not start")
            time.sleep(0.01)
        self.port = int(port.value)

    def reset(self) -> None:
        with self._counters.get_lock():
            self._counters[0] = self._counters[1] = 0

    def counts(self) -> tuple[int, int]:
        with self._counters.get_lock():
            return int(self._counters[0]), int(self._counters[1])

    def stop(self) -> None:
        self._process.terminate()
        self._process.join()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers then body in two sends meet delayed ACKs: 40 ms a request
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, body: bool) -> None:
        path = os.path.join(self.server.root, self.path.lstrip("/").split("?")[0])
        if not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, end = 0, size
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, end = int(first), min(size, int(last) + 1 if last else size)
        time.sleep(self.server.latency)
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        with self.server.counters.get_lock():
            self.server.counters[0] += 1
        if not body:
            return
        with open(path, "rb") as handle:
            handle.seek(start)
            left = end - start
            while left:
                chunk = handle.read(min(left, 1 << 16))
                self.wfile.write(chunk)
                left -= len(chunk)
                with self.server.counters.get_lock():
                    self.server.counters[1] += len(chunk)
                if self.server.bandwidth:
                    time.sleep(len(chunk) / self.server.bandwidth)

    def do_GET(self) -> None:
        self._serve(True)

    def do_HEAD(self) -> None:
        self._serve(False)


def make_corpus(directory: Path, samples: int, per_shard: int) -> Path:
    """FLAC samples packed by shardio as ``.tar`` shards; returns the dataset directory."""
    import soundfile

    from shardio import ShardWriter

    dataset = directory / "ds"
    if (dataset / "index.json").exists():
        return dataset
    generator = np.random.default_rng(0)
    with ShardWriter(dataset, max_samples=per_shard) as writer:
        for i in range(samples):
            frames = int(generator.uniform(2, 6) * 16000)
            buffer = io.BytesIO()
            audio = (0.1 * generator.standard_normal(frames)).astype(np.float32)
            soundfile.write(buffer, audio, 16000, format="FLAC", subtype="PCM_16")
            writer.write(
                f"spk{i % 7}/utt{i:06d}",
                {"flac": buffer.getvalue(), "json": json.dumps({"text": "a few words"}).encode()},
                audio_ext="flac",
                num_frames=frames,
                sample_rate=16000,
                channels=1,
            )
    return dataset


def _epoch(loader: Any) -> int:
    return sum(len(batch["keys"]) if "keys" in batch else len(batch["lengths"]) for batch in loader)


def shardio_case(url: str, workers: int, **options: Any) -> tuple[int, float]:
    from torch.utils.data import DataLoader

    from shardio import Reading, ShardDataset

    dataset = ShardDataset(url, batch_size=BATCH, reading=Reading(**options))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    started = time.perf_counter()
    count = _epoch(loader)
    return count, time.perf_counter() - started


def webdataset_case(urls: list[str], workers: int) -> tuple[int, float]:
    from torch.utils.data import DataLoader

    from shardio.bench.cases import webdataset_pipeline

    pipeline = webdataset_pipeline(urls, ext="flac", batch_size=BATCH)
    loader = DataLoader(pipeline, batch_size=None, num_workers=workers)
    started = time.perf_counter()
    count = _epoch(loader)
    return count, time.perf_counter() - started


def run_http(
    dataset: Path, latency_ms: float, bandwidth: float, cache_root: str, reps: int = 1
) -> list[dict[str, Any]]:
    """Every HTTP case at ``latency_ms``, ``reps`` rounds (each round every case once, in turn; a fresh cache
    directory a round, so "cold" is cold): the median round's rate, and the range."""
    from shardio import Index

    index = Index.load(dataset)
    server = Server(str(dataset.parent), latency_ms / 1000, bandwidth)
    base = f"http://127.0.0.1:{server.port}/ds"
    rows = []
    try:
        for workers in (0, 2):
            cases: list[tuple[str, Any]] = [
                ("shardio, ranges", lambda w=workers: shardio_case(base, w, read_ahead=0)),
                ("shardio, read-ahead", lambda w=workers: shardio_case(base, w)),
                ("shardio, cache cold", lambda w=workers: shardio_case(base, w, cache_bytes=1 << 34)),
                ("shardio, cache warm", lambda w=workers: shardio_case(base, w, cache_bytes=1 << 34)),
                (
                    "webdataset",
                    lambda w=workers: webdataset_case([f"{base}/{s.name}" for s in index.shards], w),
                ),
            ]
            runs: dict[str, list[tuple[int, float, int, int]]] = {name: [] for name, _ in cases}
            for rep in range(reps):
                os.environ["SHARDIO_CACHE_DIR"] = os.path.join(cache_root, f"l{latency_ms}-w{workers}-r{rep}")
                for name, case in cases:
                    server.reset()
                    count, seconds = case()
                    runs[name].append((count, seconds, *server.counts()))
            for name, measured in runs.items():
                rates = sorted(count / seconds for count, seconds, _, _ in measured)
                count, seconds, requests, sent = sorted(measured, key=lambda m: m[0] / m[1])[
                    len(measured) // 2
                ]
                rows.append(
                    {
                        "transport": "http",
                        "latency_ms": latency_ms,
                        "workers": workers,
                        "case": name,
                        "samples": count,
                        "seconds": round(seconds, 3),
                        "samples_per_s": round(count / seconds, 1),
                        "min": round(rates[0], 1),
                        "max": round(rates[-1], 1),
                        "requests_per_sample": round(requests / max(count, 1), 3),
                        "bytes_per_sample": round(sent / max(count, 1)),
                    }
                )
                print(
                    f"http {latency_ms:>3} ms {workers}w {name:<22} {count / seconds:8.1f} samples/s "
                    f"({rates[0]:.0f}-{rates[-1]:.0f}), {requests / max(count, 1):.3f} requests/sample",
                    flush=True,
                )
    finally:
        server.stop()
    return rows


def run_s3(dataset: Path) -> list[dict[str, Any]]:
    """shardio (ranges and read-ahead) on moto's S3 server, 0 and 2 workers."""
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    rows = []
    try:
        endpoint = f"http://127.0.0.1:{server._server.server_port}"  # type: ignore[union-attr]
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")
        for path in dataset.iterdir():
            client.upload_file(str(path), "data", f"ds/{path.name}")
        options = {"storage_options": {"endpoint_url": endpoint}}
        for workers in (0, 2):
            for name, extra in (("shardio, ranges", {"read_ahead": 0}), ("shardio, read-ahead", {})):
                count, seconds = shardio_case("s3://data/ds", workers, **options, **extra)
                rows.append(
                    {
                        "transport": "s3 (moto)",
                        "latency_ms": 0,
                        "workers": workers,
                        "case": name,
                        "samples": count,
                        "seconds": round(seconds, 3),
                        "samples_per_s": round(count / seconds, 1),
                    }
                )
                print(f"s3 {workers}w {name:<22} {count / seconds:8.1f} samples/s", flush=True)
    finally:
        server.stop()
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# shardio remote reads",
        "",
        report["note"],
        "",
        "| transport | latency ms | workers | case | samples/s | requests/sample | bytes/sample |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        spread = f" ({row['min']:.0f}-{row['max']:.0f})" if "min" in row else ""
        lines.append(
            f"| {row['transport']} | {row['latency_ms']} | {row['workers']} | {row['case']} | "
            f"{row['samples_per_s']:.1f}{spread} | {row.get('requests_per_sample', '-')} | "
            f"{row.get('bytes_per_sample', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 5, 20, 50])
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--per-shard", type=int, default=80)
    parser.add_argument("--bandwidth-mbps", type=float, default=800, help="per connection; 0: no cap")
    parser.add_argument("--reps", type=int, default=1, help="rounds of the HTTP cases (medians, ranges)")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    from shardio.bench.report import write_results

    work = Path(tempfile.mkdtemp(prefix="shardio-remote-"))
    try:
        dataset = make_corpus(work, args.samples, args.per_shard)
        rows = []
        for latency in args.latencies:
            rows += run_http(dataset, latency, args.bandwidth_mbps * 1e6 / 8, str(work / "cache"), args.reps)
        if not args.no_s3:
            rows += run_s3(dataset)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "command": "python benchmarks/remote.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "note": (
            f"{args.samples} FLAC samples (2-6 s, 16 kHz) in .tar shards of {args.per_shard}; "
            f"batch_size {BATCH}; bandwidth cap {args.bandwidth_mbps} Mbit/s per connection; one epoch "
            f"per case and round; HTTP: median of {args.reps} rounds (min-max); load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared, loaded machine)."
        ),
        "rows": rows,
    }
    write_results(args.out, "remote", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
