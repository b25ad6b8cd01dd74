"""Issue 46, left over from items 2 and 17: a partitioned pack's own files under ``_parts`` are untrusted.
A hostile ``plan.json`` or ``report.json`` (a list, deep nesting, wrong types, huge, a FIFO) is a FormatError
naming the file, never a raw AttributeError/RecursionError/TypeError or a hang; and removing ``_parts`` (after
a merge, after a failed run, when a part is uncommitted) deletes only the files the pack wrote."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from audio_factory import make_folder_corpus

from shardio.errors import FormatError, InputError
from shardio.packing.engines import pack_partitioned
from shardio.packing.merging import merge_partitions
from shardio.packing.partfiles import PARTS_DIR, PLAN_FILE, part_dir
from shardio.packing.partitions import PartitionPlan, pack_partition, plan_partitions
from shardio.storage.statefiles import MAX_STATE_FILE_BYTES

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_folder_corpus(root, 6, seed=5)
    return root


@pytest.fixture(scope="module")
def packed(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output folder whose partitions (about three) have all committed, not merged yet."""
    out = tmp_path_factory.mktemp("packed") / "out"
    plan = plan_partitions(corpus, out, partition_bytes=1)
    for number in range(len(plan.partitions)):
        pack_partition(plan.job(number))
    return out


def _plan(corpus: Path, out: Path) -> PartitionPlan:
    return plan_partitions(corpus, out, partition_bytes=1)


def _fifo_fed_late(path: Path) -> threading.Thread:
    """Make ``path`` a FIFO and, after 5 s, write to it: a reader that waits on it is freed, late."""
    path.unlink()
    os.mkfifo(path)

    def feed() -> None:
        time.sleep(5)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no reader waits: the FIFO was not opened
        os.write(fd, b'{"fingerprint": "0"}')
        os.close(fd)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(MAX_STATE_FILE_BYTES + 1)


PLANS: dict[str, Callable[[Path], object]] = {
    "list": lambda path: path.write_text("[1, 2]"),
    "deep": lambda path: path.write_text(DEEP),
    "string": lambda path: path.write_text('"plan"'),
    "fingerprint-not-a-string": lambda path: path.write_text('{"fingerprint": [1]}'),
    "garbage": lambda path: path.write_bytes(b"\xff\xfe{"),
    "huge": _sparse,
    "fifo": _fifo_fed_late,
    "directory": lambda path: (path.unlink(), path.mkdir()),
}


@pytest.mark.parametrize("hostile", sorted(PLANS))
def test_a_hostile_plan_file_is_a_format_error_naming_it(corpus: Path, tmp_path: Path, hostile: str) -> None:
    out = tmp_path / "out"
    _plan(corpus, out)
    plan_file = out / PLAN_FILE
    PLANS[hostile](plan_file)
    started = time.monotonic()
    with pytest.raises(FormatError, match="plan.json") as caught:
        _plan(corpus, out)
    assert time.monotonic() - started < 4  # a FIFO is not waited on, a huge file not read
    assert "Traceback" not in str(caught.value)


REPORTS: dict[str, Callable[[Path], object]] = {
    "list": lambda path: path.write_text("[]"),
    "deep": lambda path: path.write_text(DEEP),
    "problems-not-a-list": lambda path: path.write_text('{"problems": 3, "input_bytes": 0, "plan": ""}'),
    "problem-with-an-extra-key": lambda path: path.write_text(
        '{"problems": [{"source": "a", "key": "k", "reason": "r", "run": 1}], "input_bytes": 0, "plan": ""}'
    ),
    "problem-not-strings": lambda path: path.write_text(
        '{"problems": [{"source": 1, "key": "k", "reason": "r"}], "input_bytes": 0, "plan": ""}'
    ),
    "more-problems-than-inputs": lambda path: path.write_text(
        json.dumps(
            {
                "problems": [{"source": "a", "key": f"k{i}", "reason": "r"} for i in range(50)],
                "input_bytes": 0,
            }
        )
    ),
    "input-bytes-a-string": lambda path: path.write_text('{"problems": [], "input_bytes": "12", "plan": ""}'),
    "input-bytes-huge": lambda path: path.write_text(
        '{"problems": [], "input_bytes": ' + "9" * 5000 + ', "plan": ""}'
    ),
    "plan-not-a-string": lambda path: path.write_text('{"problems": [], "input_bytes": 0, "plan": 7}'),
    "huge": _sparse,
    "fifo": _fifo_fed_late,
}


@pytest.mark.parametrize("hostile", sorted(REPORTS))
def test_a_hostile_partition_report_is_a_format_error_naming_it(
    corpus: Path, packed: Path, tmp_path: Path, hostile: str
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    plan = _plan(corpus, out)
    REPORTS[hostile](out / part_dir(1) / "report.json")
    started = time.monotonic()
    with pytest.raises(FormatError, match="report.json"):
        merge_partitions(plan)
    assert time.monotonic() - started < 4
    assert not (out / "index.json").exists()


def test_the_merge_removes_only_what_the_plan_wrote(
    corpus: Path, packed: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    shutil.copytree(packed, out)
    plan = _plan(corpus, out)
    planted = [out / PARTS_DIR / "notes.txt", out / part_dir(0) / "mine.bin", out / PARTS_DIR / "x" / "y"]
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not shardio's")
    with caplog.at_level(logging.WARNING, logger="shardio.packing.partfiles"):
        merge_partitions(plan)
    assert (out / "index.json").is_file()
    assert "left in place" in caplog.text and PARTS_DIR in caplog.text
    for path in planted:
        assert path.read_text() == "not shardio's"
    left = sorted(p.relative_to(out / PARTS_DIR).as_posix() for p in (out / PARTS_DIR).rglob("*"))
    assert left == ["00000", "00000/mine.bin", "notes.txt", "x", "x/y"]  # every file the pack wrote is gone


def test_a_failed_run_removes_only_what_it_wrote(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 4, subdirs=1)
    (corpus / "d0" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    out = tmp_path / "out"
    planted = out / PARTS_DIR / "00000" / "notes.txt"

    def planting(plan: PartitionPlan, numbers: list[int]) -> None:
        planted.parent.mkdir(parents=True, exist_ok=True)
        planted.write_text("not shardio's")
        for number in numbers:
            pack_partition(plan.job(number))

    with pytest.raises(InputError, match="broken"):
        pack_partitioned(corpus, out, engine=planting, partition_bytes=10**9, progress=False)
    assert planted.read_text() == "not shardio's"
    assert not (out / PLAN_FILE).exists() and not (out / part_dir(0) / "report.json").exists()
