"""Partitioned packing to ``s3://`` (moto's S3 server on loopback): the objects equal a local pack's files,
an interrupted run resumes from the committed partitions, and the dataset loads from the URL."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus
from remote_servers import S3Server, aws_test_env

from shardio import Index, OptionError
from shardio.packing.engines import pack_partitioned
from shardio.packing.pack import pack
from shardio.packing.partitions import PartitionPlan, pack_partition
from shardio.shards.writer import ShardWriter

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with aws_test_env(), S3Server() as server:
        server.client().create_bucket(Bucket="data")
        yield server


def test_s3_output_equals_local_and_resumes(s3_server: S3Server, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 16, formats=("wav", "flac"), seed=2)
    options = dict(partition_bytes=25_000, samples_per_shard=3, compression="zstd", progress=False)
    local = tmp_path / "local"
    pack_partitioned(corpus, local, **options)  # type: ignore[arg-type]
    url = "s3://data/packed"

    def first_two(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        for number in numbers[:2]:
            pack_partition(plan.job(number))
        raise KeyboardInterrupt

    storage = s3_server.storage_options
    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(corpus, url, engine=first_two, storage_options=storage, **options)  # type: ignore[arg-type]
    packed: list[int] = []

    def rest(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        packed.extend(numbers)
        for number in numbers:
            pack_partition(plan.job(number))

    pack_partitioned(corpus, url, engine=rest, storage_options=storage, **options)  # type: ignore[arg-type]
    assert packed and packed[0] == 2
    client = s3_server.client()
    objects = {o["Key"].removeprefix("packed/"): o for o in client.list_objects_v2(Bucket="data")["Contents"]}
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in local.iterdir()}
    assert sorted(objects) == sorted(expected)  # no _parts left behind
    for name, digest in expected.items():
        body = client.get_object(Bucket="data", Key=f"packed/{name}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == digest
    index = Index.load(url, storage)
    assert len(index) == 16 and index.fingerprint == Index.load(local).fingerprint


def test_a_url_output_without_an_engine_is_refused_not_written_to_a_local_folder(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """``shardio pack DIR s3://bucket/prefix`` without ``--engine`` wrote a local folder
    ``./s3:/bucket/prefix`` and exited 0 (main 2e2a2c2); with ``--engine local`` it uploads. Now the
    one-process path refuses the URL, naming it and what to do, and the partitioned path still uploads (the
    endpoint from the environment)."""
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 4, seed=3)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ENDPOINT_URL_S3": s3_server.endpoint}
    url = "s3://data/cli"

    def shardio_pack(*options: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "shardio.cli", "pack", str(corpus), url, "--no-progress", *options]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)

    refused = shardio_pack()
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert f"{url} is a URL" in refused.stderr and "--engine local" in refused.stderr
    assert not (tmp_path / "s3:").exists()
    client = s3_server.client()
    assert client.list_objects_v2(Bucket="data", Prefix="cli/").get("KeyCount") == 0
    with pytest.raises(OptionError, match="is a URL"):
        pack(corpus, url, progress=False)
    with pytest.raises(OptionError, match="is a URL"):
        ShardWriter(url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]

    uploaded = shardio_pack("--engine", "local")
    assert uploaded.returncode == 0, uploaded.stderr
    assert len(Index.load(url, s3_server.storage_options)) == 4


def test_a_foreign_object_in_a_partition_s_way_is_refused(s3_server: S3Server, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 12, seed=6)
    options = dict(partition_bytes=20_000, samples_per_shard=2, progress=False)
    url, storage = "s3://data/planted", s3_server.storage_options

    def first(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        pack_partition(plan.job(numbers[0]))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(corpus, url, engine=first, storage_options=storage, **options)  # type: ignore[arg-type]
    client = s3_server.client()
    pack_partitioned(corpus, tmp_path / "local", **options)  # type: ignore[arg-type]
    real = (tmp_path / "local" / "shard-00001-000000.tar").read_bytes()
    for body in (b"someone's", real[:-1] + bytes([real[-1] ^ 1])):  # another size; the size, another digest
        client.put_object(Bucket="data", Key="planted/shard-00001-000000.tar", Body=body)
        with pytest.raises(OptionError, match="a file that is not partition 1's shard"):
            pack_partitioned(corpus, url, storage_options=storage, **options)  # type: ignore[arg-type]
        assert client.get_object(Bucket="data", Key="planted/shard-00001-000000.tar")["Body"].read() == body


def test_hostile_part_files_on_s3_are_refused_and_others_kept(s3_server: S3Server, tmp_path: Path) -> None:
    """On an object store too: a plan.json that is a list or nested 100,000 deep, or a report that is a list,
    is a FormatError naming it; the merge removes only the objects the plan wrote under _parts."""
    from shardio.errors import FormatError
    from shardio.packing.merging import merge_partitions
    from shardio.packing.partitions import plan_partitions

    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 4, seed=4)
    storage = s3_server.storage_options
    client = s3_server.client()
    url, prefix = "s3://data/hostile", "hostile/_parts"
    plan = plan_partitions(corpus, url, partition_bytes=1, storage_options=storage)
    original = client.get_object(Bucket="data", Key=f"{prefix}/plan.json")["Body"].read()
    for hostile in (b"[1, 2]", b"[" * 100_000 + b"]" * 100_000):
        client.put_object(Bucket="data", Key=f"{prefix}/plan.json", Body=hostile)
        with pytest.raises(FormatError, match="plan.json"):
            plan_partitions(corpus, url, partition_bytes=1, storage_options=storage)
    client.put_object(Bucket="data", Key=f"{prefix}/plan.json", Body=original)
    for number in range(len(plan.partitions)):
        pack_partition(plan.job(number))
    report = client.get_object(Bucket="data", Key=f"{prefix}/00000/report.json")["Body"].read()
    client.put_object(Bucket="data", Key=f"{prefix}/00000/report.json", Body=b"[]")
    with pytest.raises(FormatError, match="report.json"):
        merge_partitions(plan)
    client.put_object(Bucket="data", Key=f"{prefix}/00000/report.json", Body=report)
    client.put_object(Bucket="data", Key=f"{prefix}/notes.txt", Body=b"not shardio's")
    merge_partitions(plan)
    left = [o["Key"] for o in client.list_objects_v2(Bucket="data", Prefix=prefix)["Contents"]]
    assert left == [f"{prefix}/notes.txt"]
