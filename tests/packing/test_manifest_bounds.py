"""One bounded manifest reader for every command (issue 41): ``shardio pack`` on a JSONL or tarred NeMo
manifest and ``shardio index --nemo-manifest`` take and refuse the same lines, read no line further than 1
MiB, and refuse a manifest that is not a regular file for what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from audio_factory import write_tone
from test_nemo_index import write_tarred

from shardio.errors import InputError, ReadError
from shardio.integrations.importers.nemo_index import index_nemo
from shardio.packing.corpus import read_jsonl
from shardio.packing.manifestlines import MAX_DEPTH, MAX_LINE_BYTES, json_entry
from shardio.shards.index import Index

REPO = Path(__file__).resolve().parents[2]
MANIFEST = "tarred_audio_manifest.json"


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "shardio.cli", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _append_raw(root: Path, line: str) -> int:
    """Append ``line`` to the manifest in ``root``; its line number."""
    number = len((root / MANIFEST).read_bytes().splitlines()) + 1
    with (root / MANIFEST).open("a") as handle:
        handle.write(line + "\n")
    return number


# -- a field given twice: pack refused it, index --nemo-manifest kept the last value ------------------------


def _with_first_line_ending(root: Path, tail: str) -> None:
    """Add ``tail`` (``, "field": value``) to the manifest's first entry, as raw text."""
    first, rest = (root / MANIFEST).read_text().split("\n", 1)
    (root / MANIFEST).write_text(first.rstrip().removesuffix("}") + tail + "}\n" + rest)


@pytest.mark.parametrize("tail, field", [(', "text": "INJECTED"', "text"), (', "shard_id": 0', "shard_id")])
def test_index_nemo_refuses_a_field_given_twice_as_pack_does(tmp_path: Path, tail: str, field: str) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    _with_first_line_ending(tmp_path, tail)
    result = _cli("index", tmp_path, "--nemo-manifest", tmp_path / MANIFEST, "--no-progress")
    # exit 0 before, the sample reading 'INJECTED' (json keeps the last of two fields)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{MANIFEST}:1: not a valid manifest line: the field '{field}' appears twice" in result.stderr
    assert not (tmp_path / "index.json").exists()


# -- nesting and line length: one bound for pack and index ---------------------------------------------------


def test_pack_refuses_a_line_nested_too_deeply_without_a_traceback(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav")
    write_tone(tmp_path / "b.wav", seed=1)
    deep = "[" * 1500 + "]" * 1500
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(f'{{"audio_filepath": "a.wav"}}\n{{"audio_filepath": "b.wav", "x": {deep}}}\n')
    result = _cli("pack", manifest, tmp_path / "out", "--no-progress")
    assert result.returncode == 2 and "Traceback" not in result.stderr, (
        result.stderr
    )  # a RecursionError before
    assert (
        f"{manifest}:2: not a valid manifest line: the JSON is nested more than {MAX_DEPTH} deep"
        in result.stderr
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 900, 5000])
def test_nesting_is_bounded_the_same_below_and_above_the_recursion_limit(depth: int) -> None:
    text = '{"x": ' + "[" * depth + "]" * depth + "}"
    if depth < MAX_DEPTH:
        assert json_entry(text)["x"] == json.loads(text)["x"]
    else:
        with pytest.raises(ValueError, match="nested more than"):
            json_entry(text)


def _traced_peak(read: object) -> int:
    tracemalloc.start()
    try:
        read()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_jsonl_line_is_a_problem_and_is_never_read_whole(tmp_path: Path) -> None:
    write_tone(tmp_path / "a.wav")
    write_tone(tmp_path / "b.wav", seed=1)
    manifest = tmp_path / "m.jsonl"
    with manifest.open("w") as handle:  # a 40 MB transcript: pack kept it whole (300 MB, 1.8 GB RSS)
        handle.write('{"audio_filepath": "a.wav", "text": "' + "x" * (40 << 20) + '"}\n')
        handle.write('{"audio_filepath": "b.wav", "text": "fine"}\n')
    problems: list = []
    sources: list = []
    peak = _traced_peak(lambda: sources.extend(read_jsonl(manifest, problems)))
    assert [s.key for s in sources] == ["b"]
    assert len(problems) == 1 and problems[0].source == f"{manifest}:1"
    assert f"a line of more than {MAX_LINE_BYTES} bytes" in problems[0].reason
    assert peak < 4 * MAX_LINE_BYTES, peak


def test_index_nemo_skips_a_long_line_in_bounded_memory(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    number = _append_raw(
        tmp_path, '{"audio_filepath": "y.wav", "shard_id": 0, "text": "' + "x" * (40 << 20) + '"}'
    )
    caught: list[InputError] = []

    def index() -> None:
        try:
            index_nemo(tmp_path, progress=False)
        except InputError as exc:
            caught.append(exc)

    peak = _traced_peak(index)  # 650 MB RSS for a 300 MB line before: it was read whole to be skipped
    assert len(caught) == 1 and f"{MANIFEST}:{number}: a line of more than {MAX_LINE_BYTES} bytes" in str(
        caught[0]
    )
    assert peak < 4 * MAX_LINE_BYTES + (8 << 20), peak


# -- index --nemo-manifest: what the manifest and the directory may be
# ----------------------------------------


def _refused(root: Path, *needles: str) -> None:
    with pytest.raises(InputError) as error:
        index_nemo(root, progress=False)
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))
    assert not (root / "index.json").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")
def test_a_manifest_that_is_a_fifo_or_a_directory_is_named_for_what_it_is(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    for name, what in (("fifo.json", "it is a FIFO"), ("dir.json", "it is a directory")):
        with pytest.raises(InputError, match=f"{name}: cannot read the manifest: {what}, not a regular file"):
            index_nemo(tmp_path, tmp_path / name, progress=False)  # "no such manifest file" before
    with pytest.raises(ReadError, match="no such manifest file"):
        index_nemo(tmp_path, tmp_path / "missing.json", progress=False)


def test_a_field_named_like_a_batch_field_is_refused_at_index_time(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    _with_first_line_ending(tmp_path, ', "keys": ["k"]')
    # indexed before (exit 0), and then every read of the sample raised
    _refused(tmp_path, f"{MANIFEST}:1: uses the field name(s) 'keys', which shardio reserves")


def test_a_tar_named_with_leading_zeros_is_a_problem_not_ignored(tmp_path: Path) -> None:
    write_tarred(tmp_path, count=4, shards=2)
    (tmp_path / "audio_01.tar").write_bytes((tmp_path / "audio_1.tar").read_bytes())
    _refused(tmp_path, "audio_01.tar: not a shard name NeMo writes (audio_1.tar, without leading zeros)")


def test_a_tar_linked_outside_the_directory_is_refused_at_index_time(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_tarred(root, count=4, shards=2)
    (root / "audio_1.tar").rename(tmp_path / "elsewhere.tar")
    (root / "audio_1.tar").symlink_to(tmp_path / "elsewhere.tar")
    # indexed before (exit 0), then the loader refused the shard
    _refused(root, "audio_1.tar: resolves (through a symbolic link) to a file outside the dataset directory")
    inside = root / "inside"
    inside.mkdir()
    (tmp_path / "elsewhere.tar").rename(inside / "real.tar")
    (root / "audio_1.tar").unlink()
    (root / "audio_1.tar").symlink_to(inside / "real.tar")
    assert len(index_nemo(root, progress=False)) == 5  # a link inside the directory reads as before
    assert len(Index.load(root)) == 5
