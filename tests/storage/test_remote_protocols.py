"""Remote reading across servers and protocols (issue 13, items 18-19), on loopback.

- A server without ``Range`` support (the standard library's ``http.server``, as ``python -m http.server``
  runs it) is detected with one probe and fails the dataset, even under ``on_error="skip"``.
- A mix of corpora over two protocols (http + s3, http + memory) reads each with its own filesystem and
  options.
"""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fsspec
import pytest
from remote_servers import HTTPFileServer, S3Server, aws_test_env
from sample_shards import make_uneven_dataset

from shardio import EpochSize, Index, MixedDataset, RangeNotSupported, ReadError, ShardDataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("protocols")
    make_uneven_dataset(root / "one", [3, 2], duration_range=(0.05, 0.1))
    make_uneven_dataset(root / "two", [2, 2], seed=5, compression="zstd", duration_range=(0.05, 0.1))
    return {"one": root / "one", "two": root / "two"}


class _Counting(SimpleHTTPRequestHandler):
    """The standard library's file handler (no Range support), counting the requests it answers."""

    requests: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:
        self.requests.append(self.requestline)


@pytest.fixture
def plain_http(corpora: dict[str, Path]) -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []
    handler = type("Handler", (_Counting,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(corpora["one"])))
    server.daemon_threads = True
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # the dropped probe
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_server_ignoring_range_fails_the_dataset_once(
    plain_http: tuple[str, list[str]], on_error: str
) -> None:
    url, requests = plain_http
    dataset = ShardDataset(url, batch_size=2, shuffle=False, on_error=on_error)
    with pytest.raises(RangeNotSupported, match=r"ignores Range requests .* 200 and the whole") as caught:
        next(iter(dataset))
    assert isinstance(caught.value, ReadError) and url in str(caught.value)
    shard_gets = [line for line in requests if line.startswith("GET") and ".tar" in line]
    assert len(shard_gets) == 1, requests  # the one probe, whose body is not read; no whole-shard downloads


@pytest.fixture(scope="module")
def http_server(corpora: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("http-root")
    shutil.copytree(corpora["one"], root / "one")
    with HTTPFileServer(str(root)) as server:
        yield f"{server.url}/one"


def _keys_by_corpus(dataset: MixedDataset) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for batch in dataset:
        assert batch["skipped"] == []
        for corpus, key in zip(batch["corpus"], batch["keys"], strict=True):
            seen.setdefault(corpus, set()).add(key)
    return seen


def _check(seen: dict[str, set[str]], corpora: dict[str, Path]) -> None:
    """One pass over corpus "one"; corpus "two" read too (in proportion, so a subset of its keys)."""
    assert seen["one"] == set(Index.load(corpora["one"]).keys)
    assert seen["two"] and seen["two"] <= set(Index.load(corpora["two"]).keys)


def test_a_mix_over_http_and_s3(corpora: dict[str, Path], http_server: str) -> None:
    with aws_test_env(), S3Server() as s3:
        s3_url = s3.upload(str(corpora["two"]), "mix", "two")
        sources = {"one": Index.load(http_server, {}), "two": Index.load(s3_url, s3.storage_options)}
        mix = MixedDataset(sources, {"one": 1, "two": 1}, EpochSize(primary="one"), batch_size=2, seed=3)
        seen = _keys_by_corpus(mix)
    _check(seen, corpora)


def test_a_mix_over_http_and_memory(corpora: dict[str, Path], http_server: str) -> None:
    memory = fsspec.filesystem("memory")
    for path in corpora["two"].iterdir():
        memory.pipe_file(f"/h13-mix/two/{path.name}", path.read_bytes())
    try:
        mix = MixedDataset(
            {"one": http_server, "two": "memory://h13-mix/two"},
            {"one": 1, "two": 1},
            EpochSize(primary="one"),
            batch_size=2,
            seed=3,
        )
        seen = _keys_by_corpus(mix)
    finally:
        memory.rm("/h13-mix", recursive=True)
    _check(seen, corpora)


def test_a_mix_of_a_local_and_a_remote_corpus(corpora: dict[str, Path], http_server: str) -> None:
    """A mix whose corpora live in different kinds of place: each shard is remote or local as its corpus is
    (a local corpus's samples are views of its shards' maps, the remote one's are fetched), and both read."""
    mix = MixedDataset(
        {"one": http_server, "two": str(corpora["two"])},
        {"one": 1, "two": 1},
        EpochSize(primary="one"),
        batch_size=2,
        seed=3,
    )
    index = mix.index
    first_local = int(index.shard_offsets[1])
    assert index.remote and index.is_remote(0) and not index.is_remote(first_local)
    assert not index.is_remote(len(index.shards) - 1)
    _check(_keys_by_corpus(mix), corpora)
