"""Hostile WeNet shard lists (``shardio index --wenet-list data.list``): a list is data, not orders. It never
makes shardio read outside the index's directory, read a FIFO, allocate for a huge line, or print the raw
bytes of a line; every problem is named at once, before any shard is read, and no index is written."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_wenet import UTTERANCES, write_wenet_shards

from shardio.errors import FormatError, InputError, ReadError
from shardio.integrations.importers.wenet_index import index_wenet
from shardio.packing.manifestlines import MAX_LINE_BYTES


def _refused(data_list: Path, *patterns: str) -> str:
    """Index ``data_list`` (in a thread, so a blocking read fails the test instead of hanging it): an
    InputError whose message holds each pattern and no control character; no index written."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            index_wenet(data_list, progress=False)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "indexing the list blocked"
    error = outcome[0]
    assert isinstance(error, InputError), error
    message = str(error)
    for pattern in patterns:
        assert pattern in message, message
    assert all(ch.isprintable() or ch == "\n" for ch in message), repr(message)
    assert not (data_list.parent / "index.json").exists()
    return message


@pytest.fixture
def wenet(tmp_path: Path) -> Path:
    """A good WeNet list of two shards (``tmp_path/data/data.list``) and a shard outside its directory."""
    data = tmp_path / "data"
    data_list = write_wenet_shards(data, UTTERANCES[:8])
    write_wenet_shards(tmp_path / "outside", UTTERANCES[8:10])
    return data_list


def _append(data_list: Path, *lines: str | bytes) -> None:
    with open(data_list, "ab") as handle:
        for line in lines:
            handle.write((line.encode() if isinstance(line, str) else line) + b"\n")


def test_shards_outside_the_index_directory_are_refused(wenet: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "shards" / "shards_000000000.tar"
    link = wenet.parent / "shards" / "linked.tar"
    link.symlink_to(outside)
    _append(
        wenet,
        str(outside),
        os.path.relpath(outside, Path.cwd()),
        str(link),
        str(wenet.parent / ".." / "x.tar"),
    )
    message = _refused(wenet, "data.list:3", "data.list:4", "data.list:5", "data.list:6", "lies outside")
    assert message.count("lies outside the index's directory") == 4


def test_a_fifo_list_and_a_fifo_shard_are_refused_without_blocking(wenet: Path) -> None:
    fifo_list = wenet.parent / "fifo.list"
    os.mkfifo(fifo_list)
    _refused(fifo_list, "it is a FIFO, not a regular file")
    fifo_shard = wenet.parent / "shards" / "fifo.tar"
    os.mkfifo(fifo_shard)
    _append(wenet, str(fifo_shard))
    _refused(wenet, "data.list:3", "it is a FIFO, not a regular file")


def test_a_huge_line_is_refused_without_being_read_whole(wenet: Path) -> None:
    _append(wenet, "a" * (MAX_LINE_BYTES + 10))
    message = _refused(wenet, "data.list:3", f"a line of more than {MAX_LINE_BYTES} bytes")
    assert len(message) < 2000


def test_a_long_path_is_named_shortened(wenet: Path) -> None:
    _append(wenet, str(wenet.parent / ("b" * 5000 + ".tar")))
    message = _refused(wenet, "data.list:3")
    assert len(message) < 2000


def test_urls_control_characters_and_bad_bytes_are_refused_escaped(wenet: Path) -> None:
    _append(
        wenet,
        "http://example.com/shards_000000000.tar",
        "s3://bucket/shards_000000001.tar",
        str(wenet.parent / "shards" / "evil\x1b[2J\u202e.tar"),
        b"\xff\xfe.tar",
        str(wenet.parent / "shards" / "nul\x00.tar"),
    )
    message = _refused(wenet, "is a http:// URL", "is a s3:// URL", "holds a control character", "not UTF-8")
    assert "\\x1b" in message and "\x1b" not in message and "\u202e" not in message


def test_a_shard_listed_twice_missing_or_not_a_tar_is_named(wenet: Path) -> None:
    first = wenet.read_text().splitlines()[0]
    (wenet.parent / "notes.zip").write_bytes(b"PK")
    _append(
        wenet, first, f"file://{first}", str(wenet.parent / "missing.tar"), str(wenet.parent / "notes.zip")
    )
    _refused(
        wenet,
        "data.list:3: the shard",
        "is listed twice (first at",
        "data.list:4",
        "missing.tar (No such file or directory)",
        "is not a tar shard's name",
    )


def test_an_empty_or_missing_list_is_an_error_not_an_empty_index(wenet: Path) -> None:
    empty = wenet.parent / "empty.list"
    empty.write_text("\n  \n")
    with pytest.raises(FormatError, match="names no shards"):
        index_wenet(empty, progress=False)
    with pytest.raises(ReadError, match="no such shard list"):
        index_wenet(wenet.parent / "absent.list", progress=False)
    assert not (wenet.parent / "index.json").exists()


def test_a_shard_that_is_not_a_tar_is_a_format_error_and_writes_no_index(wenet: Path) -> None:
    bad = wenet.parent / "shards" / "garbage.tar"
    bad.write_bytes(os.urandom(3000))
    _append(wenet, str(bad))
    with pytest.raises(FormatError):
        index_wenet(wenet, progress=False)
    assert not (wenet.parent / "index.json").exists()
