"""Remote shards: ``http://`` (a local server with ``Range``) and ``s3://`` (moto's S3 server), on loopback.

Faults come from the servers themselves (5xx answers, dropped connections, stalls): shardio retries the
transient ones under its ``RetryPolicy``, and nothing below it retries (counted on the server), then
raises a ``ReadError`` naming shard, key and offset. ``is_transient`` is checked against the exceptions
fsspec, s3fs, botocore and aiohttp really raise.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from remote_servers import Faults, HTTPFileServer, S3Server, aws_test_env
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import FormatError, Index, ReadError, Reading, RetryPolicy, ShardDataset
from shardio.reading.reader import Reader
from shardio.storage.files import filesystem
from shardio.storage.retries import is_transient

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05)

pytestmark = pytest.mark.timeout(120)


@dataclass
class Remote:
    """One backend: where to publish a local dataset, the options to read it, and its fault plan."""

    kind: str
    faults: Faults
    options: dict[str, Any]
    publish: Callable[[Path, str], str]
    """``publish(directory, name)``: copy a dataset there; returns its URL."""

    def shard_url(self, root: str, index: Index, shard: int = 0) -> str:
        return f"{root}/{index.shards[shard].name}"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Index]:
    """The local datasets every remote test reads: 2 shards of 3 samples, plain and zstd."""
    root = tmp_path_factory.mktemp("remote-data")
    return {
        codec: make_uneven_dataset(root / codec, [3, 3], compression=codec, duration_range=(0.05, 0.1))
        for codec in ("none", "zstd")
    }


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPFileServer]:
    with HTTPFileServer(str(tmp_path_factory.mktemp("http-root"))) as server:
        yield server


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, started by the tests, with dummy credentials in the environment."""
    with aws_test_env(), S3Server() as server:
        server.client().create_bucket(Bucket="data")
        yield server


@pytest.fixture(params=["http", "s3"])
def remote(request: pytest.FixtureRequest) -> Iterator[Remote]:
    if request.param == "http":
        server: Any = request.getfixturevalue("http_server")

        def publish(directory: Path, name: str) -> str:
            shutil.copytree(directory, Path(server._server.root) / name)
            return f"{server.url}/{name}"

        backend = Remote("http", server.faults, {}, publish)
    else:
        server = request.getfixturevalue("s3_server")
        backend = Remote(
            "s3",
            server.faults,
            server.storage_options,
            lambda directory, name: server.upload(str(directory), "data", name),
        )
    server.faults.clear()
    yield backend
    server.faults.clear()


def published(remote: Remote, index: Index, request: pytest.FixtureRequest) -> str:
    """``index``'s dataset copied to ``remote`` under a name of this test's own."""
    name = request.node.name.replace("[", "-").replace("]", "")
    return remote.publish(Path(index.root), name)


def all_members(reader: Reader) -> list[dict[str, bytes]]:
    return [{ext: bytes(data) for ext, data in reader.members(i).items()} for i in range(len(reader.index))]


# -- reading -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_remote_dataset_reads_like_the_local_one(
    remote: Remote, data: dict[str, Index], codec: str, request: pytest.FixtureRequest
) -> None:
    url = published(remote, data[codec], request)
    local = ShardDataset(data[codec].root, batch_size=2, seed=1)
    far = ShardDataset(url, batch_size=2, seed=1, reading=Reading(storage_options=remote.options))
    assert far.index.fingerprint == local.index.fingerprint and far.index.keys == local.index.keys
    pairs = list(zip(local, far, strict=True))
    assert len(pairs) == len(local)
    for near, away in pairs:
        assert near["keys"] == away["keys"] and torch.equal(near["audio"], away["audio"])


def test_s3_endpoint_from_the_environment(
    s3_server: S3Server, data: dict[str, Index], monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore reads ``AWS_ENDPOINT_URL_S3`` when s3fs makes its client, so no storage options are needed."""
    url = s3_server.upload(data["none"].root, "data", "from-env")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    index = Index.load(url, storage_options={"skip_instance_cache": True})
    assert all_members(Reader(index)) == all_members(Reader(data["none"]))


def test_remote_index_errors(remote: Remote, data: dict[str, Index], request: pytest.FixtureRequest) -> None:
    url = published(remote, data["none"], request)
    with pytest.raises(FormatError, match="no index here"):
        Index.load(url + "-nothing-here", storage_options=remote.options)
    remote.faults.fail(2, match="index.json")
    assert Index.load(url, storage_options=remote.options).fingerprint == data["none"].fingerprint


# -- retries -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["503", "500", "429", "drop"])
def test_transient_faults_are_retried_and_nothing_is_lost(
    remote: Remote, data: dict[str, Index], fault: str, request: pytest.FixtureRequest
) -> None:
    url = published(remote, data["zstd"], request)
    index = Index.load(url, storage_options=remote.options)
    for shard in index.shards:
        if fault == "drop":
            remote.faults.drop(2, match=shard.name)
        else:
            remote.faults.fail(2, status=int(fault), match=shard.name)
    reader = Reader(index, retry=FAST)
    assert all_members(reader) == all_members(Reader(data["zstd"]))
    assert sum(remote.faults.injected.values()) == 2 * len(index.shards)
    # a drop on a pooled keep-alive connection may be re-sent by aiohttp itself, unseen here
    assert (0 if fault == "drop" else 1) <= reader.stats.retries <= 2 * len(index.shards)


def test_spent_retries_raise_read_error_and_no_lower_layer_retries(
    remote: Remote, data: dict[str, Index], request: pytest.FixtureRequest
) -> None:
    url = published(remote, data["none"], request)
    index = Index.load(url, storage_options=remote.options)
    shard = index.shards[0].name
    remote.faults.fail(100, status=503, match=shard, method="GET")
    started = time.monotonic()
    with pytest.raises(ReadError, match=r"read failed after 3 attempt\(s\)") as caught:
        Reader(index, retry=FAST).members(0)
    assert time.monotonic() - started < 5
    assert f"shard {url}/{shard}, key {index.keys[0]!r}, offset 0" in str(caught.value)
    # s3fs and botocore would make 5 x 5 requests per attempt of their own; they are set to one
    assert remote.faults.count(shard, "GET") == 3


def test_persistent_drops_raise_read_error(
    remote: Remote, data: dict[str, Index], request: pytest.FixtureRequest
) -> None:
    url = published(remote, data["none"], request)
    index = Index.load(url, storage_options=remote.options)
    remote.faults.drop(100, match=index.shards[1].name)
    with pytest.raises(ReadError, match="attempt"):
        Reader(index, retry=FAST).members(3)
    # per attempt: s3fs sends a HEAD, fsspec's HTTP size() a HEAD then a GET, and aiohttp re-sends once when
    # a pooled keep-alive connection turns out closed; left to themselves, s3fs and botocore
    # sent 101 for one read (72 s)
    assert 3 <= remote.faults.count(index.shards[1].name) <= 3 * 4


def test_stalled_answers_time_out_and_are_retried(
    remote: Remote, data: dict[str, Index], request: pytest.FixtureRequest
) -> None:
    url = published(remote, data["none"], request)
    if remote.kind == "http":
        options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=0.3)}}
    else:
        options = {**remote.options, "config_kwargs": {"read_timeout": 0.3}}
    index = Index.load(url, storage_options=options)
    remote.faults.stall(1, 1.0, match=index.shards[0].name, method="GET")
    reader = Reader(index, retry=FAST)
    assert all_members(reader) == all_members(Reader(data["none"]))
    assert reader.stats.retries == 1


def test_missing_remote_shard_is_not_retried(
    remote: Remote,
    data: dict[str, Index],
    request: pytest.FixtureRequest,
    s3_server: S3Server,
    http_server: HTTPFileServer,
) -> None:
    url = published(remote, data["none"], request)
    index = Index.load(url, storage_options=remote.options)
    name = index.shards[1].name
    if remote.kind == "http":
        (Path(http_server._server.root) / url.rsplit("/", 1)[1] / name).unlink()
    else:
        s3_server.client().delete_object(Bucket="data", Key=f"{url.rsplit('/', 1)[1]}/{name}")
    reader = Reader(index, retry=FAST)
    with pytest.raises(ReadError, match="the shard file is missing"):
        reader.members(3)
    assert reader.stats.retries == 0
    assert all_members_of_shard(reader, 0) == all_members_of_shard(Reader(data["none"]), 0)


def all_members_of_shard(reader: Reader, shard: int) -> list[dict[str, bytes]]:
    rows = [i for i in range(len(reader.index)) if int(reader.index.columns["shard"][i]) == shard]
    return [{ext: bytes(d) for ext, d in reader.members(i).items()} for i in rows]


# -- classification against the real exceptions -------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "call", "transient"),
    [
        ("503", "range", True),
        ("500", "range", True),
        ("429", "range", True),
        ("drop", "range", True),
        ("503", "size", True),
        ("drop", "size", True),
        ("403", "range", False),
        ("404", "range", False),
        ("missing", "range", False),
        ("missing", "size", False),
    ],
)
def test_is_transient_on_what_the_libraries_raise(
    remote: Remote,
    data: dict[str, Index],
    fault: str,
    call: str,
    transient: bool,
    request: pytest.FixtureRequest,
) -> None:
    url = published(remote, data["none"], request)
    name = data["none"].shards[0].name
    target = f"{url}/{name}" if fault != "missing" else f"{url}/no-such-shard.tar"
    if fault == "drop":
        remote.faults.drop(10, match=name)
    elif fault != "missing":
        remote.faults.fail(10, status=int(fault), match=name)
    fs, path = filesystem(target, remote.options)
    fs.invalidate_cache()
    with pytest.raises(Exception) as caught:  # any type: that is what is being classified
        fs.size(path) if call == "size" else fs.cat_file(path, start=0, end=100)
    assert is_transient(caught.value) is transient, repr(caught.value)


# -- workers -------------------------------------------------------------------------------------------


def test_two_workers_lose_nothing_under_random_faults(
    remote: Remote, data: dict[str, Index], request: pytest.FixtureRequest
) -> None:
    url = published(remote, data["zstd"], request)
    dataset = ShardDataset(
        url,
        batch_size=2,
        reading=Reading(
            storage_options=remote.options, retry=RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)
        ),
    )
    first = [k for batch in dataset for k in batch["keys"]]  # a reader and filesystem in this process first
    remote.faults.fail(2, match="shard-")  # whichever worker asks first
    remote.faults.drop(1, match="shard-")
    batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
    keys = [k for batch in batches for k in batch["keys"]]
    assert sorted(first) == sorted(keys) == sorted(data["zstd"].keys)
    assert not any(batch["skipped"] for batch in batches)
    assert remote.faults.injected == {"status": 2, "drop": 1}
