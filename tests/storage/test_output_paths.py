"""An output path that exists and is not a regular file is refused, never replaced or written into (issue
41): ``quarantine --out /dev/full`` run as root replaced the system's /dev/full with a regular file, and
writing to a FIFO blocked. Device nodes here are made with ``os.mknod`` in a temporary directory (root only),
never /dev's."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import wav_bytes
from test_state_validation import data, valid  # noqa: F401  (fixtures: a small dataset, a valid state of it)

from shardio import Index, OutputError, ShardWriter
from shardio.cli import main
from shardio.storage.files import check_output_file, open_output, write_atomic

pytestmark = pytest.mark.timeout(60)  # a FIFO opened for writing blocked until a reader came: a hang fails

KINDS = ["fifo", "device", "directory"]


def special(path: Path, kind: str) -> Path:
    """A FIFO, a character device (a copy of /dev/full's numbers, made here) or a directory at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("making a device node needs root")
    else:
        path.mkdir()
    return path


def same_kind(path: Path, kind: str) -> bool:
    mode = os.lstat(path).st_mode
    return {"fifo": stat.S_ISFIFO, "device": stat.S_ISCHR, "directory": stat.S_ISDIR}[kind](mode)


@pytest.mark.parametrize("kind", KINDS)
def test_quarantine_out_is_refused_where_it_is_not_a_regular_file(
    data: str, valid: dict[str, Any], kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(valid))
    out = special(tmp_path / "out", kind)
    key = Index.load(data).keys[0]
    capsys.readouterr()
    code = main(["quarantine", data, "--state", str(state), "--key", key, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 3 and "not a regular file" in err, err  # exit 0 before, the node replaced by a file
    assert same_kind(out, kind)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "state.json"]  # no temporary left behind
    fresh = tmp_path / "new"
    assert main(["quarantine", data, "--state", str(state), "--key", key, "--out", str(fresh)]) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_write_atomic_and_open_output_refuse_it(tmp_path: Path, kind: str) -> None:
    target = special(tmp_path / "target", kind)
    for write in (
        lambda: write_atomic(str(target), b"x"),
        lambda: open_output(target).close(),
        lambda: check_output_file(target),
    ):
        with pytest.raises(OutputError, match="not a regular file"):
            write()
        assert same_kind(target, kind)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OutputError, match="not a regular file"):
        write_atomic(str(link), b"x")  # followed: a link to a device is refused too


def test_regular_files_and_new_names_are_written_as_before(tmp_path: Path) -> None:
    write_atomic(str(tmp_path / "new"), b"one")
    write_atomic(str(tmp_path / "new"), b"two")
    with open_output(tmp_path / "other") as out:
        out.write(b"three")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    write_atomic(str(tmp_path / "dangling"), b"four")
    assert [(tmp_path / n).read_bytes() for n in ("new", "other", "dangling")] == [b"two", b"three", b"four"]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_index_is_not_saved_over_a_special_file(data: str, tmp_path: Path, kind: str) -> None:
    index = Index.load(data)
    special(tmp_path / "index.json", kind)
    with pytest.raises(OutputError, match="index.json: it is"):
        index.save(str(tmp_path))
    assert same_kind(tmp_path / "index.json", kind)


def write_one(writer: ShardWriter) -> None:
    writer.write(
        "a",
        {"wav": wav_bytes(np.zeros(80, np.float32), 8000)},
        audio_ext="wav",
        num_frames=80,
        sample_rate=8000,
        channels=1,
    )


@pytest.mark.parametrize("name", [".shard.writing", ".shardio.lock"])
def test_a_shard_writer_neither_blocks_on_nor_writes_into_a_fifo(tmp_path: Path, name: str) -> None:
    special(tmp_path / name, "fifo")
    with pytest.raises(OutputError, match="a FIFO, not a regular file"), ShardWriter(tmp_path) as writer:
        write_one(writer)
    assert same_kind(tmp_path / name, "fifo")


def test_a_finished_shard_does_not_replace_a_device(tmp_path: Path) -> None:
    special(tmp_path / "shard-000000.tar", "device")
    refused = pytest.raises(OutputError, match="shard-000000.tar: it is a character device")
    with refused, ShardWriter(tmp_path, overwrite=True) as writer:
        write_one(writer)
    assert same_kind(tmp_path / "shard-000000.tar", "device")


def test_bench_results_and_the_demo_corpus_refuse_a_fifo(tmp_path: Path) -> None:
    from shardio.bench.report import write_results
    from shardio.synth import make_corpus

    special(tmp_path / "bench.md", "fifo")
    with pytest.raises(OutputError, match="bench.md: it is a FIFO"):
        write_results(tmp_path, "bench", {}, "text")  # Path.write_text blocked here
    (tmp_path / "corpus" / "spk00").mkdir(parents=True)
    special(tmp_path / "corpus" / "spk00" / "spk00_0000.txt", "fifo")
    with pytest.raises(OutputError, match="spk00_0000.txt: it is a FIFO"):
        make_corpus(tmp_path / "corpus", num_files=1, speakers=1, min_seconds=0.1, max_seconds=0.1)


def test_a_verified_marker_that_is_a_fifo_is_not_blocked_on(tmp_path: Path) -> None:
    from shardio.shards.indexcache import mark_verified

    special(tmp_path / "marker", "fifo")
    mark_verified(str(tmp_path / "marker"))  # best effort: skipped, not a hang
    assert same_kind(tmp_path / "marker", "fifo")
