"""The command line's answers to a user's mistakes and to hostile inputs (an audit of every subcommand): one
line and a usage exit code, never a traceback, a silently wrong result or an output left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from audio_factory import audio_bytes, tone, write_tone

from shardio.cli import build_parser, main
from shardio.errors import FormatError
from shardio.shards.index import Index

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dataset(wav_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A small packed dataset (48 samples, 3 shards)."""
    out = tmp_path / "data"
    assert (
        main(["pack", str(wav_corpus), str(out), "--samples-per-shard", "16", "--no-progress", "-j", "1"])
        == 0
    )
    capsys.readouterr()
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["pack", "", "OUT"],
        ["pack", "IN", ""],
        ["inspect", ""],
        ["verify", ""],
        ["index", "IN", "--out", ""],
        ["trace", "", "--state", "s.json", "--step", "0"],
        ["quarantine", "IN", "--state", "s.json", "--key", "k", "--out", ""],
        ["bench", "--out-dir", ""],
        ["demo", ""],
    ],
)
def test_an_empty_path_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An empty path (an unset shell variable) would mean the current directory: `pack ""` packed it all."""
    with pytest.raises(SystemExit) as usage:
        main(argv)
    assert usage.value.code == 2
    assert "an empty path" in capsys.readouterr().err


def test_a_failed_pack_leaves_no_output_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(tmp_path / "mistyped"), str(tmp_path / "out"), "--no-progress"]) == 2
    assert "no such corpus" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["pack", str(tmp_path / "empty"), str(tmp_path / "out2"), "--no-progress"]) == 2
    assert "no audio inputs found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
    (tmp_path / "mine").mkdir()  # a directory the user made stays
    assert main(["pack", str(tmp_path / "empty"), str(tmp_path / "mine"), "--no-progress"]) == 2
    assert (tmp_path / "mine").is_dir()


def test_pack_file_names_that_are_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder or file name with bytes that are not UTF-8 is a rejected key (or rewritten), not a traceback
    from the tar writer; rejected.jsonl names it."""
    corpus = tmp_path / "corpus"
    write_tone(corpus / "ok.wav", 0.2, 8000)
    write_tone(corpus / os.fsdecode(b"d\xff") / "x.wav", 0.2, 8000)
    write_tone(corpus / os.fsdecode(b"caf\xe9.wav"), 0.2, 8000)
    assert main(["pack", str(corpus), str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "Traceback" not in err
    assert main(["pack", str(corpus), str(tmp_path / "o"), "--no-progress", "--on-error", "skip"]) == 0
    assert "rejected 2 inputs" in capsys.readouterr().out
    lines = (tmp_path / "o" / "rejected.jsonl").read_text("utf-8").splitlines()
    rejected = [json.loads(line) for line in lines]
    assert sorted(r["key"] for r in rejected) == [os.fsdecode(b"caf\xe9"), os.fsdecode(b"d\xff/x")]
    assert main(["pack", str(corpus), str(tmp_path / "r"), "--no-progress", "--rewrite-keys"]) == 0
    assert sorted(Index.load(tmp_path / "r").keys[:]) == ["caf_", "d_/x", "ok"]


def test_index_refuses_a_shard_given_twice(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same shard twice would index every one of its samples twice (read twice an epoch)."""
    shard = str(sorted(dataset.glob("*.tar"))[0])
    os.symlink(shard, tmp_path / "again.tar")
    for again in (shard, str(tmp_path / "again.tar")):
        assert main(["index", shard, again, "--out", str(tmp_path / "idx"), "--no-progress"]) == 2
        assert "given twice" in capsys.readouterr().err
    assert (
        main(["index", shard, str(tmp_path / "absent.tar"), "--out", str(tmp_path / "idx"), "--no-progress"])
        == 2
    )
    assert "absent.tar: no such shard file" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()  # every shard is checked before anything is written


def test_index_upgrade_refuses_options_it_would_ignore(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in (["--out", "elsewhere"], ["--overwrite"], ["--nemo-manifest", "m.json"]):
        assert main(["index", "--upgrade", str(dataset), *extra]) == 2
        assert f"not with {extra[0]}" in capsys.readouterr().err
    assert main(["index", "--upgrade", str(dataset)]) == 0


def test_a_file_is_not_a_dataset(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that is not index.json: a usage error saying so (verify said `1 problems`, exit 1)."""
    for command in ("inspect", "verify"):
        assert main([command, str(dataset / "index.columns")]) == 2
        assert "a file, not a dataset directory" in capsys.readouterr().err
    assert main(["verify", str(dataset / "index.json"), "--no-progress"]) == 0


def test_cache_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Negative or NaN limits (--max-bytes -5 would evict everything) and options --prune alone uses."""
    for argv in (
        ["--prune", "--max-bytes", "-5"],
        ["--prune", "--stale", "nan"],
        ["--prune", "--unused-days", "-1"],
    ):
        with pytest.raises(SystemExit) as usage:
            main(["cache", *argv])
        assert usage.value.code == 2
        assert "number >= 0" in capsys.readouterr().err
    assert main(["cache", "--max-bytes", "1000"]) == 2
    assert "only with --prune" in capsys.readouterr().err
    assert main(["cache", "--prune", "--max-bytes", "1" + "0" * 400]) == 0  # no float overflow
    assert main(["cache", "--prune", "--max-bytes", "0", "--stale", "0", "--unused-days", "0.5"]) == 0


@pytest.mark.parametrize("value", ["nan", "-5", "inf", "x"])
def test_bench_step_ms_must_be_a_duration(value: str) -> None:
    """time.sleep refused it with a traceback at the very end of the bench."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--step-ms", value])
    assert build_parser().parse_args(["bench", "--step-ms", "0", "--no-progress"]).no_progress


def test_bench_webdataset_baseline_reads_each_samples_own_format() -> None:
    """A dataset of WAV and FLAC samples: the baseline decoded only the first sample's extension
    (a KeyError traceback)."""
    from shardio.bench.cases import _soundfile_sample

    flac = audio_bytes(tone(0.1, 8000), 8000, "flac")
    decoded = _soundfile_sample("wav")({"__key__": "a", "__url__": "s.tar", "flac": flac, "json": b"{}"})
    assert decoded["sample_rate"] == 8000 and decoded["audio"].shape == (1, 800)
    with pytest.raises(FormatError, match="no audio member"):
        _soundfile_sample("wav")({"__key__": "a", "__url__": "s.tar", "json": b"{}"})


def test_output_into_a_closed_pipe_is_quiet(dataset: Path) -> None:
    """`shardio inspect data | head -1`: no 'error: Broken pipe' nor a traceback at exit; 141, as a shell
    says."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    for unbuffered in ({}, {"PYTHONUNBUFFERED": "1"}):
        child = subprocess.Popen(
            [sys.executable, "-m", "shardio.cli", "inspect", str(dataset)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, **unbuffered},
        )
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()
        err = child.stderr.read().decode()
        assert child.wait() == 141
        assert err == ""


def test_every_subcommand_has_a_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [
        "pack",
        "inspect",
        "verify",
        "index",
        "demo",
        "bench",
        "trace",
        "quarantine",
        "remix",
        "cache",
    ]
    for command in commands:
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: shardio {command}") and len(text.splitlines()) > 4


def test_json_line_round_trips_surrogates() -> None:
    from shardio.packing.pack import _json_line

    name = os.fsdecode(b"a\xff.wav")
    assert json.loads(_json_line({"source": name}))["source"] == name
    assert _json_line({"source": "é"}) == '{"source": "é"}\n'


def test_pack_options_that_would_crash_or_be_ignored(
    wav_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--seed -1 was numpy's traceback; --zstd-level without zstd and --address without Ray were ignored."""
    with pytest.raises(SystemExit) as usage:
        main(["pack", str(wav_corpus), str(tmp_path / "o"), "--shuffle", "--seed", "-1"])
    assert usage.value.code == 2 and "--seed: '-1' is not a whole number >= 0" in capsys.readouterr().err
    for extra, expected in (
        (["--zstd-level", "9"], "needs --compression zstd"),
        (["--address", "auto"], "--engine ray"),
    ):
        assert main(["pack", str(wav_corpus), str(tmp_path / "o"), "--no-progress", *extra]) == 2
        assert expected in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_demo_refuses_a_corpus_it_cannot_make(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--files 999999999999 was a MemoryError traceback (7 TiB asked for)."""
    assert main(["demo", str(tmp_path / "d"), "--files", "999999999999"]) == 2
    assert "num_files must be from 1 to" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
