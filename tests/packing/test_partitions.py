"""Partitioned packing: plan / pack one partition / merge, byte-identical whatever runs the partitions."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus, write_text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio import Index
from shardio.errors import InputError, OptionError
from shardio.packing.engines import pack_partitioned
from shardio.packing.pack import pack
from shardio.packing.partitions import PARTS_DIR, PartitionPlan, pack_partition, partition_done

COUNT = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_folder_corpus(root, COUNT, formats=("wav", "flac"), seed=3)
    return root


def files(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (relative name -> sha256)."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


_FAULTY: dict[int, int] = {}


def _attempt(plan: PartitionPlan, number: int, crash_after: int | None) -> None:
    """One attempt of a partition in this (child) process; ``crash_after`` shards: die
    like a killed worker."""
    if crash_after is not None:
        from shardio.shards import writer

        finish = writer.ShardWriter._finish_shard
        count = [0]

        def dying(self: writer.ShardWriter) -> None:
            finish(self)
            count[0] += 1
            if count[0] > crash_after:
                os._exit(9)

        writer.ShardWriter._finish_shard = dying  # type: ignore[method-assign]
    pack_partition(plan.job(number))


def chaos_engine(order_seed: int, failures: Sequence[int], duplicates: bool):
    """Runs every partition in real child processes, in a shuffled order; some attempts die mid-write and are
    retried; with ``duplicates`` a partition is packed twice."""
    context = multiprocessing.get_context("fork")

    def run(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        order = list(numbers)
        random.Random(order_seed).shuffle(order)
        for position, number in enumerate(order):
            attempts = [failures[position % len(failures)] if failures else None, None]
            if duplicates:
                attempts.append(None)
            for crash_after in attempts:
                if crash_after is not None and crash_after < 0:
                    continue
                child = context.Process(target=_attempt, args=(plan, number, crash_after))
                child.start()
                child.join()
                if child.exitcode == 0:
                    assert partition_done(plan, number)
                    if not duplicates:
                        break
                else:
                    assert child.exitcode == 9

    return run


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, str]]:
    """``-j 1`` outputs per partition size, packed once each."""
    return {}


def reference_files(
    corpus: Path, cache: dict[int, dict[str, str]], root: Path, partition_bytes: int, compression: str
) -> dict[str, str]:
    key = partition_bytes * 2 + (compression == "zstd")
    if key not in cache:
        out = root / f"ref-{partition_bytes}-{compression}"
        pack_partitioned(
            corpus,
            out,
            engine="local",
            workers=1,
            partition_bytes=partition_bytes,
            samples_per_shard=3,
            compression=compression,
            progress=False,
        )
        cache[key] = files(out)
    return cache[key]


CHAOS = dict(
    partition_kb=st.integers(4, 120),
    order_seed=st.integers(0, 2**16),
    failures=st.lists(st.integers(-1, 2), min_size=1, max_size=4),
    duplicates=st.booleans(),
    compression=st.sampled_from(["none", "zstd"]),
)


def check_chaos(
    corpus: Path,
    reference: dict[int, dict[str, str]],
    root: Path,
    partition_kb: int,
    order_seed: int,
    failures: list[int],
    duplicates: bool,
    compression: str,
) -> None:
    expected = reference_files(corpus, reference, root, partition_kb * 1000, compression)
    out = root / "out"
    pack_partitioned(
        corpus,
        out,
        engine=chaos_engine(order_seed, failures, duplicates),
        partition_bytes=partition_kb * 1000,
        samples_per_shard=3,
        compression=compression,
        progress=False,
    )
    assert files(out) == expected
    assert len(Index.load(out)) == COUNT


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**CHAOS)
def test_any_order_failures_and_duplicates_give_the_bytes_of_j1(
    corpus: Path,
    reference: dict[int, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
    partition_kb: int,
    order_seed: int,
    failures: list[int],
    duplicates: bool,
    compression: str,
) -> None:
    check_chaos(
        corpus,
        reference,
        tmp_path_factory.mktemp("chaos"),
        partition_kb,
        order_seed,
        failures,
        duplicates,
        compression,
    )


MANY = int(os.environ.get("SHARDIO_CHAOS_EXAMPLES", "0"))


@pytest.mark.slow
@pytest.mark.skipif(not MANY, reason="set SHARDIO_CHAOS_EXAMPLES=N to run the property over N examples")
@settings(
    max_examples=max(MANY, 1), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**CHAOS)
def test_any_order_failures_and_duplicates_give_the_bytes_of_j1_many(
    corpus: Path,
    reference: dict[int, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
    partition_kb: int,
    order_seed: int,
    failures: list[int],
    duplicates: bool,
    compression: str,
) -> None:
    """The same property over more examples (about 1 s each):
    ``SHARDIO_CHAOS_EXAMPLES=100 pytest -m slow tests/packing/test_partitions.py``."""
    check_chaos(
        corpus,
        reference,
        tmp_path_factory.mktemp("chaos"),
        partition_kb,
        order_seed,
        failures,
        duplicates,
        compression,
    )


def test_local_pool_matches_j1_and_reads_back(corpus: Path, tmp_path: Path) -> None:
    one = tmp_path / "one"
    two = tmp_path / "two"
    summary = pack_partitioned(
        corpus, one, workers=1, partition_bytes=30_000, samples_per_shard=4, progress=False
    )
    pack_partitioned(corpus, two, workers=2, partition_bytes=30_000, samples_per_shard=4, progress=False)
    assert files(one) == files(two)
    assert not (one / PARTS_DIR).exists()
    index = Index.load(one)
    assert summary.samples == len(index) == COUNT
    names = [s.name for s in index.shards]
    assert names == sorted(names) and all(n.startswith("shard-") and n.count("-") == 2 for n in names)
    assert len({n.split("-")[1] for n in names}) > 1  # several partitions
    from shardio.packing.verification import verify_dataset

    assert verify_dataset(one, decode=True) == []


def test_rerun_packs_only_uncommitted_partitions(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    packed: list[int] = []

    def half(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        for number in numbers[: len(numbers) // 2]:
            pack_partition(plan.job(number))
        raise KeyboardInterrupt  # the driver dies before the rest

    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(
            corpus, out, engine=half, partition_bytes=30_000, samples_per_shard=4, progress=False
        )

    def record(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        packed.extend(numbers)
        for number in numbers:
            pack_partition(plan.job(number))

    pack_partitioned(corpus, out, engine=record, partition_bytes=30_000, samples_per_shard=4, progress=False)
    reference = tmp_path / "ref"
    pack_partitioned(corpus, reference, partition_bytes=30_000, samples_per_shard=4, progress=False)
    assert files(out) == files(reference)
    assert packed and packed[0] > 0  # the committed first half was not packed again


def test_a_changed_plan_is_refused(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def nothing(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(corpus, out, engine=nothing, partition_bytes=30_000, progress=False)
    with pytest.raises(OptionError, match="earlier run planned"):
        pack_partitioned(corpus, out, partition_bytes=50_000, progress=False)
    leftover = tmp_path / "leftover"
    leftover.mkdir()
    (leftover / "shard-00001-000000.tar").write_bytes(b"")
    with pytest.raises(OptionError, match="shard-00001-000000.tar"):
        pack_partitioned(corpus, leftover, partition_bytes=50_000, progress=False)


def test_bad_inputs_are_listed_or_skipped(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 8, subdirs=1)
    (corpus / "d0" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    write_text(corpus / "d0" / "broken.txt", "x")
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, tmp_path / "raise", partition_bytes=20_000, progress=False)
    assert not (tmp_path / "raise" / "index.json").exists()
    # a failed partition is not committed: once the input is mended (same plan: one partition here), a re-run
    # packs it again
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, tmp_path / "mended", partition_bytes=10**9, progress=False)
    good = (corpus / "d0" / "broken.wav").read_bytes()
    shutil.copyfile(corpus / "d0" / "utt00000.wav", corpus / "d0" / "broken.wav")
    try:
        pack_partitioned(corpus, tmp_path / "mended", partition_bytes=10**9, progress=False)
        pack_partitioned(corpus, tmp_path / "fresh", partition_bytes=10**9, progress=False)
    finally:
        (corpus / "d0" / "broken.wav").write_bytes(good)
    assert files(tmp_path / "mended") == files(tmp_path / "fresh")
    summary = pack_partitioned(
        corpus, tmp_path / "skip", partition_bytes=20_000, on_error="skip", progress=False
    )
    assert summary.samples == 8 and [p.key for p in summary.rejected] == ["d0/broken"]
    assert "broken" in (tmp_path / "skip" / "rejected.jsonl").read_text()


def test_cli_engine_local(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardio.cli import main

    args = [
        "pack",
        str(corpus),
        str(tmp_path / "cli"),
        "--engine",
        "local",
        "-j",
        "1",
        "--partition-size",
        "30KB",
        "--samples-per-shard",
        "4",
        "--no-progress",
    ]
    assert main(args) == 0
    assert f"packed {COUNT} samples" in capsys.readouterr().out
    pack_partitioned(corpus, tmp_path / "api", partition_bytes=30_000, samples_per_shard=4, progress=False)
    assert files(tmp_path / "cli") == files(tmp_path / "api")


def test_a_failed_run_leaves_no_parts_it_could_not_resume(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 6, subdirs=1)
    (corpus / "d0" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    # one partition, rejected: nothing committed, so neither _parts nor the directory the run made is left
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, tmp_path / "made", partition_bytes=10**9, progress=False)
    assert not (tmp_path / "made").exists()
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, given, partition_bytes=10**9, progress=False)
    assert given.is_dir() and list(given.iterdir()) == []  # the run did not make it: kept, emptied of _parts
    empty = tmp_path / "empty"
    empty.mkdir()
    from shardio.cli import main

    assert main(["pack", str(empty), str(tmp_path / "cli"), "--engine", "local", "--no-progress"]) == 2
    assert not (tmp_path / "cli").exists()
    # partitions that committed stay for a re-run to resume from
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, tmp_path / "some", partition_bytes=1, progress=False)
    assert list((tmp_path / "some" / PARTS_DIR).glob("*/index.json"))

    # a _parts that an earlier (interrupted) run made is not this run's to remove
    def nothing(plan: PartitionPlan, numbers: Sequence[int]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(corpus, tmp_path / "earlier", engine=nothing, partition_bytes=10**9, progress=False)
    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, tmp_path / "earlier", partition_bytes=10**9, progress=False)
    assert (tmp_path / "earlier" / PARTS_DIR / "plan.json").is_file()


@pytest.mark.parametrize("engine", [None, "local"])
def test_a_file_url_output_is_its_path_on_every_path(tmp_path: Path, engine: str | None) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 3, seed=4)
    out = tmp_path / "out"
    if engine is None:
        pack(corpus, f"file://{out}", progress=False)
    else:
        pack_partitioned(corpus, f"file://{out}", engine=engine, progress=False)
    assert len(Index.load(out)) == 3
    assert not any(p.name.startswith("file:") for p in Path.cwd().iterdir())
