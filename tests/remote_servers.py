"""Test servers on loopback: an HTTP file server with ``Range`` support and a moto S3 server, both with a
shared, thread-safe fault plan (5xx answers, dropped connections, stalls) to exercise shardio's retries.

Test-only code: nothing here is part of shardio. Servers bind 127.0.0.1 on a free port and serve from
daemon threads; use them as context managers.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest.mock import patch

__all__ = ["Fault", "Faults", "GCSServer", "HTTPFileServer", "S3Server", "aws_test_env", "serve_copy"]

LOOPBACK = "127.0.0.1"
MAX_STALL = 5.0  # seconds: a stalled answer never waits longer, so a broken test cannot hang a server thread


@dataclass(frozen=True)
class Fault:
    """What a server does instead of answering: ``status`` (an HTTP error code), ``drop`` or ``stall``."""

    kind: str
    status: int = 503
    seconds: float = 0.0


@dataclass
class _Rule:
    fault: Fault
    remaining: int
    match: str
    method: str | None


class Faults:
    """A fault plan shared by a server's request threads, and a count of the requests it saw.

    Queued rules (``fail``, ``drop``, ``stall``) hit the next matching requests, in order; ``random`` adds a
    seeded chance per request, never more than ``max_in_row`` faults in a row for one path, so bounded
    client retries always get through.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._rate = 0.0
        self._rng = random.Random(0)
        self._random_match = ""
        self._max_in_row = 0
        self._in_row: Counter[str] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        """Requests seen, by ``(method, path)``."""
        self.ranges: Counter[tuple[str, str, str | None]] = Counter()
        """Requests seen, by ``(method, path, Range header)``: a client's retry asks a range again."""
        self.injected: Counter[str] = Counter()
        """Faults injected, by kind."""

    def _add(self, fault: Fault, count: int, match: str, method: str | None) -> None:
        with self._lock:
            self._rules.append(_Rule(fault, count, match, method))

    def fail(self, count: int, *, status: int = 503, match: str = "", method: str | None = None) -> None:
        """Answer the next ``count`` requests whose path contains ``match`` with ``status``."""
        self._add(Fault("status", status=status), count, match, method)

    def drop(self, count: int, *, match: str = "", method: str | None = None) -> None:
        """Close the connection without answering the next ``count`` matching requests."""
        self._add(Fault("drop"), count, match, method)

    def stall(self, count: int, seconds: float, *, match: str = "", method: str | None = None) -> None:
        """Wait ``seconds`` (at most ``MAX_STALL``) before answering the next ``count`` matching requests."""
        self._add(Fault("stall", seconds=min(seconds, MAX_STALL)), count, match, method)

    def random(self, rate: float, *, seed: int, match: str = "", max_in_row: int = 2) -> None:
        """From now on, fault each matching request with probability ``rate`` (a 5xx or
        a dropped connection)."""
        with self._lock:
            self._rate, self._rng, self._random_match, self._max_in_row = (
                rate,
                random.Random(seed),
                match,
                max_in_row,
            )

    def clear(self) -> None:
        """Remove every rule and the random faults, and reset the counts."""
        with self._lock:
            self._rules.clear()
            self._rate = 0.0
            self._in_row.clear()
            self.requests.clear()
            self.ranges.clear()
            self.injected.clear()

    def count(self, match: str = "", method: str | None = None) -> int:
        """Requests seen whose path contains ``match`` (and of ``method``, when given)."""
        with self._lock:
            return sum(n for (m, p), n in self.requests.items() if match in p and method in (None, m))

    def decide(self, method: str, path: str, wanted: str | None = None) -> Fault | None:
        """Record a request (``wanted``: its ``Range`` header) and say which fault, if any, it gets."""
        with self._lock:
            self.requests[(method, path)] += 1
            self.ranges[(method, path, wanted)] += 1
            for rule in self._rules:
                if rule.remaining > 0 and rule.match in path and rule.method in (None, method):
                    rule.remaining -= 1
                    self.injected[rule.fault.kind] += 1
                    return rule.fault
            if self._rate and self._random_match in path:
                if self._in_row[path] < self._max_in_row and self._rng.random() < self._rate:
                    self._in_row[path] += 1
                    fault = (
                        Fault("drop")
                        if self._rng.random() < 0.2
                        else Fault("status", self._rng.choice((500, 503)))
                    )
                    self.injected[fault.kind] += 1
                    return fault
                self._in_row[path] = 0
            return None


def _drop(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# -- HTTP ------------------------------------------------------------------------------------------

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers then body in two sends meet delayed ACKs: 40 ms a request
    server: _FileHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        logging.getLogger(__name__).debug("http: " + format, *args)

    def _fault(self) -> bool:
        fault = self.server.faults.decide(self.command, self.path, self.headers.get("Range"))
        if fault is None:
            return False
        if fault.kind == "stall":
            time.sleep(fault.seconds)
            return False
        if fault.kind == "drop":
            self.close_connection = True
            _drop(self.connection)
            return True
        body = f"injected fault {fault.status}".encode()
        self.send_response(fault.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return True

    def _serve(self, with_body: bool) -> None:
        if self._fault():
            return
        path = os.path.join(self.server.root, self.path.split("?", 1)[0].lstrip("/"))
        if ".." in self.path or not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted:
            match = _RANGE.match(wanted.strip())
            if match is None or match.group(1) == "" or int(match.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, size) if match.group(2) else size
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if with_body:
            with open(path, "rb") as handle:
                handle.seek(start)
                self.wfile.write(handle.read(end - start))

    def do_GET(self) -> None:
        self._serve(True)

    def do_HEAD(self) -> None:
        self._serve(False)


class _FileHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = (
        1024  # Python's default of 5 drops concurrent read-ahead connections into 1 s retransmits
    )

    def __init__(self, root: str, faults: Faults) -> None:
        self.root, self.faults = root, faults
        super().__init__((LOOPBACK, 0), _RangeHandler)


class HTTPFileServer:
    """Serves the files under ``root`` at ``http://127.0.0.1:PORT/`` (GET, HEAD, single ``Range``)."""

    def __init__(self, root: str, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        self._server = _FileHTTPServer(root, self.faults)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="test-http")

    @property
    def url(self) -> str:
        """The base URL, without a trailing slash."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HTTPFileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


# -- S3 --------------------------------------------------------------------------------------------


class _FaultMiddleware:
    """WSGI middleware in front of moto: applies the fault plan before moto sees a request."""

    def __init__(self, app: Any, faults: Faults) -> None:
        self.app, self.faults = app, faults

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        fault = self.faults.decide(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""))
        if fault is not None and fault.kind == "stall":
            time.sleep(fault.seconds)
        elif fault is not None and fault.kind == "drop":
            _drop(environ["werkzeug.socket"])
            start_response("500 Dropped", [("Content-Length", "0")])
            return []
        elif fault is not None:
            body = (
                b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable</Code>"
                b"<Message>injected fault</Message></Error>"
            )
            start_response(
                f"{fault.status} Injected",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]
        return self.app(environ, start_response)


@contextmanager
def aws_test_env() -> Iterator[None]:
    """Dummy AWS credentials and region in the environment (never real ones), restored afterwards."""
    names = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with patch.dict(os.environ, names):  # restores the whole environment on exit
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(name, None)
        yield


class S3Server:
    """A moto S3 server (``ThreadedMotoServer``) on loopback with the fault plan in front of it.

    Use inside :func:`aws_test_env`. ``storage_options`` are what shardio needs to reach it.
    """

    def __init__(self, faults: Faults | None = None) -> None:
        from moto.server import ThreadedMotoServer

        self.faults = faults or Faults()
        self._moto = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    @property
    def endpoint(self) -> str:
        """The endpoint URL."""
        host, port = self._moto.get_host_and_port()
        return f"http://{host}:{port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for this server: the endpoint and the dummy credentials."""
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def __enter__(self) -> S3Server:
        self._moto.start()
        server = self._moto._server  # the werkzeug server, to put the faults in front of moto
        assert server is not None
        server.app = _FaultMiddleware(server.app, self.faults)
        server.RequestHandlerClass = type(
            "_NoDelayHandler", (server.RequestHandlerClass,), {"disable_nagle_algorithm": True}
        )  # as in _RangeHandler
        return self

    def __exit__(self, *exc: object) -> None:
        self._moto.stop()

    def client(self) -> Any:
        """A boto3 S3 client for this server (for setting up buckets)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def upload(self, directory: str, bucket: str, prefix: str) -> str:
        """Copy every file of ``directory`` under ``s3://bucket/prefix/`` (creating the
        bucket); returns that URL."""
        client = self.client()
        existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=handle.read())
        return f"s3://{bucket}/{prefix}"


# -- GCS -------------------------------------------------------------------------------------------


class GCSServer:
    """``gcp-storage-emulator`` (Google Cloud Storage's JSON API, in memory) on loopback, read with gcsfs.

    gcsfs's newer ``ExtendedGcsFileSystem`` first asks a gRPC control API for each bucket's type, which the
    emulator does not serve (60 s of failed TLS handshakes, then it falls back to the plain filesystem): the
    tests run gcsfs with ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``, set before gcsfs is imported.
    """

    def __init__(self) -> None:
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        from gcp_storage_emulator.server import create_server

        with socket.socket() as probe:
            probe.bind((LOOPBACK, 0))
            self.port = probe.getsockname()[1]
        self._server = create_server(LOOPBACK, self.port, in_memory=True, default_bucket="data")
        logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)

    @property
    def storage_options(self) -> dict[str, Any]:
        """gcsfs options for this server: its endpoint, anonymous access."""
        return {"endpoint_url": f"http://{LOOPBACK}:{self.port}", "token": "anon", "project": "test"}

    def __enter__(self) -> GCSServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def filesystem(self) -> Any:
        """A gcsfs filesystem of its own (not fsspec's cached instance) for setting up objects."""
        import gcsfs

        return gcsfs.GCSFileSystem(**self.storage_options, skip_instance_cache=True)

    def upload(self, directory: str, prefix: str) -> str:
        """Copy every file of ``directory`` under ``gs://data/prefix/``; returns that URL."""
        fs = self.filesystem()
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    fs.pipe(f"data/{prefix}/{name}", handle.read())
        return f"gs://data/{prefix}"


@contextmanager
def serve_copy(dataset_root: str, workdir: Path) -> Iterator[HTTPFileServer]:
    """An HTTP server over a copy of the dataset at ``dataset_root``, as ``ds`` under ``workdir``."""
    shutil.copytree(dataset_root, workdir / "ds")
    with HTTPFileServer(str(workdir)) as http:
        yield http
