"""Google Cloud Storage through gcsfs, against ``gcp-storage-emulator`` on loopback: the same remote path as
HTTP and S3 (range reads, read-ahead, the node cache) and typed errors (a missing object, bad credentials)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from remote_servers import GCSServer
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Index, OptionError, ReadError, Reading, RetryPolicy, ShardDataset
from shardio.reading.reader import Reader

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs is imported: see GCSServer
pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")

pytestmark = pytest.mark.timeout(120)

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def gcs() -> Iterator[GCSServer]:
    with GCSServer() as server:
        yield server


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Index:
    return make_uneven_dataset(
        tmp_path_factory.mktemp("gcs-data") / "ds", [8, 8, 5], compression="zstd", duration_range=(0.05, 0.1)
    )


def batches(dataset: ShardDataset, workers: int = 0) -> list[dict]:
    return list(DataLoader(dataset, batch_size=None, num_workers=workers))


def assert_same(expected: list[dict], got: list[dict]) -> None:
    assert [b["keys"] for b in got] == [b["keys"] for b in expected]
    for near, far in zip(expected, got, strict=True):
        assert torch.equal(near["audio"], far["audio"])


@pytest.mark.parametrize("read_ahead", [0, 64 << 20], ids=["ranges", "read-ahead"])
@pytest.mark.parametrize("workers", [0, 2])
def test_gcs_reads_like_the_local_dataset(
    gcs: GCSServer, local: Index, read_ahead: int, workers: int
) -> None:
    url = gcs.upload(local.root, f"read-{read_ahead}-{workers}")
    expected = batches(ShardDataset(local.root, batch_size=3, seed=2))
    reading = Reading(read_ahead=read_ahead, storage_options=gcs.storage_options)
    far = ShardDataset(url, batch_size=3, seed=2, reading=reading)
    assert far.index.fingerprint == local.fingerprint
    assert_same(expected, batches(far, workers))


def test_gcs_through_the_node_cache(
    gcs: GCSServer, local: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    url = gcs.upload(local.root, "cached")
    expected = batches(ShardDataset(local.root, batch_size=4, seed=5))
    for _ in range(2):  # cold: fetched whole into the cache; warm: read from it
        reading = Reading(cache_bytes=1 << 30, storage_options=gcs.storage_options)
        dataset = ShardDataset(url, batch_size=4, seed=5, reading=reading)
        assert_same(expected, batches(dataset, workers=2))
    assert len(list((tmp_path / "cache" / "shards").glob("*.shard"))) == len(local.shards)


def test_a_missing_gcs_object_is_a_read_error_naming_the_shard(gcs: GCSServer, local: Index) -> None:
    url = gcs.upload(local.root, "missing")
    index = Index.load(url, storage_options=gcs.storage_options)
    gcs.filesystem().rm(f"data/missing/{index.shards[1].name}")
    reader = Reader(index, retry=FAST)
    first_of_shard_1 = int(index.shards[0].samples)
    with pytest.raises(ReadError, match=f"{index.shards[1].name}.*missing"):
        reader.members(first_of_shard_1)
    assert reader.stats.retries == 0
    assert reader.members(0).keys() == Reader(local).members(0).keys()


def test_a_missing_gcs_index_is_a_typed_error(gcs: GCSServer) -> None:
    with pytest.raises(Exception) as caught:
        Index.load("gs://data/nothing-here", storage_options=gcs.storage_options)
    assert type(caught.value).__module__.startswith("shardio"), repr(caught.value)
    assert "nothing-here" in str(caught.value)


def test_unusable_gcs_credentials_are_an_option_error(gcs: GCSServer, tmp_path: Path) -> None:
    """A credentials file that google-auth cannot use (here: a service account without its key) is refused
    when the filesystem is made, as an OptionError naming the URL, not an error from deep inside gcsfs."""
    token = tmp_path / "credentials.json"
    token.write_text('{"type": "service_account", "client_email": "x@example.com"}')
    options = {**gcs.storage_options, "token": str(token)}
    with pytest.raises(OptionError) as caught:
        Index.load("gs://data/anything", storage_options=options)
    assert "gs://data/anything" in str(caught.value)
