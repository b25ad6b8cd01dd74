"""Hostile remote datasets and servers, on loopback: what an ``index.json`` or an HTTP
server can make shardio do.

A shard name whose percent-escapes an HTTP client decodes into ``..`` must not reach outside the root; a
ranged GET answered with other bytes, a body past its size, an encoding or a 200 is a ``ReadError`` naming the
shard (and never held in memory whole); a server that drips bytes fails the read in bounded time; a remote
``index.json`` that never ends is read no further than a bound; a shard replaced mid-run by one of the same
size (other audio, or a re-pack of the same layout) is a ``ShardChanged`` over S3 and over HTTP with an
``ETag`` or ``Last-Modified``, found with the first answer that shows it and never retried.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import rewrite_header
from remote_servers import HTTPFileServer, S3Server, aws_test_env
from sample_shards import make_uneven_dataset, wav_bytes

import shardio.storage.files as storage
import shardio.storage.httpreads as httpreads
from shardio import FormatError, Index, ReadError, RetryPolicy, ShardChanged, ShardWriter
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
        rewrite_header(web / "ds", lambda header: header["shards"][0].update(name=shard_name))
    return web / "ds"


# -- shard names that percent-decode out of the root ------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "%2e%2e/other/x.tar",
        ".%2e/other/x.tar",
        "%2E%2E/other/x.tar",
        "a/%2e%2e/%2e%2e/other/x.tar",
        "..%2f..%2fother%2fx.tar",
    ],
)
def test_percent_escaped_dot_segments_never_fetch_outside_the_root(
    local: Index, tmp_path: Path, name: str
) -> None:
    """``http://host/ds/%2e%2e/other/x.tar`` is fetched as ``http://host/other/x.tar`` by aiohttp (yarl
    decodes ``%2e`` and drops the dot segments): shardio refuses the name instead, with nothing
    fetched outside ``ds``."""
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
    """Serves files under the server's root with ``Range``; paths containing
    ``server.match`` get ``server.mode``."""

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
            self._answer(
                206,
                gzip.compress(bytes(64 * (end - start))),
                {"Content-Range": f"bytes {start}-{end - 1}/{size}", "Content-Encoding": "gzip"},
            )
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
        bound is missing fails in seconds instead of filling memory or the disk),
        counted in ``server.sent``."""
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
        self.validators = ""  # _Versioned: which validators it sends
        self.seen: list[tuple[str, str, dict[str, str]]] = []  # _Versioned: (method, path, conditions sent)
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


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("other-bytes", "Content-Range"),
        ("longer", "Content-Length .6656."),
        ("whole", "not 206"),
        ("gzip", "Content-Encoding"),
        ("huge", "Content-Length .67108864."),
    ],
)
def test_a_range_answered_with_other_bytes_is_a_read_error(
    hostile: _HostileServer, local: Index, mode: str, expected: str
) -> None:
    """Sample 4 (second of shard 1, at offset 2560): the answer is checked against the bytes asked for, not
    only its length, and a body is never read past that length (``huge``: 64 MiB for 2560 bytes)."""
    reader = _reader(hostile, local)
    hostile.mode = mode
    with pytest.raises(ReadError, match=expected) as caught:
        reader.members(4)
    assert local.shards[1].name in str(caught.value) and "s001_00001" in str(caught.value)


def test_a_dripping_server_fails_the_read_in_bounded_time(
    hostile: _HostileServer, local: Index, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_an_endless_remote_index_is_read_no_further_than_a_bound(
    hostile: _HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_a_dripping_server_fails_a_node_cache_fetch_in_bounded_time(
    bounded: _HostileServer, local: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    assert [p.name for p in shards.glob("*.shard")] == [
        f"{local.shards[0].sha256}-{local.shards[0].bytes}.shard"
    ]
    assert not list(shards.glob(".tmp-*"))


def test_an_endless_remote_columns_file_is_fetched_no_further_than_its_size(
    bounded: _HostileServer, tmp_path: Path
) -> None:
    """The columns file fetched into the node cache is read no further than the size ``index.json`` gives
    it, plus one byte: a server that sends an endless body (here 64 MiB, for a file of 45116 bytes) is
    refused with a FormatError naming the file, and leaves nothing on the disk."""
    bounded.mode, bounded.match = "endless", "index.columns"
    with pytest.raises(FormatError, match=r"index.columns: more than \d+ bytes, but index.json describes"):
        Index.load(f"{bounded.url}/ds")
    bounded.stopping.set()  # the server stops writing at once
    assert not list((tmp_path / "node").glob("*index-*"))
    assert not list((tmp_path / "node").glob(".tmp-*"))


def test_a_shard_replaced_by_one_of_another_size_is_a_read_error(
    hostile: _HostileServer, local: Index, tmp_path: Path
) -> None:
    """Shard 1 is opened (its size checked), then replaced by one 1024 bytes longer whose sample 4 has other
    audio (same header, same key): the range's ``Content-Range`` says the object's new size, and the read is a
    ReadError naming the shard and both sizes, not the new audio mixed silently with the old."""
    reader = _reader(hostile, local)
    hostile.match = ""
    reader.members(3)
    shard = tmp_path / "ds" / local.shards[1].name
    old = shard.read_bytes()
    shard.write_bytes(old[:3200] + bytes(100) + old[3300:] + bytes(1024))
    with pytest.raises(
        ReadError, match=rf"has '{len(old) + 1024}' bytes .*records {len(old)}: it was replaced"
    ) as caught:
        reader.members(4)
    assert local.shards[1].name in str(caught.value) and "s001_00001" in str(caught.value)


# -- shards replaced mid-run by one of the same size: validators -------------------------------------


@pytest.fixture(scope="module")
def repacked(local: Index, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``local`` packed again with other audio of the same lengths (same keys, members and sizes): a re-pack
    whose shards have the very layout of ``local``'s, but other bytes."""
    directory = tmp_path_factory.mktemp("hostile-repacked")
    rng = np.random.default_rng(7)
    writer = ShardWriter(directory)
    shards, frames = local.columns["shard"], local.columns["num_frames"]
    for sample in range(len(local)):
        shard, key = int(shards[sample]), local.key(sample)
        if sample and shard != int(shards[sample - 1]):
            writer.end_shard()
        audio = rng.uniform(-0.5, 0.5, int(frames[sample])).astype(np.float32)
        meta = json.dumps({"text": key, "shard": shard, "index": int(key.rsplit("_", 1)[1])}).encode()
        writer.write(
            key,
            {"wav": wav_bytes(audio, 8000), "json": meta},
            audio_ext="wav",
            num_frames=int(frames[sample]),
            sample_rate=8000,
            channels=1,
        )
    index = writer.close()
    for name in ("frame_offset", "member_size"):
        assert np.array_equal(index.columns[name], local.columns[name])
    assert [s.bytes for s in index.shards] == [s.bytes for s in local.shards]
    assert [s.sha256 for s in index.shards] != [s.sha256 for s in local.shards]
    return Path(directory)


def _same_size_replacement(old: bytes, change: str, repacked: Path, name: str) -> bytes:
    """Shard bytes of ``old``'s size: ``edited`` (100 bytes of sample 4's audio zeroed, headers and keys
    intact) or ``repacked`` (the re-pack's shard of the same name)."""
    new = old[:3200] + bytes(100) + old[3300:] if change == "edited" else (repacked / name).read_bytes()
    assert len(new) == len(old) and new != old
    return new


class _Versioned(_Hostile):
    """Serves files with Range (GET and HEAD) and the validators ``server.validators`` names: ``etag``
    (strong, a digest of the bytes), ``weak-etag`` (``W/"..."``, with Last-Modified), ``last-modified`` (the
    file's mtime), ``etag-ignored`` (a strong ETag, but conditions ignored), ``none``. ``If-Match`` and
    ``If-Unmodified-Since`` are honoured (412); each request's conditions are listed in ``server.seen``."""

    def do_GET(self) -> None:
        self._versioned(body=True)

    def do_HEAD(self) -> None:
        self._versioned(body=False)

    def _versioned(self, body: bool) -> None:
        path = Path(self.server.root, self.path.lstrip("/"))
        if ".." in self.path or not path.is_file():
            self.send_error(404)
            return
        data, kind = path.read_bytes(), self.server.validators
        mtime = int(path.stat().st_mtime)
        headers = {}
        if kind in ("etag", "etag-ignored", "weak-etag"):
            tag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
            headers["ETag"] = "W/" + tag if kind == "weak-etag" else tag
        if kind in ("weak-etag", "last-modified"):
            headers["Last-Modified"] = email.utils.formatdate(mtime, usegmt=True)
        conditions = {n: self.headers[n] for n in ("If-Match", "If-Unmodified-Since") if n in self.headers}
        self.server.seen.append((self.command, self.path, conditions))
        match, since = conditions.get("If-Match"), conditions.get("If-Unmodified-Since")
        if kind != "etag-ignored" and (
            (match is not None and (match.startswith("W/") or match != headers.get("ETag")))
            or (since is not None and mtime > email.utils.parsedate_to_datetime(since).timestamp())
        ):
            self._answer(412, b"", {})
            return
        wanted = _RANGE.match(self.headers.get("Range", ""))
        start, end = (int(wanted.group(1)), int(wanted.group(2)) + 1) if wanted else (0, len(data))
        if wanted:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        if body:
            self._answer(206 if wanted else 200, data[start:end], headers)
            return
        self.send_response(200)
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()


@pytest.fixture
def versioned(hostile: _HostileServer) -> _HostileServer:
    hostile.RequestHandlerClass = _Versioned
    return hostile


def _replace_file(path: Path, new: bytes) -> None:
    """Write ``new`` over ``path`` and date it 10 s later (a replacement made later in the run: Last-Modified
    has whole seconds, so one within the second of the first read would not show)."""
    before = path.stat().st_mtime
    path.write_bytes(new)
    os.utime(path, (before + 10, before + 10))


@pytest.mark.parametrize(
    "kind, condition",
    [
        ("etag", "If-Match"),
        ("weak-etag", "If-Unmodified-Since"),
        ("last-modified", "If-Unmodified-Since"),
        ("etag-ignored", "If-Match"),
    ],
)
@pytest.mark.parametrize("change", ["edited", "repacked"])
def test_a_same_size_replacement_is_refused_over_http(
    versioned: _HostileServer,
    local: Index,
    repacked: Path,
    tmp_path: Path,
    kind: str,
    condition: str,
    change: str,
) -> None:
    """Shard 1 is read (its size checked, its first sample read), then replaced by one of the same size: the
    next read sends the validator first seen (a weak ETag cannot go in If-Match: Last-Modified goes instead),
    the server refuses it (412), or, ignoring it, answers with another ETag: a ShardChanged naming the shard
    and sample, not the new audio. The 412 is not retried (one GET), and the shard, known changed, is not
    asked for again."""
    versioned.validators = kind
    name = local.shards[1].name
    reader = Reader(Index.load(f"{versioned.url}/ds"), retry=FAST)
    reader.members(3)
    shard = tmp_path / "ds" / name
    _replace_file(shard, _same_size_replacement(shard.read_bytes(), change, repacked, name))
    versioned.seen.clear()
    with pytest.raises(ShardChanged, match="changed since this process first read it") as caught:
        reader.members(4)
    assert name in str(caught.value) and "s001_00001" in str(caught.value)
    sent = [(method, sorted(conditions)) for method, path, conditions in versioned.seen if name in path]
    assert sent == [("GET", [condition])]
    with pytest.raises(ShardChanged, match="changed since"):
        reader.members(5)
    assert len([path for _, path, _ in versioned.seen if name in path]) == 1


def test_a_server_without_validators_is_read_as_before(
    versioned: _HostileServer, local: Index, repacked: Path, tmp_path: Path
) -> None:
    """No ETag, no Last-Modified: reads send no condition, and a same-size replacement is read (only its size
    is checked, as before: the member and key checks pass here, ``shardio verify`` would not)."""
    versioned.validators = "none"
    name = local.shards[1].name
    reader = Reader(Index.load(f"{versioned.url}/ds"), retry=FAST)
    reader.members(3)
    shard = tmp_path / "ds" / name
    old = shard.read_bytes()
    new = _same_size_replacement(old, "repacked", repacked, name)
    _replace_file(shard, new)
    wav = bytes(reader.members(4)["wav"])  # sample 4's member data, at 2560 + its 512-byte tar header
    assert wav == new[3072 : 3072 + len(wav)] != old[3072 : 3072 + len(wav)]  # the re-pack's audio
    assert all(not conditions for _, _, conditions in versioned.seen)


def test_a_shard_replaced_before_a_node_cache_fetch_is_refused(
    versioned: _HostileServer, local: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node cache holds one shard: shard 1 is fetched (its ETag recorded from the answer), evicted by
    shard 0, replaced, and fetched again: that fetch sends If-Match and is refused, a ShardChanged (without
    the validator, the SHA-256 check of the cache refuses it too, as an IntegrityError after the download)."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    versioned.validators = "etag"
    name = local.shards[1].name
    cache = ShardCache(str(tmp_path / "node" / "shards"), max(s.bytes for s in local.shards))
    reader = Reader(Index.load(f"{versioned.url}/ds"), retry=FAST, cache=cache, max_open=1)
    reader.members(3)
    reader.members(0)
    assert not list((tmp_path / "node" / "shards").glob(f"{local.shards[1].sha256}-*.shard"))
    shard = tmp_path / "ds" / name
    _replace_file(shard, shard.read_bytes()[:3200] + bytes(100) + shard.read_bytes()[3300:])
    with pytest.raises(ShardChanged, match="412 Precondition Failed to If-Match") as caught:
        reader.members(4)
    assert name in str(caught.value)


@pytest.mark.parametrize("change", ["edited", "repacked"])
def test_a_same_size_replacement_is_refused_over_s3(
    local: Index, repacked: Path, tmp_path: Path, change: str
) -> None:
    """As over HTTP: the ETag S3 gave when shard 1 was first read goes as IfMatch on each later GetObject; the
    object replaced (same size, other bytes) is refused with 412, a ShardChanged naming the shard, found by
    one request (not retried), and not asked for again."""
    root = _published(local, tmp_path)
    name = local.shards[1].name
    with aws_test_env(), S3Server() as s3:
        url = s3.upload(str(root), "replaced", "ds")
        reader = Reader(Index.load(url, storage_options=s3.storage_options), retry=FAST)
        reader.members(3)
        new = _same_size_replacement((root / name).read_bytes(), change, repacked, name)
        s3.client().put_object(Bucket="replaced", Key=f"ds/{name}", Body=new)
        s3.faults.clear()
        with pytest.raises(ShardChanged, match="changed since this process first read it .*412") as caught:
            reader.members(4)
        assert name in str(caught.value) and "s001_00001" in str(caught.value)
        assert s3.faults.count(name) == 1
        with pytest.raises(ShardChanged, match="changed since"):
            reader.members(5)
        assert s3.faults.count(name) == 1


def test_a_shard_replaced_before_a_node_cache_fetch_is_refused_over_s3(
    local: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As over HTTP: the ETag s3fs found when shard 1 was first fetched into the cache is checked when it is
    fetched again, after eviction and replacement: a ShardChanged, not a fetch of the new object."""
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "node"))
    root = _published(local, tmp_path)
    name = local.shards[1].name
    cache = ShardCache(str(tmp_path / "node" / "shards"), max(s.bytes for s in local.shards))
    with aws_test_env(), S3Server() as s3:
        url = s3.upload(str(root), "cached", "ds")
        index = Index.load(url, storage_options=s3.storage_options)
        reader = Reader(index, retry=FAST, cache=cache, max_open=1)
        reader.members(3)
        reader.members(0)
        old = (root / name).read_bytes()
        s3.client().put_object(Bucket="cached", Key=f"ds/{name}", Body=old[:3200] + bytes(100) + old[3300:])
        with pytest.raises(
            ShardChanged, match="ETag .* when this process first read it, ETag .* now"
        ) as caught:
            reader.members(4)
        assert name in str(caught.value)
