"""parse_members against Python's tarfile: ustar (name prefix), GNU (long-name members) and pax archives; a
bad checksum is a FormatError; the end-of-archive block ends the walk."""

from __future__ import annotations

import io
import tarfile

import pytest

from shardio import FormatError
from shardio.shards.tarformat import encode_sample, parse_members

NAMES = [
    "short.wav",
    "a/b/c.json",
    "speaker_"
    + "x" * 60
    + "/utterance_"
    + "y" * 60
    + ".wav",  # over 100 bytes: ustar splits it into a prefix
    "d" * 130 + "/" + "e" * 120 + ".flac",  # too long for ustar: GNU and pax only
    "café/ünïcode.txt",  # not ASCII: GNU and pax only
]


def archive(members: list[tuple[str, bytes]], form: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=form) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize(
    "form", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"]
)
def test_members_are_read_as_tarfile_reads_them(form: int) -> None:
    members = [(name, bytes(range(i, i + 40 * i + 1)) * 3) for i, name in enumerate(NAMES, 1)]
    if form == tarfile.USTAR_FORMAT:
        members = members[:3]
    data = archive(members, form)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(info.name, tar.extractfile(info).read()) for info in tar if info.isfile()]  # type: ignore[union-attr]
    assert [(name, bytes(view)) for name, view in parse_members(data, "test")] == expected == members


def test_shardio_samples_parse_back() -> None:
    data = encode_sample("spk/utt1", {"wav": b"RIFF....", "json": b'{"text": "hi"}'})
    assert [(name, bytes(view)) for name, view in parse_members(data, "test")] == [
        ("spk/utt1.wav", b"RIFF...."),
        ("spk/utt1.json", b'{"text": "hi"}'),
    ]


@pytest.mark.parametrize("offset", [0, 100, 130, 150, 156, 300, 511])
def test_a_changed_header_byte_is_a_format_error(offset: int) -> None:
    data = bytearray(encode_sample("k", {"wav": b"x" * 600}))
    data[offset] ^= 0x01
    with pytest.raises(FormatError, match="in the test"):
        parse_members(bytes(data), "in the test")


def test_the_end_of_archive_block_ends_the_members() -> None:
    data = encode_sample("k", {"wav": b"abc"}) + b"\0" * 1024 + encode_sample("z", {"wav": b"def"})
    assert [name for name, _ in parse_members(data, "test")] == ["k.wav"]
