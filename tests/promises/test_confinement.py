"""A dataset is confined to its root, and its bytes bound what shardio allocates (issue 13, items 13-15).

Hostile index files are made by editing a real dataset's ``index.json`` and ``index.npz``; the shards are
real tar files, read through the real reader and a real ShardDataset.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hostile import rewrite_columns, rewrite_header, run_limited, to_format1
from sample_shards import make_uneven_dataset, wav_bytes

from shardio import FormatError, Index, ShardDataset, ShardInfo, ShardWriter
from shardio.packing.indexer import build_index
from shardio.reading.reader import Reader
from shardio.shards.builder import IndexBuilder
from shardio.shards.indexchecks import columns_size_bound
from shardio.shards.tarformat import encode_sample, parse_members

SECRET = b"root:x:0:0:SECRET-PASSWORD-HASH:/root:/bin/bash\n"


def leaks(text: str) -> bool:
    """Whether ``text`` quotes any 5 bytes of :data:`SECRET`, an escaped byte or a bytes literal."""
    secret = SECRET.decode()
    if "\\x" in text or "byte 0x" in text or "b'" in text or 'b"' in text:
        return True
    return any(secret[i : i + 5] in text for i in range(len(secret) - 5))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    make_uneven_dataset(tmp_path / "ds", [3, 2], duration_range=(0.05, 0.1))
    return tmp_path / "ds"


def _shard(root: Path, number: int = 0) -> Path:
    return root / Index.load(root).shards[number].name


# -- item 13: shard names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../secret.tar",
        "{outside}/secret.tar",
        "sub/../../secret.tar",
        "./x/../x.tar",
        "file:///etc/passwd",
        "http://example.invalid/x.tar",
        "",
        "a\0b.tar",
    ],
)
def test_shard_names_outside_the_root_are_refused(dataset: Path, name: str) -> None:
    secret = dataset.parent / "secret.tar"
    shard = _shard(dataset)
    secret.write_bytes(SECRET * (shard.stat().st_size // len(SECRET) + 1))
    with open(secret, "r+b") as handle:
        handle.truncate(shard.stat().st_size)  # only the size must match for the old reader to open it
    name = name.format(outside=dataset.parent)
    rewrite_header(dataset, lambda header: header["shards"][0].update(name=name))
    with pytest.raises(FormatError, match="shard name") as caught:
        Index.load(dataset)
    assert "SECRET" not in str(caught.value)


def test_plain_names_with_sub_directories_and_colons_are_taken(dataset: Path) -> None:
    shard = _shard(dataset)
    (dataset / "part:1").mkdir()
    os.replace(shard, dataset / "part:1" / "a:b.tar")
    rewrite_header(dataset, lambda header: header["shards"][0].update(name="part:1/a:b.tar"))
    assert len(Reader(Index.load(dataset)).members(0)) == 2


def test_a_symlink_out_of_the_root_is_refused_unless_allowed(dataset: Path) -> None:
    shard = _shard(dataset)
    elsewhere = dataset.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.move(shard, elsewhere / shard.name)
    os.symlink(elsewhere / shard.name, shard)
    with pytest.raises(FormatError, match="outside the dataset root"):
        Index.load(dataset)
    index = Index.load(dataset, allow_outside_root=True)
    assert len(Reader(index).members(0)) == 2
    shard.unlink()
    shutil.copy(elsewhere / shard.name, dataset / "inside.tar")
    os.symlink("inside.tar", shard)  # a link that stays inside the root is fine
    assert Index.load(dataset).fingerprint == index.fingerprint


def test_a_symlinked_sub_directory_out_of_the_root_is_refused(dataset: Path) -> None:
    shard = _shard(dataset)
    elsewhere = dataset.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.move(shard, elsewhere / shard.name)
    os.symlink(elsewhere, dataset / "sub")
    rewrite_header(dataset, lambda header: header["shards"][0].update(name=f"sub/{shard.name}"))
    with pytest.raises(FormatError, match="outside the dataset root"):
        Index.load(dataset)
    assert Index.load(dataset, allow_outside_root=True).shard_path(0).endswith(f"sub/{shard.name}")


def test_an_index_written_elsewhere_needs_the_opt_in(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = sorted(dataset.glob("*.tar"))
    with caplog.at_level(logging.WARNING):
        built = build_index(shards, out_dir=tmp_path / "index-only")
    assert "2 shards lie outside the index's directory" in caplog.text and "allow_outside_root" in caplog.text
    assert built.shards[0].name.startswith("../")
    with pytest.raises(FormatError, match="allow_outside_root=True"):
        Index.load(tmp_path / "index-only")
    index = Index.load(tmp_path / "index-only", allow_outside_root=True)
    batches = list(ShardDataset(index, batch_size=5, shuffle=False))
    assert sum(len(batch["keys"]) for batch in batches) == 5


# -- item 13: no raw file bytes in messages -----------------------------------------------------------


def _header_with(field: slice, value: bytes) -> bytes:
    """A valid one-member tar whose header has ``value`` at ``field``, its checksum made to hold again."""
    data = bytearray(encode_sample("k", {"wav": b"\0" * 10}))
    data[field] = value.ljust(field.stop - field.start, b"\0")[: field.stop - field.start]
    data[148:156] = b"        "
    data[148:156] = b"%06o\0 " % sum(data[:512])
    return bytes(data)


@pytest.mark.parametrize(
    "crafted",
    [
        SECRET * 12,  # not a tar header at all: the old checksum message quoted the field's bytes
        _header_with(slice(0, 100), b"SECRET\xff\xfe"),  # a name that is not UTF-8
        _header_with(slice(124, 136), b"SECRET!!"),  # a size that is not octal
    ],
    ids=["text", "name", "size"],
)
def test_tar_errors_quote_no_file_bytes(crafted: bytes) -> None:
    with pytest.raises(FormatError) as caught:
        parse_members(crafted.ljust(1536, b"\0"), "shard x")
    assert not leaks(str(caught.value))


def test_skipped_samples_do_not_leak_file_content(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = _shard(dataset)
    with open(shard, "r+b") as handle:  # the first sample's bytes become someone's secret (same size)
        handle.write(SECRET * 20)
    with caplog.at_level(logging.WARNING):
        batch = next(iter(ShardDataset(dataset, batch_size=5, shuffle=False, on_error="skip")))
    assert len(batch["skipped"]) == 1 and len(batch["keys"]) == 4
    assert not leaks("".join(batch["skipped"])) and not leaks(caplog.text)


def test_a_json_member_that_is_not_utf8_is_reported_without_its_bytes(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "ds")
    writer.write(
        "a",
        {"wav": wav_bytes(np.zeros(80, np.float32), 8000), "json": b'{"a": "\xff"}'},
        audio_ext="wav",
        num_frames=80,
        sample_rate=8000,
        channels=1,
    )
    writer.close()
    batch = next(iter(ShardDataset(tmp_path / "ds", batch_size=1, on_error="skip")))
    assert len(batch["skipped"]) == 1 and "not UTF-8 at byte 7" in batch["skipped"][0]
    assert not leaks(batch["skipped"][0])


def test_decompressor_errors_quote_no_file_bytes(tmp_path: Path) -> None:
    """gzip's own message quotes the first bytes of a file that is not gzip ("Not a gzipped file (b'ro')")."""
    shard = tmp_path / "ds" / "s.tar.gz"
    shard.parent.mkdir()
    shard.write_bytes(gzip.compress(encode_sample("a", {"wav": wav_bytes(np.zeros(80, np.float32), 8000)})))
    build_index([shard])
    size = shard.stat().st_size
    shard.write_bytes((SECRET * (size // len(SECRET) + 1))[:size])
    with pytest.raises(FormatError, match="cannot decompress") as caught:
        Reader(Index.load(shard.parent)).members(0)
    assert not leaks(str(caught.value))
    with pytest.raises(FormatError, match="cannot decompress") as caught:
        build_index([shard], out_dir=tmp_path / "again")
    assert not leaks(str(caught.value))


# -- item 14: columns_file ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["/dev/zero", "../index.npz", "sub/index.npz", "..", "s3://bucket/x.npz", 7])
def test_columns_file_must_be_a_plain_name_in_the_root(dataset: Path, name: object) -> None:
    rewrite_header(dataset, lambda header: header.update(columns_file=name))
    with pytest.raises(FormatError, match="columns_file"):
        Index.load(dataset)


@pytest.mark.parametrize("version", [1, 2])
def test_columns_file_linked_to_a_device_is_not_read(dataset: Path, version: int) -> None:
    name = "index.columns"
    if version == 1:
        to_format1(dataset)
        name = "index.npz"
    os.replace(dataset / name, dataset / "real")
    os.symlink("/dev/zero", dataset / name)
    with pytest.raises(FormatError, match="outside the dataset root|not a regular file"):
        Index.load(dataset)


def test_columns_file_size_is_bounded_by_the_sample_count(dataset: Path) -> None:
    to_format1(dataset)
    with open(dataset / "index.npz", "r+b") as handle:
        handle.truncate(columns_size_bound(5, "") + 1)  # the size is checked before anything is read
    with pytest.raises(FormatError, match="more than the .* that the sample count"):
        Index.load(dataset)
    rewrite_header(dataset, lambda header: header.update(samples=-1))
    with pytest.raises(FormatError, match="'samples' must be"):
        Index.load(dataset)


def test_npy_shapes_are_checked_against_the_bytes(dataset: Path) -> None:
    """numpy allocates the array an .npy header claims before reading it: a claim is checked first."""
    payload = io.BytesIO()
    claim = {"descr": "<u4", "fortran_order": False, "shape": (10**11,)}
    np.lib.format.write_array_header_1_0(payload, claim)
    payload.write(b"\0" * 20)

    def forge(columns: dict[str, np.ndarray]) -> None:
        columns["bogus"] = np.zeros(1, np.uint8)

    to_format1(dataset)
    rewrite_columns(dataset, forge)
    raw = (dataset / "index.npz").read_bytes()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(raw)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(
                info.filename,
                payload.getvalue() if info.filename == "shard.npy" else source.read(info.filename),
            )
    (dataset / "index.npz").write_bytes(out.getvalue())
    digest = hashlib.sha256(out.getvalue()).hexdigest()
    rewrite_header(dataset, lambda header: header.update(columns_sha256=digest))
    with pytest.raises(FormatError, match="claims an array of shape"):
        Index.load(dataset)


# -- item 15: memory bombs ------------------------------------------------------------------------------


def test_num_frames_beyond_the_member_size_fails_at_load(dataset: Path) -> None:
    def inflate(columns: dict[str, np.ndarray]) -> None:
        columns["num_frames"][1] = 2_000_000_000

    rewrite_columns(dataset, inflate)
    with pytest.raises(FormatError, match=r"sample 's000_00001' \(shard 'shard-000000.tar'.*2000000000 fr"):
        Index.load(dataset)


def _gzip_shard_with_a_big_tail(path: Path, tail_bytes: int, tail_name: str = "b.wav") -> None:
    """A .tar.gz: one small WAV sample, then a member ``tail_name`` of ``tail_bytes`` bytes (a WAV header,
    then zeros: a few hundred KB compressed)."""
    audio = wav_bytes(np.zeros(800, np.float32), 8000)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(encode_sample("a", {"wav": audio}))
        info = tarfile.TarInfo(tail_name)
        info.size = tail_bytes
        out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        head = wav_bytes(np.zeros(8, np.float32), 8000)
        out.write(head)
        left = tail_bytes - len(head)
        while left:
            out.write(b"\0" * min(1 << 20, left))
            left -= min(1 << 20, left)
        out.write(b"\0" * (-tail_bytes % 512) + b"\0" * 1024)


_READ_FIRST = """
from shardio import Index
from shardio.errors import FormatError
from shardio.reading.reader import Reader
reader = Reader(Index.load({root!r}), max_stream_bytes=16 << 20)
print(sorted(reader.members(0)))
try:
    reader.members(len(reader.index) - 1)
except FormatError as exc:
    print("FormatError", exc)
"""


def test_stream_shards_are_decompressed_only_as_far_as_the_index_needs(tmp_path: Path) -> None:
    """96 MiB of decompressed tail that no indexed sample needs is never decompressed."""
    shard = tmp_path / "ds" / "big.tar.gz"
    shard.parent.mkdir()
    _gzip_shard_with_a_big_tail(shard, 96 << 20, tail_name="junk")  # no extension: not a sample
    assert build_index([shard]).keys == ["a"]
    result = run_limited(_READ_FIRST.format(root=str(shard.parent)), headroom_mb=48)
    assert result.returncode == 0 and result.stdout.startswith("['wav']"), result.stderr[-2000:]


def test_stream_shards_are_decompressed_within_the_cache_bound(tmp_path: Path) -> None:
    shard = tmp_path / "ds" / "big.tar.gz"
    shard.parent.mkdir()
    _gzip_shard_with_a_big_tail(shard, 96 << 20)
    assert build_index([shard]).keys == ["a", "b"]
    result = run_limited(_READ_FIRST.format(root=str(shard.parent)), headroom_mb=48)
    assert result.returncode == 0 and result.stdout.startswith("['wav']"), result.stderr[-2000:]
    assert "FormatError" in result.stdout and "max_stream_bytes" in result.stdout


_READ_ONE = """
from shardio import Index
from shardio.errors import FormatError
from shardio.reading.reader import Reader
try:
    Reader(Index.load({root!r})).members(0)
except FormatError as exc:
    print("FormatError", exc)
"""


def test_a_zstd_frame_without_a_size_is_decompressed_as_far_as_it_goes(tmp_path: Path) -> None:
    """A frame that does not record its size, and an index placing 3 GiB in it: the old reader sized one
    buffer of 3 GiB before decompressing; the buffer now grows only as the frame really decompresses."""
    root = tmp_path / "ds"
    root.mkdir()
    sample = encode_sample("a", {"wav": wav_bytes(np.zeros(80, np.float32), 8000)})
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(sample)
    (root / "s.tar.zst").write_bytes(frame)
    builder = IndexBuilder(str(root))
    builder.add_sample(
        "a",
        shard=0,
        frame_offset=0,
        frame_size=len(frame),
        member_offset=0,
        member_size=3 << 30,
        num_frames=80,
        sample_rate=8000,
        channels=1,
        audio_ext="wav",
    )
    builder.add_shard(ShardInfo("s.tar.zst", len(frame), "", 1, 0.01, "zstd"))
    builder.build().save()
    result = run_limited(_READ_ONE.format(root=str(root)), headroom_mb=256)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "more than a frame of its size may hold" in result.stdout, result.stdout


def _zstd_dataset(root: Path, frame: bytes, member_offset: int, member_size: int) -> None:
    root.mkdir()
    (root / "s.tar.zst").write_bytes(frame)
    builder = IndexBuilder(str(root))
    builder.add_sample(
        "a",
        shard=0,
        frame_offset=0,
        frame_size=len(frame),
        member_offset=member_offset,
        member_size=member_size,
        num_frames=80,
        sample_rate=8000,
        channels=1,
        audio_ext="wav",
    )
    builder.add_shard(ShardInfo("s.tar.zst", len(frame), "", 1, 0.01, "zstd"))
    builder.build().save()


def test_a_small_zstd_frame_that_decompresses_far_is_not_decompressed_past_its_bound(tmp_path: Path) -> None:
    """A 16 KB frame of 512 MiB of zeros, and an index placing the sample 400 MiB into it: a frame may hold 64
    times its bytes plus 64 MiB, so nothing is decompressed (the old reader made 400 MiB, then copied it)."""
    frame = zstandard.ZstdCompressor().compress(b"\0" * (512 << 20))
    assert len(frame) < 64 << 10
    _zstd_dataset(tmp_path / "ds", frame, 400 << 20, 1 << 10)
    result = run_limited(_READ_ONE.format(root=str(tmp_path / "ds")), headroom_mb=96)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "more than a frame of its size may hold" in result.stdout, result.stdout


def test_ten_minutes_of_digital_silence_in_one_frame_still_reads(tmp_path: Path) -> None:
    """What the frame bound leaves room for: 19 MB of silence compress to about 600 bytes."""
    silence = np.zeros(16000 * 600, np.float32)
    sample = encode_sample("a", {"wav": wav_bytes(silence, 16000)})
    frame = zstandard.ZstdCompressor().compress(sample)
    assert len(frame) * 64 < len(sample)
    root = tmp_path / "ds"
    root.mkdir()
    (root / "s.tar.zst").write_bytes(frame)
    builder = IndexBuilder(str(root))
    builder.add_sample(
        "a",
        shard=0,
        frame_offset=0,
        frame_size=len(frame),
        member_offset=0,
        member_size=len(sample),
        num_frames=len(silence),
        sample_rate=16000,
        channels=1,
        audio_ext="wav",
    )
    builder.add_shard(ShardInfo("s.tar.zst", len(frame), "", 1, 600.0, "zstd"))
    builder.build().save()
    members = Reader(Index.load(root)).members(0)
    assert len(members["wav"]) == 44 + 2 * len(silence)


def test_indexing_streams_members_in_bounded_memory(tmp_path: Path) -> None:
    shard = tmp_path / "big.tar.gz"
    _gzip_shard_with_a_big_tail(shard, 160 << 20)
    code = f"from shardio.packing.indexer import build_index\nprint(len(build_index([{str(shard)!r}])))\n"
    result = run_limited(code, headroom_mb=64)
    assert result.returncode == 0 and result.stdout.strip() == "2", result.stderr[-2000:]


def test_a_huge_size_claim_in_a_tar_header_is_a_format_error(tmp_path: Path) -> None:
    shard = tmp_path / "claim.tar.gz"
    with gzip.open(shard, "wb") as out:
        header = bytearray(encode_sample("a", {"wav": b""})[:512])
        header[124:136] = b"%011o\0" % (8 << 30)  # 8 GiB claimed, none there
        header[156:157] = b"x"  # a pax header: its data is read as a name record
        header[148:156] = b"        "
        header[148:156] = b"%06o\0 " % sum(header)
        out.write(bytes(header) + b"\0" * 4096)
    code = (
        f"from shardio.packing.indexer import build_index\nfrom shardio.errors import FormatError\n"
        f"try:\n    build_index([{str(shard)!r}])\n"
        "except FormatError as exc:\n    print('FormatError', exc)\n"
    )
    result = run_limited(code, headroom_mb=64)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("FormatError"), result.stdout
