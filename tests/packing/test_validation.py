"""pack's validation: one test per rule, each checking the error names the file and the reason; the raise
policy leaves no index and no shard; the skip policy packs the rest and writes rejected.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from audio_factory import audio_bytes, tone, write_samples, write_text, write_tone

from shardio.errors import InputError, InputProblem
from shardio.packing.pack import REJECTED_FILE, pack, rewrite_key
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index


def failures(corpus: Path, out: Path, **options: object) -> list[InputProblem]:
    """The problems pack raises for ``corpus``, after checking it left no index and no shard behind."""
    with pytest.raises(InputError) as caught:
        pack(corpus, out, progress=False, **options)
    assert not (out / "index.json").exists()
    assert not list(out.glob("shard-*")) and not list(out.glob(".*partial"))
    for problem in caught.value.problems:
        assert str(problem) in str(caught.value)
    return caught.value.problems


def only_failure(corpus: Path, out: Path, **options: object) -> InputProblem:
    problems = failures(corpus, out, **options)
    assert len(problems) == 1, problems
    return problems[0]


def manifest(root: Path, *entries: dict) -> Path:
    return write_text(root / "manifest.jsonl", "\n".join(json.dumps(e) for e in entries) + "\n")


def good_corpus(root: Path, count: int = 3) -> Path:
    for i in range(count):
        write_tone(root / f"good{i}.wav", 0.2, 8000, seed=i)
    return root


def test_missing_file(tmp_path: Path) -> None:
    good_corpus(tmp_path / "in")
    corpus = manifest(tmp_path / "in", {"audio_filepath": "good0.wav"}, {"audio_filepath": "gone.wav"})
    problem = only_failure(corpus, tmp_path / "out")
    assert (
        problem.source.startswith(str(tmp_path / "in" / "gone.wav")) and "manifest.jsonl:2" in problem.source
    )
    assert problem.reason == "file not found" and problem.key == "gone"


def test_unreadable_file(tmp_path: Path) -> None:
    (good_corpus(tmp_path / "in") / "folder.wav").mkdir()
    corpus = manifest(tmp_path / "in", {"audio_filepath": "folder.wav"})
    problem = only_failure(corpus, tmp_path / "out")
    assert str(tmp_path / "in" / "folder.wav") in problem.source and "cannot read the file" in problem.reason


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        (
            "noise.flac",
            bytes(range(256)) * 8,
            "the content is not FLAC audio (its first bytes are no audio container's",
        ),
        ("broken.flac", b"fLaC" + bytes(range(256)) * 8, "the first FLAC metadata block is not a STREAMINFO"),
        (
            "broken.wav",
            b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(40)),
            "could not be decoded as wav audio",
        ),
        ("broken.mp3", b"ID3" + bytes(64), "no MPEG audio frame header where the MP3 audio should start"),
    ],
)
def test_undecodable_bytes(tmp_path: Path, name: str, data: bytes, reason: str) -> None:
    (good_corpus(tmp_path / "in") / name).write_bytes(data)
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source == str(tmp_path / "in" / name)
    assert reason in problem.reason and str(tmp_path) not in problem.reason
    assert (
        "0x7f" not in problem.reason and "\\x" not in problem.reason
    )  # no file bytes in messages, raw or escaped


def test_empty_file(tmp_path: Path) -> None:
    (good_corpus(tmp_path / "in") / "empty.wav").write_bytes(b"")
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source.endswith("empty.wav") and "empty (0 bytes)" in problem.reason


def test_zero_length_audio(tmp_path: Path) -> None:
    write_samples(good_corpus(tmp_path / "in") / "silent.wav", np.zeros((0, 1), np.int16), 8000)
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source.endswith("silent.wav") and "has no samples (0 frames" in problem.reason


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples(tmp_path: Path, bad: float) -> None:
    samples = tone(0.2, 8000)
    samples[[10, 20, 30]] = bad
    write_samples(good_corpus(tmp_path / "in") / "nan.wav", samples, 8000, subtype="FLOAT")
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source.endswith("nan.wav") and "holds 3 NaN or infinite sample(s)" in problem.reason


def test_content_not_matching_extension(tmp_path: Path) -> None:
    (good_corpus(tmp_path / "in") / "really_flac.wav").write_bytes(audio_bytes(tone(0.2, 8000), 8000, "flac"))
    (tmp_path / "in" / "really_ogg.mp3").write_bytes(audio_bytes(tone(0.2, 8000), 8000, "ogg"))
    problems = failures(tmp_path / "in", tmp_path / "out")
    assert [(Path(p.source).name, p.reason) for p in problems] == [
        ("really_flac.wav", "the content is FLAC audio, but the extension .wav says WAV or WAVEX or RF64"),
        ("really_ogg.mp3", "the content is OGG audio, but the extension .mp3 says MP3"),
    ]


def test_segment_problems_use_the_same_checks(tmp_path: Path) -> None:
    samples = tone(1.0, 8000)
    samples[4000] = np.nan
    write_samples(tmp_path / "rec.wav", samples, 8000, subtype="FLOAT")
    corpus = manifest(
        tmp_path,
        {"audio_filepath": "rec.wav", "offset": 0.1, "duration": 0.2},
        {"audio_filepath": "rec.wav", "offset": 0.4, "duration": 0.2},
    )
    problem = only_failure(corpus, tmp_path / "out")
    assert problem.key == "rec_00000400" and "holds 1 NaN or infinite sample(s)" in problem.reason


def test_unknown_format_extension(tmp_path: Path) -> None:
    good_corpus(tmp_path / "in")
    write_text(tmp_path / "in" / "x.aac", "whatever")
    corpus = manifest(tmp_path / "in", {"audio_filepath": "good0.wav"}, {"audio_filepath": "x.aac"})
    problem = only_failure(corpus, tmp_path / "out")
    assert problem.source.startswith(str(tmp_path / "in" / "x.aac"))
    assert "unknown audio format extension .aac" in problem.reason and ".flac" in problem.reason


def test_duplicate_keys(tmp_path: Path) -> None:
    good_corpus(tmp_path / "in")
    corpus = manifest(
        tmp_path / "in",
        {"audio_filepath": "good0.wav", "id": "same"},
        {"audio_filepath": "good1.wav", "id": "same"},
    )
    problem = only_failure(corpus, tmp_path / "out")
    assert problem.source.startswith(str(tmp_path / "in" / "good1.wav")) and problem.key == "same"
    assert "duplicate key 'same'" in problem.reason and str(tmp_path / "in" / "good0.wav") in problem.reason
    assert "two audio formats" not in problem.reason


def test_one_name_in_two_formats_says_so(tmp_path: Path) -> None:
    write_tone(good_corpus(tmp_path / "in") / "good0.flac", 0.2, 8000)
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.key == "good0" and "duplicate key 'good0'" in problem.reason
    assert "the same name in two audio formats: keep one" in problem.reason


def test_key_breaking_the_member_rule_and_rewrite(tmp_path: Path) -> None:
    write_tone(good_corpus(tmp_path / "in") / "sub" / "take.2.hq.wav", 0.2, 8000)
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source.endswith("take.2.hq.wav") and problem.key == "sub/take.2.hq"
    assert "basename contains a '.'" in problem.reason and "rewrite_keys=True" in problem.reason
    pack(tmp_path / "in", tmp_path / "rewritten", rewrite_keys=True, progress=False)
    assert Index.load(tmp_path / "rewritten").keys == ["good0", "good1", "good2", "sub/take_2_hq"]


def test_rewritten_keys_must_stay_unique(tmp_path: Path) -> None:
    write_tone(good_corpus(tmp_path / "in") / "a.b.wav", 0.2, 8000)
    write_tone(tmp_path / "in" / "a_b.wav", 0.2, 8000)
    problem = only_failure(tmp_path / "in", tmp_path / "out", rewrite_keys=True)
    assert problem.source.endswith("a_b.wav") or problem.source.endswith("a.b.wav")
    assert "duplicate key 'a_b'" in problem.reason and "rewritten from 'a.b'" in str(problem)


def test_rewrite_key() -> None:
    assert rewrite_key("dir.v2/a.b.c") == "dir.v2/a_b_c"
    assert rewrite_key("/x//y/./../z\x01") == "x/y/_/_/z_"
    assert rewrite_key("...") == "___"


def test_missing_transcript_when_required(tmp_path: Path) -> None:
    write_text(good_corpus(tmp_path / "in") / "good0.txt", "zero")
    write_text(tmp_path / "in" / "good1.txt", "one")
    write_text(tmp_path / "in" / "good2.txt", "   \n")
    problem = only_failure(tmp_path / "in", tmp_path / "out", require_text=True)
    assert problem.source.endswith("good2.wav") and "no transcript" in problem.reason
    assert pack(tmp_path / "in", tmp_path / "fine", progress=False).samples == 3  # not required by default


def test_piped_wav_scp_entry(tmp_path: Path) -> None:
    write_tone(tmp_path / "rec.wav", 0.2, 8000)
    write_text(tmp_path / "data" / "wav.scp", f"rec {tmp_path / 'rec.wav'}\npiped flac -dc x.flac |\n")
    problem = only_failure(tmp_path / "data", tmp_path / "out")
    assert problem.source == f"{tmp_path / 'data' / 'wav.scp'}:2" and "piped command" in problem.reason


def test_segment_past_the_end(tmp_path: Path) -> None:
    write_tone(tmp_path / "rec.wav", 1.0, 8000)
    corpus = manifest(
        tmp_path,
        {"audio_filepath": "rec.wav", "offset": 0.5, "duration": 0.3},
        {"audio_filepath": "rec.wav", "offset": 0.8, "duration": 0.5},
        {"audio_filepath": "rec.wav", "offset": 1.2},
    )
    problems = failures(corpus, tmp_path / "out")
    assert [p.key for p in problems] == ["rec_00000800", "rec_00001200"]
    assert "ends at 1.300 s, past the end of the recording (1.000 s)" in problems[0].reason
    assert "starts at 1.200 s" in problems[1].reason


def test_every_failing_input_is_listed_and_no_shard_stays(tmp_path: Path) -> None:
    corpus = good_corpus(tmp_path / "in", 6)
    (corpus / "zz_broken.wav").write_bytes(b"RIFF....WAVE")  # sorted last: shards are written before it
    (corpus / "empty.flac").write_bytes(b"")
    write_tone(corpus / "bad.key.wav", 0.2, 8000)
    problems = failures(corpus, tmp_path / "out", samples_per_shard=1)
    assert sorted(Path(p.source).name for p in problems) == ["bad.key.wav", "empty.flac", "zz_broken.wav"]


def test_skip_packs_the_rest_and_reports(tmp_path: Path) -> None:
    corpus = good_corpus(tmp_path / "in", 4)
    (corpus / "broken.wav").write_bytes(b"nope")
    write_tone(corpus / "x.y.wav", 0.2, 8000)
    summary = pack(corpus, tmp_path / "out", on_error="skip", progress=False)
    assert summary.samples == 4 and len(summary.rejected) == 2
    report = [json.loads(line) for line in (tmp_path / "out" / REJECTED_FILE).read_text().splitlines()]
    assert [(Path(r["source"]).name, r["key"]) for r in report] == [
        ("x.y.wav", "x.y"),
        ("broken.wav", "broken"),
    ]
    assert all(set(r) == {"source", "key", "reason"} and r["reason"] for r in report)
    assert Index.load(tmp_path / "out").keys == ["good0", "good1", "good2", "good3"]
    assert verify_dataset(tmp_path / "out", decode=True) == []


def test_nothing_to_pack(tmp_path: Path) -> None:
    write_text(tmp_path / "in" / "notes.txt", "no audio here")
    problem = only_failure(tmp_path / "in", tmp_path / "out")
    assert problem.source == str(tmp_path / "in") and "no audio inputs found" in problem.reason
    (tmp_path / "in" / "broken.wav").write_bytes(b"nope")
    problems = failures(tmp_path / "in", tmp_path / "out2", on_error="skip")  # all rejected: still an error
    assert [Path(p.source).name for p in problems] == ["broken.wav"]
