"""Issue 46, item 17: what ``shardio pack`` prints about a path it was given or met (a corpus, a manifest's
audio path, an output folder, a file's extension) is escaped as keys are: a name holding a newline, an escape
sequence, a NUL or a right-to-left override (U+202E) cannot forge, hide or recolour a line of the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from audio_factory import tone, write_samples
from hostile import REPO

FORGE = "\nshardio pack: packed 0 samples, all is well\x1b[2K\x1b[31m\u202e"
"""A name that would print a forged line, erase and recolour the terminal's line, and reverse the text."""
RAW = ("\x1b", "\x00", "\u202e", "all is well\n")


def _pack(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "shardio.cli", "pack", *argv, "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, errors="surrogateescape", check=False
    )


def _assert_escaped(done: subprocess.CompletedProcess[str], *, lines: int | None = None) -> str:
    printed = done.stdout + done.stderr
    for raw in RAW:
        assert raw not in printed, printed
    assert "\\n" in printed and "\\x1b" in printed and "\\u202e" in printed, printed
    if lines is not None:
        assert len(done.stderr.splitlines()) == lines, done.stderr
    return printed


def test_a_missing_corpus_path_is_printed_escaped(tmp_path: Path) -> None:
    done = _pack(f"corpus{FORGE}", "out", cwd=tmp_path)
    assert done.returncode == 2
    _assert_escaped(done, lines=1)


def test_failing_inputs_in_a_hostile_folder_are_listed_one_line_each(tmp_path: Path) -> None:
    corpus = tmp_path / f"corpus{FORGE}"
    corpus.mkdir()
    (corpus / "bad.wav").write_bytes(b"RIFF not a wav file")
    (corpus / "worse.wav").write_bytes(b"")
    done = _pack(str(corpus), "out", cwd=tmp_path)
    assert done.returncode == 2
    _assert_escaped(done, lines=3)  # the error line, then one line per failing input


def test_a_manifest_s_audio_paths_are_printed_escaped(tmp_path: Path) -> None:
    write_samples(tmp_path / "ok.wav", tone(0.1, 8000), 8000)
    lines = [
        {"audio_filepath": "ok.wav", "id": "ok"},
        {"audio_filepath": f"missing{FORGE}.wav", "id": "missing"},
        {"audio_filepath": "nul\x00byte.wav", "id": "nul"},
    ]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = _pack(str(manifest), "out", cwd=tmp_path)
    assert done.returncode == 2
    printed = _assert_escaped(done, lines=3)
    assert "\\x00" in printed
    skipped = _pack(str(manifest), "out", "--on-error", "skip", cwd=tmp_path)
    assert skipped.returncode == 0, skipped.stderr
    assert "rejected 2 inputs" in skipped.stdout


def test_an_output_path_and_a_file_s_extension_are_printed_escaped(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_samples(corpus / "a.wav", tone(0.1, 8000), 8000)
    (corpus / f"notes.x{FORGE.replace(chr(10), '').replace('/', '')}").write_text("left out")
    (corpus / f"more.y{FORGE.replace('/', '')}").write_text("left out")
    (tmp_path / f"file{FORGE}").write_text("a file, not a folder")
    done = _pack(str(corpus), f"file{FORGE}", cwd=tmp_path)
    assert done.returncode == 3
    _assert_escaped(done, lines=1)
    done = _pack(str(corpus), "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = _assert_escaped(done)
    assert "left out:" in done.stdout and len(done.stdout.splitlines()) == 2, printed


@pytest.mark.parametrize("name", [f"out{FORGE}", "s3://bucket/x\x1b[2J\u202e\nforged"])
def test_a_refused_output_is_named_escaped(tmp_path: Path, name: str) -> None:
    from shardio.errors import OptionError
    from shardio.packing.pack import pack

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_samples(corpus / "a.wav", tone(0.1, 8000), 8000)
    out = tmp_path / name if "://" not in name else name
    if isinstance(out, Path):
        out.mkdir()
        (out / "shard-000000.tar").write_bytes(b"someone's")
    with pytest.raises(OptionError) as caught:
        pack(corpus, out, progress=False)
    message = str(caught.value)
    assert message.isprintable() and "\\x1b" in message, message
