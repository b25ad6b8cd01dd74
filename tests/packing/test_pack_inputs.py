"""Pack's inputs: files that hung pack, values that crashed it, and entries silently mangled or lost.

Real files and real processes throughout: FIFOs, sockets and device links made with the OS, audio written with
numpy + soundfile, the CLI run as a subprocess under a timeout (a hang is a failure, not a stuck suite).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from audio_factory import write_text, write_tone

from shardio.errors import FormatError, InputError, ReadError
from shardio.packing.corpus import read_corpus, read_jsonl, read_table
from shardio.packing.indexer import build_index
from shardio.packing.merging import merge_partitions
from shardio.packing.pack import pack
from shardio.packing.partitions import pack_partition, plan_partitions
from shardio.shards.index import Index

REPO = Path(__file__).resolve().parents[2]
_TIMEOUT = 60  # seconds: a hang fails the test here instead of blocking the suite

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``shardio ARGS`` in a real process; a hang raises ``TimeoutExpired`` after :data:`_TIMEOUT` s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "shardio.cli", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
    )


def _refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 (bad input), a one-line-per-problem message naming each needle, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


# -- special files: a FIFO, a device, a socket named as an input must be refused, never read ----------------


@needs_fifo
@pytest.mark.parametrize("special", ["fifo", "dev-zero", "socket"])
def test_a_special_file_named_as_audio_is_refused_not_read(
    tmp_path: Path, special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "corpus"
    write_tone(corpus / "good.wav")
    target = corpus / "bad.wav"
    if special == "fifo":
        os.mkfifo(target)  # reading it blocked pack forever: no writer ever comes
        kind = "FIFO"
    elif special == "dev-zero":
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero")
        target.symlink_to("/dev/zero")  # reading it never ended, growing memory without bound
        kind = "character device"
    else:
        server = socket.socket(socket.AF_UNIX)
        monkeypatch.chdir(corpus)  # a socket path must be short: bind it relative
        server.bind("bad.wav")
        kind = "socket"
    result = _cli("pack", corpus, tmp_path / "out", "--no-progress", "-j", "1")
    _refused(result, str(target), f"it is a {kind}", "not a regular file")
    assert not (tmp_path / "out" / "index.json").exists()
    skipped = _cli("pack", corpus, tmp_path / "skip", "--no-progress", "--on-error", "skip")
    assert skipped.returncode == 0, skipped.stderr
    assert list(Index.load(tmp_path / "skip").keys) == ["good"]


@needs_fifo
def test_a_fifo_named_by_a_manifest_segment_is_refused_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": "pipe.wav", "offset": 0.0, "duration": 0.2}) + "\n")
    _refused(_cli("pack", manifest, tmp_path / "out", "--no-progress"), f"{manifest}:1", "FIFO")


@needs_fifo
def test_a_fifo_transcript_or_manifest_is_refused_not_read(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write_tone(corpus / "a.wav")
    os.mkfifo(corpus / "a.txt")
    _refused(_cli("pack", corpus, tmp_path / "out", "--no-progress"), str(corpus / "a.txt"), "FIFO")
    manifest = tmp_path / "train.jsonl"
    os.mkfifo(manifest)  # kind detection read it before anything else, and blocked
    _refused(_cli("pack", manifest, tmp_path / "out2", "--no-progress"), str(manifest), "FIFO")
    with pytest.raises(InputError, match="FIFO"):
        list(read_corpus(manifest, "jsonl"))


# -- keys that only case or Unicode normalisation tell apart ------------------------------------------------


def test_keys_that_differ_only_in_case_or_normalisation_are_packed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = tmp_path / "m.jsonl"
    lines = []
    for i, key in enumerate(["caf\u00e9", "cafe\u0301", "Speaker", "speaker", "other"]):
        write_tone(tmp_path / f"{i}.wav", seed=i)
        lines.append(json.dumps({"audio_filepath": f"{i}.wav", "id": key}))
    manifest.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="shardio"):
        pack(manifest, tmp_path / "out", progress=False)
    assert len(Index.load(tmp_path / "out")) == 5  # distinct samples to shardio and WebDataset
    warned = [r.getMessage() for r in caplog.records if "case or Unicode normalisation" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("2 key(s)"), warned
    assert "'caf\\xe9' and 'cafe\\u0301'" in warned[0], warned  # escaped: shown alike, they would read as one


# -- manifest values JSON cannot carry, and fields given twice -----------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ('{"score": NaN}', "NaN is not a JSON value"),
        pytest.param('{"score": -Infinity}', "-Infinity is not a JSON value", marks=pytest.mark.slow),
        pytest.param('{"score": 1e400}', "1e400 is beyond the range", marks=pytest.mark.slow),
        ('{"text": "first", "text": "second"}', "'text' appears twice"),
        pytest.param('{"align": {"start": 1, "start": 2}}', "'start' appears twice", marks=pytest.mark.slow),
    ],
)
def test_jsonl_values_json_cannot_carry_are_problems_naming_the_line(
    tmp_path: Path, value: str, reason: str
) -> None:
    write_tone(tmp_path / "a.wav")
    write_tone(tmp_path / "b.wav", seed=1)
    fields = value[1:-1]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        f'{{"audio_filepath": "a.wav", "text": "fine"}}\n{{"audio_filepath": "b.wav", {fields}}}\n'
    )
    # NaN and infinities crashed pack with a ValueError traceback (exit 1, as if verify had found problems),
    # under --on-error skip too; a field given twice kept its last value unseen
    _refused(_cli("pack", manifest, tmp_path / "out", "--no-progress"), f"{manifest}:2", reason)
    skipped = _cli("pack", manifest, tmp_path / "skip", "--no-progress", "--on-error", "skip")
    assert skipped.returncode == 0, skipped.stderr
    assert list(Index.load(tmp_path / "skip").keys) == ["a"]
    rejected = [json.loads(line) for line in (tmp_path / "skip" / "rejected.jsonl").read_text().splitlines()]
    assert [r["source"] for r in rejected] == [f"{manifest}:2"] and reason in rejected[0]["reason"]


def test_jsonl_keeps_large_integers_and_plain_values(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"audio_filepath": "a.wav", "big": 123456789012345678901234567890, "x": 0.5, "n": null}\n'
    )
    (source,) = read_jsonl(manifest)
    assert source.meta == {"big": 123456789012345678901234567890, "x": 0.5, "n": None}


def test_table_header_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav")
    table = tmp_path / "t.tsv"
    table.write_text("path\ttext\tspeaker\tTEXT\na.wav\thello\tS1\tgoodbye\n")  # 'goodbye' replaced 'hello'
    with pytest.raises(InputError, match=r"t\.tsv:1: .*'TEXT' twice"):
        list(read_table(table))
    _refused(_cli("pack", table, tmp_path / "out", "--no-progress"), f"{table}:1", "twice")


# -- partitions: a part committed by another plan is refused, never merged -----------------------------------


def _partitioned_corpus(root: Path, count: int = 12) -> int:
    for i in range(count):
        write_tone(root / f"u{i:02d}.wav", 0.1, seed=i)
    return (root / "u00.wav").stat().st_size


@pytest.mark.parametrize("old_report", [False, True])
def test_merge_refuses_a_part_another_plan_committed(tmp_path: Path, old_report: bool) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    size = _partitioned_corpus(corpus)
    first = plan_partitions(corpus, out, partition_bytes=size * 3)  # run A: partitions of 3 files
    shutil.rmtree(out / "_parts")  # A's driver stopped; its plan removed, as the changed-plan error says
    second = plan_partitions(corpus, out, partition_bytes=size * 6)  # run B: partitions of 6 files
    pack_partition(first.job(0))  # a task of run A, still running, commits partition 0 (u00-u02)
    if old_report:  # a part whose report records no plan (as an older shardio wrote it): its keys tell
        report = out / "_parts" / "00000" / "report.json"
        report.write_text(
            json.dumps({k: v for k, v in json.loads(report.read_text()).items() if k != "plan"})
        )
    for number in range(len(second.partitions)):
        pack_partition(second.job(number))
    # merged, B's index held 9 samples of 12: u03-u05 were lost, silently
    with pytest.raises(FormatError, match=r"_parts/00000: partition 0 .*(another plan|lacks 'u03')"):
        merge_partitions(second)
    assert not (out / "index.json").exists()
    shutil.rmtree(out / "_parts" / "00000")  # what the error says to do: the part and its shards (run A's)
    for shard in out.glob("shard-00000-*"):
        shard.unlink()
    pack_partition(second.job(0))
    index, problems, _ = merge_partitions(second)
    assert list(index.keys) == [f"u{i:02d}" for i in range(12)] and problems == []


def test_merge_of_one_plan_with_skipped_inputs_still_merges(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    size = _partitioned_corpus(corpus, 6)
    (corpus / "u01.wav").write_bytes(b"RIFF not audio")
    from shardio.packing.partitions import PackOptions

    plan = plan_partitions(corpus, out, partition_bytes=size * 3, options=PackOptions(on_error="skip"))
    for number in range(len(plan.partitions)):
        pack_partition(plan.job(number))
    index, problems, _ = merge_partitions(plan)
    assert list(index.keys) == ["u00", "u02", "u03", "u04", "u05"] and [p.key for p in problems] == ["u01"]


# -- shardio index: a key repeated inside one shard, and a FIFO named as a shard ----------------------------


def test_index_warns_of_a_key_repeated_within_one_shard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "src"
    write_tone(source / "a.wav")
    write_tone(source / "b.wav", seed=1)
    write_text(source / "a.txt", "A")
    shard = tmp_path / "data" / "s.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:  # as 'tar -rf' appends a key again
        for name in ("a.wav", "b.wav", "a.wav"):
            tar.add(source / name, arcname=name)
    with caplog.at_level(logging.WARNING, logger="shardio"):
        index = build_index([shard], progress=False)
    assert list(index.keys) == ["a", "b", "a"]
    assert any(
        "1 keys appear earlier" in r.getMessage() and "'a'" in r.getMessage() for r in caplog.records
    ), caplog.text


@needs_fifo
def test_index_refuses_a_fifo_shard_naming_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "s.tar")
    with pytest.raises(ReadError, match=r"s\.tar: cannot read the shard: it is a FIFO"):
        build_index([tmp_path / "s.tar"], progress=False)
    result = _cli("index", tmp_path / "s.tar", "--no-progress")
    assert result.returncode == 2, result.stderr  # a ReadError: a ShardioError
    assert "FIFO" in result.stderr and "Traceback" not in result.stderr


def test_pack_reads_a_regular_file_through_a_symlink(tmp_path: Path) -> None:
    write_tone(tmp_path / "real" / "a.wav")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.wav").symlink_to(tmp_path / "real" / "a.wav")
    summary = pack(tmp_path / "corpus", tmp_path / "out", progress=False)
    assert summary.samples == 1
