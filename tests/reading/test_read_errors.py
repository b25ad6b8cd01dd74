"""Bad data at read time, on real shards: truncated, missing or replaced shards, corrupt tar headers and zstd
frames, members that are not audio or hold NaN/Inf/no samples, missing or outdated indexes.

``on_error="raise"`` raises a typed error naming the shard file, key and offset; ``on_error="skip"`` logs,
counts (``ShardDataset.stats``, each batch's ``skipped``) and still yields every planned batch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_shards import make_uneven_dataset, wav_bytes
from torch.utils.data import DataLoader

from shardio import DecodeError, FormatError, Index, IntegrityError, ReadError, ShardDataset, ShardWriter
from shardio.errors import ShardioError
from shardio.packing.verification import verify_dataset
from shardio.reading.reader import Reader

RATE = 8000


def first_error(dataset: ShardDataset) -> ShardioError:
    """Iterate ``dataset`` in this process until it raises; the error (a ShardioError, or the test fails)."""
    with pytest.raises(ShardioError) as caught:
        for _ in dataset:
            pass
    return caught.value


def assert_names_sample(exc: BaseException, index: Index, shard: int) -> None:
    """The message names a sample of shard number ``shard``: its file, its key and its offset."""
    message = str(exc)
    assert index.shard_path(shard) in message, message
    key = re.search(r"key '([^']+)'", message)
    assert key is not None, message
    sample = index.keys.index(key.group(1))
    assert int(index.columns["shard"][sample]) == shard, message
    assert f"offset {int(index.columns['frame_offset'][sample])}" in message, message


def write_custom(
    directory: Path, samples: list[tuple[str, bytes]], *, compression: str = "none", max_samples: int = 4
) -> Index:
    """A dataset of ``(key, wav member bytes)`` samples, whatever the bytes are."""
    with ShardWriter(directory, compression=compression, max_samples=max_samples) as writer:
        for key, data in samples:
            writer.write(key, {"wav": data}, audio_ext="wav", num_frames=400, sample_rate=RATE, channels=1)
    return Index.load(directory)


def good_wav(seed: int) -> bytes:
    return wav_bytes(np.random.default_rng(seed).uniform(-0.5, 0.5, 400).astype(np.float32), RATE)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture(params=["none", "zstd"])
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> Index:
    """Two shards of four short WAV samples, plain or zstd."""
    return make_uneven_dataset(tmp_path / "ds", [4, 4], compression=request.param, duration_range=(0.05, 0.1))


# -- shard files -------------------------------------------------------------------------------------


def test_truncated_shard_fails_at_open(dataset: Index) -> None:
    path = dataset.shard_path(1)
    os.truncate(path, os.path.getsize(path) - 700)
    exc = first_error(ShardDataset(dataset.root, batch_size=2))
    assert isinstance(exc, IntegrityError)
    assert f"has {dataset.shards[1].bytes - 700} bytes, the index recorded {dataset.shards[1].bytes}" in str(
        exc
    )
    assert_names_sample(exc, dataset, 1)


_TRUNCATE_WHILE_OPEN = """
import os, sys
from shardio import FormatError, Index
from shardio.reading.reader import Reader
index = Index.load(sys.argv[1])
in_shard_1 = [i for i in range(len(index)) if int(index.columns["shard"][i]) == 1]
reader = Reader(index)
reader.members(in_shard_1[0])  # opens shard 1 (and maps it, where the kernel allows)
last = in_shard_1[-1]
os.truncate(index.shard_path(1), int(index.columns["frame_offset"][last]) + 100)
try:
    reader.members(last)
except FormatError as exc:
    print("FormatError:", exc)
    sys.exit(0)
sys.exit(3)
"""


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_shard_truncated_while_open_is_a_typed_error(tmp_path: Path, compression: str) -> None:
    """A shard truncated in place after it was opened (and memory-mapped) fails the read with a FormatError;
    touching mapped pages past the new end would have killed the process with SIGBUS (run in a child)."""
    # samples of 64-80 KB: several pages each, and a zstd frame each
    index = make_uneven_dataset(tmp_path / "ds", [2, 4], compression=compression, duration_range=(4.0, 5.0))
    child = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_WHILE_OPEN, index.root],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr)
    assert "wanted" in child.stdout and "the shard changed after it was opened" in child.stdout


def test_plain_shards_are_read_through_a_checked_memory_map(tmp_path: Path) -> None:
    index = make_uneven_dataset(tmp_path / "ds", [3], duration_range=(0.05, 0.1))
    reader = Reader(index)
    first = reader.members(0)["wav"]
    shard = reader._handles[0]
    if sys.platform == "linux":
        assert shard._map is not None  # this kernel has MADV_POPULATE_READ (Linux 5.14+)
        assert first.obj is shard._map  # a view of the map: no copy
    assert all(
        reader.members(i)["wav"].tobytes() == Reader(index).members(i)["wav"].tobytes() for i in range(3)
    )


def test_missing_shard(dataset: Index) -> None:
    os.unlink(dataset.shard_path(0))
    exc = first_error(ShardDataset(dataset.root, batch_size=2))
    assert isinstance(exc, ReadError) and "is missing" in str(exc)
    assert_names_sample(exc, dataset, 0)


def test_replaced_shard_of_another_size(dataset: Index, tmp_path: Path) -> None:
    other = make_uneven_dataset(tmp_path / "other", [5], compression=dataset.shards[0].codec, seed=7)
    shutil.copyfile(other.shard_path(0), dataset.shard_path(0))
    exc = first_error(ShardDataset(dataset.root, batch_size=2))
    assert isinstance(exc, IntegrityError) and "replaced or truncated" in str(exc)


def test_replaced_shard_of_the_same_size_fails_the_key_check(tmp_path: Path) -> None:
    # shards 0 and 1 hold the same audio under other keys: same size, other bytes
    index = write_custom(
        tmp_path / "ds",
        [(f"a{i}", good_wav(i)) for i in range(4)] + [(f"b{i}", good_wav(i)) for i in range(4)],
    )
    assert index.shards[0].bytes == index.shards[1].bytes
    shutil.copyfile(index.shard_path(1), index.shard_path(0))
    exc = first_error(ShardDataset(index.root, batch_size=2))
    assert isinstance(exc, FormatError) and re.search(
        r"found member 'b\d\.wav' where the index expects key", str(exc)
    )
    assert_names_sample(exc, index, 0)


def test_same_size_data_change_is_left_to_verify(tmp_path: Path) -> None:
    """Changed audio bytes in a plain .tar (headers intact) read without error;
    ``verify`` reports the shard."""
    index = make_uneven_dataset(tmp_path / "ds", [3], duration_range=(0.05, 0.1))
    flip(index.shard_path(0), int(index.columns["frame_offset"][1]) + 512 + 100)  # inside sample 1's WAV data
    reader = Reader(Index.load(index.root))  # loaded after the change (the index at hand: ShardChanged)
    assert all(reader.members(i) for i in range(len(index)))
    assert any("SHA-256" in problem for problem in verify_dataset(index.root))


def test_corrupt_tar_header(tmp_path: Path) -> None:
    index = make_uneven_dataset(tmp_path / "ds", [4, 4], duration_range=(0.05, 0.1))
    flip(index.shard_path(1), int(index.columns["frame_offset"][6]) + 3)  # a byte of sample 6's member name
    exc = first_error(ShardDataset(index.root, batch_size=2))
    assert isinstance(exc, FormatError) and "tar header checksum mismatch" in str(exc)
    assert_names_sample(exc, index, 1)
    assert index.keys[6] in str(exc)


def test_corrupt_zstd_frame(tmp_path: Path) -> None:
    index = make_uneven_dataset(tmp_path / "ds", [4, 4], compression="zstd", duration_range=(0.05, 0.1))
    offset, size = int(index.columns["frame_offset"][4]), int(index.columns["frame_size"][4])
    flip(index.shard_path(1), offset + size // 2)
    exc = first_error(ShardDataset(index.root, batch_size=2))
    assert isinstance(exc, FormatError) and "corrupt zstd frame" in str(exc)
    assert_names_sample(exc, index, 1)


def test_zstd_frame_header_claiming_a_huge_size_is_not_allocated(tmp_path: Path) -> None:
    # 5 s samples: 80 KB frames, whose content size takes a 4-byte field in the frame header
    index = make_uneven_dataset(tmp_path / "ds", [2], compression="zstd", duration_range=(5.0, 5.0))
    path = index.shard_path(0)
    data = bytearray(Path(path).read_bytes())
    descriptor = data[
        4
    ]  # after the magic: FCS field width (top 2 bits), single segment (bit 5), dict id (0-1)
    assert descriptor >> 6 == 2 and descriptor & 3 == 0
    size_field = 5 + (0 if descriptor & 0x20 else 1)  # a window byte comes first unless single-segment
    data[size_field + 3] = 0xFF  # content size now over 4 GB
    Path(path).write_bytes(bytes(data))
    with pytest.raises(FormatError, match="its header claims 4[0-9]{9} bytes"):
        Reader(Index.load(index.root)).members(0)


# -- member bytes ------------------------------------------------------------------------------------


def float_wav(values: list[float]) -> bytes:
    return wav_bytes(np.asarray(values, dtype=np.float32), RATE, subtype="FLOAT")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"this is not audio, just text in a .wav member", "could not be decoded as wav audio"),
        (float_wav([0.1, float("nan"), 0.2]), "NaN or infinite"),
        (float_wav([0.1, float("inf")]), "NaN or infinite"),
        (float_wav([]), "has no samples"),
    ],
    ids=["not-audio", "nan", "inf", "empty"],
)
def test_bad_member_raises_decode_error(tmp_path: Path, data: bytes, reason: str) -> None:
    index = write_custom(tmp_path / "ds", [("good0", good_wav(0)), ("bad", data), ("good1", good_wav(1))])
    exc = first_error(ShardDataset(index.root, batch_size=3))
    assert isinstance(exc, DecodeError) and reason in str(exc)
    assert "key 'bad'" in str(exc)
    assert_names_sample(exc, index, 0)


def write_with_json(directory: Path, metadata: bytes) -> Index:
    """Three samples; the first one's json member is ``metadata``."""
    with ShardWriter(directory, max_samples=4) as writer:
        for seed, key in enumerate(["odd", "good0", "good1"]):
            meta = metadata if key == "odd" else b'{"text": "fine"}'
            writer.write(
                key,
                {"wav": good_wav(seed), "json": meta},
                audio_ext="wav",
                num_frames=400,
                sample_rate=RATE,
                channels=1,
            )
    return Index.load(directory)


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        (b'{"text": "cut off', "not valid JSON"),
        (b'{"text": "a"} {"text": "b"}', "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b'["a", "list"]', "holds a JSON list, expected an object"),
        (b"[" * 100_000, "not valid JSON"),
    ],
    ids=["cut-off", "two-values", "not-utf8", "list", "too-deep"],
)
def test_bad_json_member_is_a_format_error(tmp_path: Path, metadata: bytes, reason: str) -> None:
    index = write_with_json(tmp_path / "ds", metadata)
    exc = first_error(ShardDataset(index.root, batch_size=3))
    assert isinstance(exc, FormatError) and reason in str(exc), str(exc)
    assert "key 'odd'" in str(exc)


@pytest.mark.parametrize(
    "metadata",
    [
        b'{"text": "caf\xc3\xa9", "n": [1, 2.5, null]}',
        b'\xef\xbb\xbf{"text": "caf\xc3\xa9", "n": [1, 2.5, null]}',  # a UTF-8 byte order mark
        b' \n{"text": "caf\xc3\xa9", "n": [1, 2.5, null]}\n',
        '{"text": "caf\u00e9", "n": [1, 2.5, null]}'.encode("utf-16"),
    ],
    ids=["plain", "bom", "whitespace", "utf-16"],
)
def test_json_members_read_as_json_loads_reads_them(tmp_path: Path, metadata: bytes) -> None:
    index = write_with_json(tmp_path / "ds", metadata)
    batch = next(iter(ShardDataset(index.root, batch_size=3, shuffle=False)))
    assert batch["keys"] == ["odd", "good0", "good1"]
    assert batch["text"] == ["caf\u00e9", "fine", "fine"]
    assert batch["n"] == [[1, 2.5, None], None, None]


# -- index files -------------------------------------------------------------------------------------


def test_index_missing(dataset: Index) -> None:
    os.unlink(os.path.join(dataset.root, "index.json"))
    with pytest.raises(FormatError, match="no index here"):
        ShardDataset(dataset.root)


def test_index_from_an_older_format_version(dataset: Index) -> None:
    path = os.path.join(dataset.root, "index.json")
    header = json.loads(Path(path).read_text())
    Path(path).write_text(json.dumps({**header, "version": 0}))
    with pytest.raises(FormatError, match=r"index format version 0; this shardio reads versions 1, 2"):
        ShardDataset(dataset.root)


def test_index_columns_from_another_dataset(dataset: Index, tmp_path: Path) -> None:
    other = make_uneven_dataset(tmp_path / "other", [4, 4], seed=3)
    shutil.copyfile(os.path.join(other.root, "index.columns"), os.path.join(dataset.root, "index.columns"))
    with pytest.raises(FormatError, match="do not belong together"):
        Index.load(dataset.root)


# -- skipping ----------------------------------------------------------------------------------------


def mixed_bad_dataset(directory: Path) -> tuple[Index, dict[str, str]]:
    """12 samples in 3 shards of 4; bad ones: not audio, NaN, empty, and all of shard 2 (truncated)."""
    bad = {"k01": b"not audio", "k06": float_wav([float("nan")] * 3), "k07": float_wav([])}
    samples = [(f"k{i:02d}", bad.get(f"k{i:02d}", good_wav(i))) for i in range(12)]
    index = write_custom(directory, samples)
    path = index.shard_path(2)
    os.truncate(path, os.path.getsize(path) - 1)
    reasons = {"k01": "DecodeError", "k06": "DecodeError", "k07": "DecodeError"}
    reasons.update({f"k{i:02d}": "IntegrityError" for i in range(8, 12)})
    return index, reasons


def test_skip_counts_and_keeps_the_batch_count_in_process(tmp_path: Path) -> None:
    index, reasons = mixed_bad_dataset(tmp_path / "ds")
    dataset = ShardDataset(index.root, batch_size=3, on_error="skip")
    batches = list(dataset)
    assert len(batches) == len(dataset) == 4
    keys = [k for b in batches for k in b["keys"]]
    skipped = {s.split(":", 1)[0] for b in batches for s in b["skipped"]}
    assert sorted(keys + sorted(skipped)) == sorted(index.keys) and skipped == set(reasons)
    assert dataset.stats.samples == 5 and dataset.stats.skipped == 7
    assert dataset.stats.errors == {"DecodeError": 3, "IntegrityError": 4}


@pytest.mark.timeout(60)
def test_skip_with_two_workers_yields_every_planned_batch(tmp_path: Path) -> None:
    index, _ = mixed_bad_dataset(tmp_path / "ds")
    dataset = ShardDataset(index.root, batch_size=2, on_error="skip", shuffle=True, seed=5)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(dataset) == 6
    keys = [k for b in batches for k in b["keys"]]
    skipped = [s for b in batches for s in b["skipped"]]
    assert sorted(keys + [s.split(":", 1)[0] for s in skipped]) == sorted(index.keys)
    for line in skipped:
        key = line.split(":", 1)[0]
        assert f"key {key!r}" in line, line
    empty = [b for b in batches if not b["keys"]]
    for batch in empty:  # a batch of only bad samples is still yielded, empty
        assert batch["audio"].shape[0] == 0 and isinstance(batch["audio"], torch.Tensor)
