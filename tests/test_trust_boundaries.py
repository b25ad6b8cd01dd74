"""Issue 41, trust boundaries: inputs and remote locations whose failures were silent or untyped — a truncated
RF64 file, a ``file://`` dataset root, an HTTP server that keeps answering 500, a huge member of a stream shard."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import soundfile as sf
from audio_factory import tone

from shardio.packing.pack import pack
from shardio.packing.truncation import truncation_problem
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index
from shardio.shards.writer import ShardWriter


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
    assert [(p.key, p.reason[:43]) for p in summary.rejected] == [("cut", "truncated: the RF64 ds64 chunk claims 32000")]
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
