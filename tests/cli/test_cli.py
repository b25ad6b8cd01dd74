"""The shardio command line: subcommands, exit codes, size parsing, errors without tracebacks."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardio.cli import main, parse_size
from shardio.shards.index import Index

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256MB", 256_000_000),
        ("1.5GiB", 3 * 2**29),
        ("4096", 4096),
        ("10 kb", 10_000),
        ("2MiB", 2 * 2**20),
        ("1GB", 10**9),
        ("7B", 7),
        ("3KiB", 3072),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "12XB", "-5MB", "0", "1e3"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_pack_inspect_verify_index(
    mixed_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert (
        main(
            [
                "pack",
                str(mixed_corpus),
                str(out),
                "--shard-size",
                "20KB",
                "--compression",
                "zstd",
                "--zstd-level",
                "5",
                "--no-progress",
                "--shuffle",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.startswith("packed 5 samples (0.001 h) into ") and "MB/s" in printed
    assert len(Index.load(out).shards) > 1
    assert main(["inspect", str(out)]) == 0
    assert "samples      5" in capsys.readouterr().out
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 5
    assert main(["verify", str(out), "--decode"]) == 0
    printed, bars = capsys.readouterr()
    assert printed.strip() == f"{out}: OK" and "verify: 100%" in bars  # long work shows a bar, on stderr
    assert main(["verify", str(out), "--no-progress"]) == 0
    assert "verify:" not in capsys.readouterr().err
    shard = sorted(out.glob("*.tar.zst"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{shard.name}: " in err and "problems" in err
    (out / "index.json").unlink()
    assert main(["index", *map(str, sorted(out.glob("*.tar.zst"))[1:]), "--out", str(tmp_path / "idx")]) == 0
    printed, bars = capsys.readouterr()
    assert "indexed" in printed and "index: 100%" in bars
    assert Index.load(tmp_path / "idx", allow_outside_root=True).shards[0].name.startswith("../out/")
    assert main(["verify", str(tmp_path / "idx")]) == 1  # shards outside the index's directory: the opt-in
    assert "allow_outside_root" in capsys.readouterr().err
    assert main(["verify", "--allow-outside-root", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "mistyped")]) == 2  # a usage error, not a damaged dataset (exit 1)
    assert capsys.readouterr().err.strip().endswith("mistyped: no such dataset directory or index file")
    assert (
        main(["verify", "--allow-outside-root", str(tmp_path / "idx" / "index.json")]) == 0
    )  # its index.json


def test_pack_options_reach_pack(
    wav_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "pack",
                str(wav_corpus),
                str(tmp_path / "o"),
                "--samples-per-shard",
                "20",
                "--transcode",
                "wav",
                "--prefix",
                "train",
                "--kind",
                "folder",
                "--require-text",
                "--no-progress",
                "-j",
                "1",
            ]
        )
        == 0
    )
    index = Index.load(tmp_path / "o")
    assert [s.name for s in index.shards] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert index.formats == ["wav"]


def test_errors_exit_2_with_the_message(
    mixed_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (mixed_corpus / "broken.wav").write_bytes(b"junk")
    assert main(["pack", str(mixed_corpus), str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "shardio pack: error: 1 input(s) failed validation" in err and "broken.wav" in err
    assert "Traceback" not in err
    assert main(["pack", str(mixed_corpus), str(tmp_path / "o"), "--no-progress", "--on-error", "skip"]) == 0
    assert "rejected 1 inputs" in capsys.readouterr().out
    assert main(["pack", str(mixed_corpus), str(tmp_path / "o"), "--no-progress"]) == 2
    assert "already holds a dataset" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert "no index here" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "x.zip")]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        main(["pack", str(mixed_corpus)])
    assert usage.value.code == 2
    error = capsys.readouterr().err  # one line, as every error (argparse would print its usage block first)
    assert (
        error
        == "shardio pack: error: the following arguments are required: out_dir (see 'shardio pack --help')\n"
    )


def test_module_entry_point_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardio.cli",
            "pack",
            str(tmp_path / "absent"),
            str(tmp_path / "o"),
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "no such corpus file or directory" in result.stderr and "Traceback" not in result.stderr
