"""Hostile remote datasets and servers, on loopback: what an ``index.json`` or an HTTP server can make shardio do.

A shard name whose percent-escapes an HTTP client decodes into ``..`` must not reach outside the root; a
ranged GET answered with other bytes, a body past its size, an encoding or a 200 is a ``ReadError`` naming the
shard (and never held in memory whole); a server that drips bytes fails the read in bounded time; a remote
``index.json`` that never ends is read no further than a bound.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from remote_servers import HTTPFileServer, S3Server, aws_test_env
from sample_shards import make_uneven_dataset

import shardio.reading.httpreads as httpreads
import shardio.reading.storage as storage
from shardio import FormatError, Index, ReadError, RetryPolicy
from shardio.reading.cache import ShardCache
from shardio.reading.reader import Reader

FAST = RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.05)

pytestmark = pytest.mark.timeout(120)

_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Index:
    """2 plain shards of 3 samples."""
    return make_uneven_dataset(tmp_path_factory.mktemp("hostile-data"), [3, 3], duration_range=(0.05, 0.1))


def _published(local: Index, web: Path, shard_name: str | None = None) -> Path:
    """The dataset copied to ``web/ds`` (and shard 0's file to ``web/other/x.tar``), shard 0 renamed."""
    shutil.copytree(local.root, web / "ds")
    (web / "other").mkdir()
    shutil.copy(Path(local.root) / local.shards[0].name, web / "other" / "x.tar")
    if shard_name is not None:
        header = json.loads((web / "ds" / "index.json").read_text())
        header["shards"][0]["name"] = shard_name
        (web / "ds" / "index.json").write_text(json.dumps(header))
    return web / "ds"


# -- shard names that percent-decode out of the root ------------------------------------------------

@pytest.mark.parametrize("name", ["%2e%2e/other/x.tar", ".%2e/other/x.tar", "%2E%2E/other/x.tar",
                                  "a/%2e%2e/%2e%2e/other/x.tar", "..%2f..%2fother%2fx.tar"])
def test_percent_escaped_dot_segments_never_fetch_outside_the_root(local: Index, tmp_path: Path, name: str) -> None:
    """``http://host/ds/%2e%2e/other/x.tar`` is fetched as ``http://host/other/x.tar`` by aiohttp (yarl decodes
    ``%2e`` and drops the dot segments): shardio refuses the name instead, with nothing fetched outside ``ds``."""
    _published(local, tmp_path, name)
    with HTTPFileServer(str(tmp_path)) as http:
        with pytest.raises(FormatError, match="percent-escapes") as caught:
            Index.load(f"{http.url}/ds")
        seen = {path for _, path in http.faults.requests}
    assert repr(name) in str(caught.value)
    assert all(path.startswith("/ds/") for path in seen), seen


def test_percent_escaped_dot_segments_are_refused_on_a_local_root_too(local: Index, tmp_path: Path) -> None:
    """A local file system takes ``%2e%2e`` literally, but the same dataset served over HTTP would leave its
    root: the name is refused wherever the dataset lies."""
    root = _published(local, tmp_path, "%2e%2e/other/x.tar")
    with pytest.raises(FormatError, match="percent-escapes"):
        Index.load(root)


def test_plain_and_escaped_names_that_stay_in_the_root_still_read(local: Index, tmp_path: Path) -> None:
    """A percent-escape that decodes to an ordinary character (``%2D`` is ``-``) is taken as before."""
    name = local.shards[0].name.replace("-", "%2D")
    _published(local, tmp_path, name)
    with HTTPFileServer(str(tmp_path)) as http:
        index = Index.load(f"{http.url}/ds")
        reader = Reader(index, retry=FAST)
        assert sorted(reader.members(0)) == ["json", "wav"]


# -- HTTP servers that answer a range with something else -------------------------------------------

class _Hostile(BaseHTTPRequestHandler):
    """Serves files under the server's root with ``Range``; paths containing ``server.match`` get ``server.mode``."""

    protocol_version = "HTTP/1.1"
    server: _HostileServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.server.root, self.path.lstrip("/"))
        if ".." in self.path or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        wanted = _RANGE.match(self.headers.get("Range", ""))
        mode = self.server.mode if self.server.match and self.server.match in self.path else ""
        if mode == "endless":
            self._endless()
        elif wanted is None:
            self._answer(200, data, {})
        else:
            start, end = int(wanted.group(1)), int(wanted.group(2)) + 1
            if mode and (start, end) != (0, 1):  # the one-byte probe is answered honestly
                self._hostile(mode, data, start, end)
            else:
                self._answer(206, data[start:end], {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"})

    def _hostile(self, mode: str, data: bytes, start: int, end: int) -> None:
        size = len(data)
        if mode == "other-bytes":  # as many bytes as asked, from the start of the file
            self._answer(206, data[: end - start], {"Content-Range": f"bytes 0-{end - start - 1}/{size}"})
        elif mode == "longer":  # from the offset to the end of the file
            self._answer(206, data[start:], {"Content-Range": f"bytes {start}-{end - 1}/{size}"})
        elif mode == "whole":
            self._answer(200, data, {})
        elif mode == "gzip":
            self._answer(206, gzip.compress(bytes(64 * (end - start))),
                         {"Content-Range": f"bytes {start}-{end - 1}/{size}", "Content-Encoding": "gzip"})
        elif mode == "huge":  # a 206 whose body runs on for 64 MiB
            self._answer(206, bytes(64 << 20), {"Content-Range": f"bytes {start}-{end - 1}/{size}"})
        elif mode == "drip":
            self.send_response(206)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            for offset in range(start, end):
                if self.server.stopping.wait(0.2):
                    return
                self.wfile.write(data[offset : offset + 1])
                self.wfile.flush()

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def _endless(self) -> None:
        """A chunked body of ``[`` that ends after 64 MiB (far past any bound under test, so that a test whose
        bound is missing fails in seconds instead of filling memory or the disk), counted in ``server.sent``."""
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"[" * (1 << 16)
        try:
            for _ in range(1024):
                if self.server.stopping.is_set():
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.server.sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


class _HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        self.root, self.mode, self.match, self.stopping = root, "", "", threading.Event()
        self.sent = 0
        super().__init__(("127.0.0.1", 0), _Hostile)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def hostile(local: Index, tmp_path: Path) -> Iterator[_HostileServer]:
    _published(local, tmp_path)
    server = _HostileServer(tmp_path)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _reader(server: _HostileServer, index: Index) -> Reader:
    """A reader of the served copy, its one-byte Range probe passed on an honest shard 0."""
    reader = Reader(Index.load(f"{server.url}/ds"), retry=FAST)
    reader.members(0)
    server.match = index.shards[1].name
    return reader


@pytest.mark.parametrize("mode, expected", [("other-bytes", "Content-Range"), ("longer", "Content-Length .6656."),
                                            ("whole", "not 206"), ("gzip", "Content-Encoding"),
                                            ("huge", "Content-Length .67108864.")])
def test_a_range_answered_with_other_bytes_is_a_read_error(hostile: _HostileServer, local: Index, mode: str,
                                                            expected: str) -> None:
    """Sample 4 (second of shard 1, at offset 2560): the answer is checked against the bytes asked for, not
    only its length, and a body is never read past that length (``huge``: 64 MiB for 2560 bytes)."""
    reader = _reader(hostile, local)
    hostile.mode = mode
    with pytest.raises(ReadError, match=expected) as caught:
        reader.members(4)
    assert local.shards[1].name in str(caught.value) and "s001_00001" in str(caught.value)


def test_a_dripping_server_fails_the_read_in_bounded_time(hostile: _HostileServer, local: Index,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.2 s (each socket read is quick, so aiohttp's 60 s read timeout never fires): with a
    grace of 1 s, each attempt fails after about 1 s, and the error names the shard and the rate."""
    monkeypatch.setattr(httpreads, "HTTP_READ_TIMEOUT", 1.0)
    reader = _reader(hostile, local)
    hostile.mode = "drip"
    begun = time.monotonic()
    with pytest.raises(ReadError, match=r"after 2 attempt\(s\).*KiB/s") as caught:
        reader.members(4)
    assert time.monotonic() - begun < 10
    assert local.shards[1].name in str(caught.value)


def test_an_endless_remote_index_is_read_no_further_than_a_bound(hostile: _HostileServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "MAX_READ_BYTES", 4 << 20)
    hostile.mode, hostile.match = "endless", "index.json"
    with pytest.raises(FormatError, match=r"index.json: more than 4194304 bytes"):
        Index.load(f"{hostile.url}/ds")


# -- S3: the escapes are refused there too -----------------------------------------------------------

def test_percent_escaped_names_are_refused_over_s3(local: Index, tmp_path: Path) -> None:
    """s3fs sends the key as it is (``%2e%2e`` stays literal), but the same index must not read differently
    on another store: the name is refused on every protocol."""
    root = _published(local, tmp_path, "%2e%2e/x.tar")
    with aws_test_env(), S3Server() as s3:
        url = s3.upload(str(root), "hostile", "ds")
        with pytest.raises(FormatError, match="percent-escapes"):
            Index.load(url, storage_options=s3.storage_options)


# -- the node cache's fetches, and shards replaced mid-run -------------------------------------------

class _Bounded(_Hostile):
    """As :class:`_Hostile`, with modes whose harm stops by itself (so that a test without the bound fails in
    seconds instead of hanging or filling the disk): ``drip-any`` drips every GET but the one-byte probe, with
    or without ``Range``, for 5 s, then sends the rest at once."""

    def do_GET(self) -> None:
        mode = self.server.mode if self.server.match and self.server.match in self.path else ""
        wanted = _RANGE.match(self.headers.get("Range", ""))
        if mode != "drip-any" or (wanted is not None and wanted.group(1, 2) == ("0", "0")):
            super().do_GET()
            return
        data = Path(self.server.root, self.path.lstrip("/")).read_bytes()
        start, end = (int(wanted.group(1)), int(wanted.group(2)) + 1) if wanted else (0, len(data))
        self.send_response(206 if wanted else 200)
        self.send_header("Content-Length", str(end - start))
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        until = time.monotonic() + 5
        try:
            for offset in range(start, end):
                if time.monotonic() > until:
                    self.wfile.write(data[offset:end])
                    break
                if self.server.stopping.wait(0.2):
                    return
                self.wfile.write(data[offset : offset + 1])
                self.wfile.flush()
        except OSError:
            pass


@pytest.fixture
def bounded(hostile: _HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _HostileServer:
    """The hostile server with :class:`_Bounded`'s modes, and a node cache of this test's own."""
    hostile.RequestHandlerClass = _Bounded
    hostile.sent = 0
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    return hostile


def test_a_dripping_server_fails_a_node_cache_fetch_in_bounded_time(bounded: _HostileServer, local: Index,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole shard fetched into the node cache is held to the rate a range read is (a byte every 0.2 s kept
    aiohttp's 60 s read timeout from firing: 9216 bytes took half an hour): each attempt fails after its 1 s
    grace, nothing is kept in the cache, and the error names the shard and the rate."""
    monkeypatch.setattr(httpreads, "HTTP_READ_TIMEOUT", 1.0)
    shards = tmp_path / "node" / "shards"
    reader = Reader(Index.load(f"{bounded.url}/ds"), retry=FAST, cache=ShardCache(str(shards), 1 << 30))
    reader.members(0)
    bounded.match, bounded.mode = local.shards[1].name, "drip-any"
    begun = time.monotonic()
    with pytest.raises(ReadError, match=r"after 2 attempt\(s\).*KiB/s") as caught:
        reader.members(4)
    assert time.monotonic() - begun < 4.5  # the server drips for 5 s, then sends the rest
    assert local.shards[1].name in str(caught.value)
    assert [p.name for p in shards.glob("*.shard")] == [f"{local.shards[0].sha256}-{local.shards[0].bytes}.shard"]
    assert not list(shards.glob(".tmp-*"))


def test_an_endless_remote_columns_file_is_fetched_no_further_than_its_size(bounded: _HostileServer,
                                                                            tmp_path: Path) -> None:
    """The columns file fetched into the node cache is read no further than the size ``index.json`` gives
    it, plus one byte: a server that sends an endless body (here 64 MiB, for a file of 45116 bytes) is
    refused with a FormatError naming the file, and leaves nothing on the disk."""
    bounded.mode, bounded.match = "endless", "index.columns"
    with pytest.raises(FormatError, match=r"index.columns: more than \d+ bytes, but index.json describes"):
        Index.load(f"{bounded.url}/ds")
    bounded.stopping.set()  # the server stops writing at once
    assert not list((tmp_path / "node").glob("*index-*"))
    assert not list((tmp_path / "node").glob(".tmp-*"))


def test_a_shard_replaced_by_one_of_another_size_is_a_read_error(hostile: _HostileServer, local: Index,
                                                                 tmp_path: Path) -> None:
    """Shard 1 is opened (its size checked), then replaced by one 1024 bytes longer whose sample 4 has other
    audio (same header, same key): the range's ``Content-Range`` says the object's new size, and the read is a
    ReadError naming the shard and both sizes, not the new audio mixed silently with the old."""
    reader = _reader(hostile, local)
    hostile.match = ""
    reader.members(3)
    shard = tmp_path / "ds" / local.shards[1].name
    old = shard.read_bytes()
    shard.write_bytes(old[:3200] + bytes(100) + old[3300:] + bytes(1024))
    with pytest.raises(ReadError, match=rf"has '{len(old) + 1024}' bytes .*records {len(old)}: it was replaced") \
            as caught:
        reader.members(4)
    assert local.shards[1].name in str(caught.value) and "s001_00001" in str(caught.value)
