"""Issue 41, trust boundaries: inputs and remote locations whose failures were silent or untyped — a truncated
RF64 file, a ``file://`` dataset root, an HTTP server that keeps answering 500, a huge
member of a stream shard."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from audio_factory import tone
from hostile import run_limited
from remote_servers import HTTPFileServer
from sample_shards import make_uneven_dataset, wav_bytes

from shardio import OptionError, ReadError, RetryPolicy, ShardDataset
from shardio.packing.indexer import build_index
from shardio.packing.pack import pack
from shardio.packing.truncation import truncation_problem
from shardio.packing.verification import verify_dataset
from shardio.reading.reader import Reader
from shardio.shards.index import Index
from shardio.shards.tarformat import encode_sample
from shardio.shards.writer import ShardWriter
from shardio.storage.retries import retrying

FAST = RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.05)


def _rf64(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    sf.write(out, tone(seconds, rate), rate, format="RF64", subtype="PCM_16")
    data = out.getvalue()
    assert data[:4] == b"RF64" and data[12:16] == b"ds64"
    return data


def test_a_truncated_rf64_file_is_refused_like_a_truncated_wav(tmp_path: Path) -> None:
    whole = _rf64(2.0)
    assert truncation_problem(whole, "wav") is None
    half = whole[: len(whole) // 2]
    problem = truncation_problem(half, "wav")
    assert problem is not None and problem.startswith("truncated: the RF64 ds64 chunk claims 32000 bytes")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "cut.wav").write_bytes(half)  # packed before as 1.0 s of 2.0 s, and verify --decode said OK
    (corpus / "whole.wav").write_bytes(whole)
    summary = pack(corpus, tmp_path / "out", on_error="skip", progress=False)
    assert [(p.key, p.reason[:43]) for p in summary.rejected] == [
        ("cut", "truncated: the RF64 ds64 chunk claims 32000")
    ]
    assert Index.load(tmp_path / "out").keys == ["whole"]


def test_verify_decode_reports_a_truncated_rf64_member(tmp_path: Path) -> None:
    whole = _rf64(2.0)
    half = whole[: whole.index(b"data") + 8 + 16000]
    with ShardWriter(tmp_path / "d") as writer:  # another tool's shard: the writer trusts its caller
        writer.write("cut", {"wav": half}, audio_ext="wav", num_frames=8000, sample_rate=8000, channels=1)
    problems = verify_dataset(tmp_path / "d", decode=True)
    assert len(problems) == 1 and "truncated: the RF64 ds64 chunk" in problems[0], problems


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.99])
def test_an_rf64_cut_anywhere_in_its_samples_is_truncated(cut: float) -> None:
    whole = _rf64(0.5)
    start = whole.index(b"data") + 8
    assert truncation_problem(whole[: start + int(cut * (len(whole) - start))], "wav") is not None


# -- 17: a file:// root, and a server that answers 500 for good
# -------------------------------------------------


def test_a_file_url_root_reads_as_its_path(tmp_path: Path) -> None:
    make_uneven_dataset(tmp_path / "ds", [3, 2])
    url = (tmp_path / "ds").as_uri()
    # refused before: "resolves (through a symbolic link) to a file outside the dataset root"
    assert sum(len(batch["keys"]) for batch in ShardDataset(url, batch_size=2)) == 5
    assert verify_dataset(url, progress=False) == []
    with pytest.raises(OptionError, match="a file URL names a path on this machine"):
        Index.load("file://elsewhere/ds")


def test_a_permanent_http_500_is_a_read_error_naming_url_and_status(tmp_path: Path) -> None:
    make_uneven_dataset(tmp_path, [3, 3])
    with HTTPFileServer(str(tmp_path)) as server:
        index = Index.load(server.url)
        server.faults.fail(10**6, status=500, match="shard-000001")
        reader = Reader(index, retry=FAST)
        reader.members(0)
        with pytest.raises(
            ReadError,
            match=r"shard-000001\.tar.*read failed after 2 attempt\(s\): the server "
            r"answered HTTP 500",
        ):
            reader.members(3)  # said "FileNotFoundError: URL" (fsspec's size() on a 500)
        server.faults.clear()
        server.faults.fail(10**6, status=500, match="shard-000001", method="GET")
        problems = verify_dataset(server.url, progress=False)  # a raw aiohttp ClientResponseError before
    assert len(problems) == 1 and "shard-000001.tar: the shard file cannot be read" in problems[0], problems
    assert "HTTP 500" in problems[0] and f"{server.url}/shard-000001.tar" in problems[0]


def test_an_http_403_behind_a_file_not_found_is_not_called_missing() -> None:
    """fsspec's HTTP ``size()`` raises ``FileNotFoundError`` for any failed answer, the answer as its cause:
    only a 404 (or no answer) behind it is "missing"; another status is a ReadError naming it."""
    url = "http://127.0.0.1:9/shard-000001.tar"

    def refused(status: int) -> None:
        try:
            raise aiohttp.ClientResponseError(None, (), status=status, message="refused")  # type: ignore[arg-type]
        except aiohttp.ClientResponseError as exc:
            raise FileNotFoundError(url) from exc

    with pytest.raises(
        ReadError, match="not retried: not a transient error\\): the server answered HTTP 403"
    ):
        retrying(
            lambda: refused(403), url, FAST
        )  # re-raised as FileNotFoundError before: "the shard is missing"
    with pytest.raises(FileNotFoundError):
        retrying(lambda: refused(404), url, FAST)


# -- 18: one huge member of a stream shard costs memory only to a read of its own
# sample ----------------------


def _gzip_shard_with_a_huge_member_first(path: Path, huge: int) -> None:
    """A .tar.gz: sample ``x`` (a small WAV and an ``x.bin`` of ``huge`` zero bytes: a few hundred KB of
    gzip), then a small sample ``y``."""
    audio = wav_bytes(np.zeros(800, np.float32), 8000)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(encode_sample("x", {"wav": audio}))
        info = tarfile.TarInfo("x.bin")
        info.size = huge
        out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        for left in range(huge, 0, -(1 << 20)):
            out.write(b"\0" * min(1 << 20, left))
        out.write(b"\0" * (-huge % 512))
        out.write(encode_sample("y", {"wav": audio}) + b"\0" * 1024)


_READ_X_AND_Y = """
from shardio import Index, ShardioError
from shardio.reading.reader import Reader
reader = Reader(Index.load({root!r}){options})
print("y", sorted(reader.members(1)))
try:
    reader.members(0)
    print("x read")
except ShardioError as exc:
    print("x", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("options", ["", ", stream_cache_bytes=64 << 20"])
def test_a_huge_member_is_held_only_by_a_read_of_its_own_sample(tmp_path: Path, options: str) -> None:
    """Reading 7 KB of ``y`` held the 2 GiB ``x.bin`` before it (a raw MemoryError under a 1.5 GiB cap); here
    256 MiB under 96 MiB of headroom, with the reader's defaults (the whole stream does not fit: read by
    spans) and with a cache bound below the stream (read by spans from the start)."""
    shard = tmp_path / "ds" / "big.tar.gz"
    shard.parent.mkdir()
    _gzip_shard_with_a_huge_member_first(shard, 256 << 20)
    assert build_index([shard]).keys == ["x", "y"]
    result = run_limited(_READ_X_AND_Y.format(root=str(shard.parent), options=options), headroom_mb=96)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "y ['wav']", result.stdout
    assert lines[1].startswith("x ReadError") and "cannot be held in this process's memory" in lines[1], lines
