"""Hostile files in a dataset: signed tar sizes, control and bidi characters in names, malformed index.json,
index and shard files that are not regular files (FIFOs, devices, links out of the root), and a format-1
columns file whose arrays claim more entries than the header's sample count.

Each case fails with a typed :class:`~shardio.errors.ShardioError` naming the file, quickly: code that hung
or allocated without bound before runs in a subprocess under a time and address-space limit, or in a
thread that the test unblocks (by opening the FIFO's other end) if it does not finish.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hostile import rewrite_header, run_limited, to_format1
from sample_shards import wav_bytes
from test_confinement import _shard, dataset  # noqa: F401  (fixture: a small dataset; its shard files)

from shardio import FormatError, Index, ShardDataset
from shardio.packing.indexer import build_index
from shardio.packing.verification import verify_dataset
from shardio.reading.reader import Reader
from shardio.shards.names import key_problem
from shardio.shards.tarformat import encode_sample, parse_members, walk

pytestmark = pytest.mark.timeout(300)


def _in_child(code: str, *, headroom_mb: int = 256, timeout: float = 60) -> str:
    """Run ``code`` in a subprocess limited in time and memory; its stdout (a hang fails the test)."""
    try:
        result = run_limited(
            code, headroom_mb=headroom_mb, timeout=timeout, preload="shardio.datasets.dataset, torch"
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _finishes(action: Callable[[], Any], fifos: list[Path], timeout: float = 20) -> BaseException | None:
    """Run ``action`` in a thread; what it raised (None: nothing). If it is still blocked after ``timeout``
    seconds, open and close the write end of each FIFO to let it go on, and fail."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(timeout)
        pytest.fail(f"blocked for {timeout} s on a FIFO")
    return raised[0] if raised else None


# -- 1: tar size fields that are not plain octal digits --------------------------------------------------


def _with_size_field(field: bytes, data: bytes = b"\0" * 10) -> bytes:
    """A one-member tar (then an end-of-archive) whose size field is ``field``, its checksum made to hold."""
    sample = encode_sample("k", {"wav": data})
    header = bytearray(sample[:512])
    header[124:136] = field
    header[148:156] = b"        "
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + sample[512:] + b"\0" * 1024


_SIGNED = [
    b"-0000001000\0",
    b"-0000000001\0",
    b"0x000000012\0",
    *(
        pytest.param(field, marks=pytest.mark.slow)  # one child process each: the rest in the slow tier
        for field in (b"  -1000    \0", b"+0000000012\0", b"0000_000012\0", b"\t0000000012\0")
    ),
]


@pytest.mark.parametrize("field", _SIGNED, ids=lambda field: repr(field.rstrip(b"\0").strip()))
def test_a_tar_size_that_is_not_octal_digits_is_a_format_error(field: bytes) -> None:
    code = f"""
import io
from shardio.errors import FormatError
from shardio.shards.tarformat import parse_members, walk
data = {_with_size_field(field)!r}
for attempt in (lambda: parse_members(data, "shard s.tar"),
                lambda: list(walk(io.BytesIO(data), "shard s.tar"))):
    try:
        attempt()
        print("parsed")
    except FormatError as exc:
        print("FormatError", exc)
"""
    lines = _in_child(code).splitlines()
    assert len(lines) == 2 and all(line.startswith("FormatError shard s.tar") for line in lines), lines
    assert all("not octal digits" in line for line in lines), lines


@pytest.mark.parametrize(
    "field", [b"00000000012\0", b"         12\0", b"00000000012 ", b"000000000012", b"   12 \0\0\0\0\0\0"]
)
def test_octal_sizes_padded_as_tar_writers_pad_them_are_read(field: bytes) -> None:
    data = _with_size_field(field, b"0123456789")
    assert [(name, bytes(view)) for name, view in parse_members(data, "s")] == [("k.wav", b"0123456789")]
    assert [(member.name, member.size) for member, _ in walk(io.BytesIO(data), "s")] == [("k.wav", 10)]


def test_a_negative_size_in_a_shard_fails_iteration_verify_and_index(dataset: Path) -> None:
    index = Index.load(dataset)
    shard = dataset / index.shards[0].name
    offset = int(index.columns["frame_offset"][1])
    with open(shard, "r+b") as handle:
        handle.seek(offset)
        header = bytearray(handle.read(512))
        header[124:136] = b"-0000001000\0"
        header[148:156] = b"        "
        header[148:156] = b"%06o\0 " % sum(header)
        handle.seek(offset)
        handle.write(header)
    code = f"""
from shardio import ShardDataset
from shardio.errors import FormatError
from shardio.packing.indexer import build_index
from shardio.packing.verification import verify_dataset
try:
    for batch in ShardDataset({str(dataset)!r}, batch_size=2, shuffle=False):
        pass
except FormatError as exc:
    print("iterate: FormatError", exc)
print("verify:", verify_dataset({str(dataset)!r}, progress=False))
try:
    build_index([{str(shard)!r}], out_dir={str(dataset.parent / "again")!r}, progress=False)
except FormatError as exc:
    print("index: FormatError", exc)
"""
    out = _in_child(code)
    assert f"iterate: FormatError shard {shard}, key 's000_00001'" in out, out
    assert "verify: [" in out and f"{shard.name}: sample 's000_00001': shard {shard}" in out, out
    assert f"index: FormatError {shard}" in out and "not octal digits" in out, out


# -- 2: control and bidi characters in names ----------------------------------------------------------

_HIDDEN = [
    "evil\u009b2J.tar",
    "raT\u202e.tar",
    "a\u2066b\u2069.tar",
    "a\u200e.tar",
    "a\u200f.tar",
    "a\x7f.tar",
    "a\u061c.tar",
    "a\u0085.tar",
]


@pytest.mark.parametrize("name", _HIDDEN, ids=ascii)
def test_shard_names_with_control_or_bidi_characters_are_refused(dataset: Path, name: str) -> None:
    shard = _shard(dataset)
    os.replace(shard, dataset / name)  # the file is there: only the name is wrong
    rewrite_header(dataset, lambda header: header["shards"][0].update(name=name))
    with pytest.raises(FormatError, match="shard name") as caught:
        Index.load(dataset)
    message = str(caught.value)
    assert repr(name) in message
    assert not any(ch in message for ch in name if not ch.isprintable())
    problems = verify_dataset(dataset, progress=False)
    assert len(problems) == 1 and "shard name" in problems[0]
    assert not any(ch in problems[0] for ch in name if not ch.isprintable())


@pytest.mark.parametrize("name", ["données-ü.tar", "音声 1.tar", "dir:x/a-b_c.tar", "می\u200cخواهم.tar"])
def test_printable_unicode_shard_names_are_taken(dataset: Path, name: str) -> None:
    shard = _shard(dataset)
    (dataset / name).parent.mkdir(exist_ok=True)
    os.replace(shard, dataset / name)
    rewrite_header(dataset, lambda header: header["shards"][0].update(name=name))
    assert Index.load(dataset).shards[0].name == name
    assert verify_dataset(dataset, progress=False) == []


@pytest.mark.parametrize("key", ["a\u202eb", "a\u009bb", "a\x7fb", "a\u2067b"], ids=ascii)
def test_member_keys_with_control_or_bidi_characters_are_refused(tmp_path: Path, key: str) -> None:
    assert key_problem(key) is not None
    assert key_problem("ключ/音声") is None
    shard = tmp_path / "s.tar"
    shard.write_bytes(
        encode_sample("fine", {"wav": wav_bytes(np.zeros(80, np.float32), 8000)})
        + encode_sample(key, {"wav": wav_bytes(np.zeros(80, np.float32), 8000)})
        + b"\0" * 1024
    )
    with pytest.raises(FormatError, match="control") as caught:
        build_index([shard], progress=False)
    assert key not in str(caught.value) and key[1] not in str(caught.value)


# -- 3: index.json that json cannot hold ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,
        '{"format": "shardio-index", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"format": "shardio-index", "samples": 1' + "0" * 5000 + "}",
    ],
    ids=["nested", "nested-field", "digits"],
)
def test_malformed_index_json_is_a_format_error(dataset: Path, text: str) -> None:
    (dataset / "index.json").write_text(text)
    with pytest.raises(FormatError, match=f"{dataset / 'index.json'}: not a valid index file"):
        Index.load(dataset)


# -- 4: index and shard files that are not regular files ---------------------------------------------------


def test_an_index_json_fifo_is_refused_without_blocking(dataset: Path) -> None:
    (dataset / "index.json").unlink()
    os.mkfifo(dataset / "index.json")
    raised = _finishes(lambda: Index.load(dataset), [dataset / "index.json"])
    assert isinstance(raised, FormatError) and "not a regular file" in str(raised), raised
    assert str(dataset / "index.json") in str(raised)


def test_an_index_json_linked_to_a_device_is_not_read(dataset: Path) -> None:
    (dataset / "index.json").unlink()
    os.symlink("/dev/zero", dataset / "index.json")
    code = f"""
from shardio import Index
from shardio.errors import FormatError
try:
    Index.load({str(dataset)!r})
except FormatError as exc:
    print("FormatError", exc)
"""
    out = _in_child(code, headroom_mb=128, timeout=30)
    assert out.startswith(f"FormatError {dataset / 'index.json'}"), out


def test_an_index_json_linked_out_of_the_root_is_refused(dataset: Path) -> None:
    outside = dataset.parent / "elsewhere.json"
    os.replace(dataset / "index.json", outside)
    os.symlink(outside, dataset / "index.json")
    with pytest.raises(FormatError, match="outside the dataset root"):
        Index.load(dataset)
    os.unlink(dataset / "index.json")
    os.replace(outside, dataset / "real.json")
    os.symlink("real.json", dataset / "index.json")  # a link that stays inside the root is fine
    assert len(Index.load(dataset)) == 5


def test_format1_columns_that_are_a_fifo_are_refused_without_blocking(dataset: Path) -> None:
    to_format1(dataset)
    (dataset / "index.npz").unlink()
    os.mkfifo(dataset / "index.npz")
    raised = _finishes(lambda: Index.load(dataset), [dataset / "index.npz"])
    assert isinstance(raised, FormatError) and "not a regular file" in str(raised), raised
    assert "columns file" in str(raised)


def test_a_shard_fifo_fails_iteration_and_verify_without_blocking(dataset: Path) -> None:
    shard = _shard(dataset)
    shard.unlink()
    os.mkfifo(shard)
    raised = _finishes(lambda: list(ShardDataset(dataset, batch_size=2, shuffle=False)), [shard])
    assert isinstance(raised, FormatError) and "not a regular file" in str(raised), raised
    assert str(shard) in str(raised)
    found: list[list[str]] = []
    assert _finishes(lambda: found.append(verify_dataset(dataset, progress=False)), [shard]) is None
    assert found[0] and found[0][0].startswith(f"{shard.name}: not a regular file"), found


def test_a_shard_linked_to_a_device_fails_verify_and_reads(dataset: Path) -> None:
    shard = _shard(dataset)
    shard.unlink()
    os.symlink("/dev/zero", shard)
    code = f"""
from shardio import Index
from shardio.errors import ShardioError
from shardio.packing.verification import verify_dataset
from shardio.reading.reader import Reader
print(verify_dataset({str(dataset)!r}, allow_outside_root=True, progress=False))
try:
    Reader(Index.load({str(dataset)!r}, allow_outside_root=True)).members(0)
except ShardioError as exc:
    print(type(exc).__name__, exc)
"""
    out = _in_child(code, timeout=30)
    assert f"['{shard.name}: not a regular file" in out, out
    assert f"FormatError shard {shard}" in out and "not a regular file" in out, out


def test_a_directory_where_a_shard_should_be_is_a_format_error(dataset: Path) -> None:
    shard = _shard(dataset)
    shard.unlink()
    shard.mkdir()
    with pytest.raises(FormatError, match="not a regular file"):
        Reader(Index.load(dataset)).members(0)


# -- 5: format-1 columns that claim more entries than the header's sample count ----------------------------


def test_format1_columns_are_bounded_by_the_sample_count_before_decompressing(dataset: Path) -> None:
    to_format1(dataset)
    source = zipfile.ZipFile(dataset / "index.npz")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            if info.filename == "num_frames.npy":  # 2**26 entries (256 MiB) for 5 samples: 256 KiB deflated
                with target.open(info.filename, "w", force_zip64=True) as handle:
                    np.lib.format.write_array(handle, np.zeros(1 << 26, np.uint32))
            else:
                target.writestr(info.filename, source.read(info.filename))
    payload = out.getvalue()
    assert len(payload) < 1 << 20
    (dataset / "index.npz").write_bytes(payload)
    rewrite_header(dataset, lambda header: header.update(columns_sha256=hashlib.sha256(payload).hexdigest()))
    code = f"""
import time
from shardio import Index
from shardio.errors import ShardioError
start = time.monotonic()
try:
    Index.load({str(dataset)!r})
except ShardioError as exc:
    print(type(exc).__name__, round(time.monotonic() - start, 1), exc)
"""
    printed = _in_child(code, headroom_mb=96, timeout=60)
    assert printed.startswith("FormatError"), printed
    assert "'num_frames.npy' claims an array of shape (67108864,)" in printed and "5 samples" in printed, (
        printed
    )
    assert float(printed.split()[1]) < 2, printed


def test_format1_columns_of_the_right_sizes_still_load(dataset: Path) -> None:
    expected = Index.load(dataset)
    to_format1(dataset)
    index = Index.load(dataset)
    assert list(index.keys) == list(expected.keys)
    assert json.loads((dataset / "index.json").read_text())["version"] == 1


def test_a_malformed_shard_entry_shows_its_name_escaped_and_short(dataset: Path) -> None:
    name = "evil\u202e" + "x" * 100_000
    rewrite_header(dataset, lambda header: header["shards"][0].update(name=name, sha256=7))
    with pytest.raises(FormatError) as caught:
        Index.load(dataset)
    message = str(caught.value)
    assert "\u202e" not in message and len(message) < 400 and "sha256" in message
