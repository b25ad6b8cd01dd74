"""Hostile yield logs: the files ``shardio check-resume`` reads back are written by the user's job (any code),
so they are data: a torn line, garbage, a record of the wrong types, JSON nested past the parser's depth, a
line or a log beyond the bounds, a FIFO, a symlink (a file's or the directory's, out of the workdir) each
fail as a typed error naming the file, quickly and within bounded memory; and check-resume's clean-up of its
workdir never follows a link out of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile import run_limited

from shardio import FormatError
from shardio.runtime import yieldlog
from shardio.runtime.yieldlog import read_log

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
GOOD = {
    "kind": "batch",
    "src": "ab",
    "rank": 0,
    "world": 1,
    "epoch": 0,
    "step": 0,
    "position": 1,
    "worker": None,
    "iteration": "1.2.1",
    "size": 1,
    "digest": "d",
    "t": 5,
}


def _log(tmp_path: Path, content: bytes, name: str = "1-1.jsonl") -> Path:
    directory = tmp_path / "log"
    directory.mkdir(exist_ok=True)
    (directory / name).write_bytes(content)
    return directory


def _line(**change: object) -> bytes:
    return json.dumps({**GOOD, **change}).encode() + b"\n"


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    directory = _log(tmp_path, _line() + _line(step=1)[:-9])
    assert len(read_log(str(directory))) == 1


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00garbage\x1b[31m\n" + _line(),
        _line(rank="0"),
        _line(rank=True),
        _line(epoch=-1),
        _line(step=2**80),
        _line(kind="exec"),
        _line(keys=[1, 2]),
        _line(digest="x" * 1000),
        _line(trainer="\x1b[31mexec"),
        b"[1, 2]\n",
        b"[" * 200_000 + b"]" * 200_000 + b"\n",
        b'{"kind": "load", "src": "ab", "rank": 0, "world": 1, "epoch": 0, "t": 1, "position": 1}\n',
    ],
    ids=["bytes", "str-rank", "bool-rank", "negative", "huge-int", "kind", "keys", "long-digest", "trainer",
         "list", "deep", "load-missing"],
)  # fmt: skip
def test_a_record_that_is_not_one_is_a_format_error_naming_the_line(tmp_path: Path, content: bytes) -> None:
    directory = _log(tmp_path, content)
    with pytest.raises(FormatError, match=r"1-1\.jsonl'? line 1") as caught:
        read_log(str(directory))
    assert "\x1b" not in str(caught.value) and "\x00" not in str(caught.value)


def test_a_huge_line_is_refused_within_bounded_memory(tmp_path: Path) -> None:
    directory = _log(tmp_path, b'{"kind": "' + b"a" * (64 << 20) + b'"}\n')
    done = run_limited(
        f"from shardio.runtime.yieldlog import read_log\ntry:\n    read_log({str(directory)!r})\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n",
        headroom_mb=96,
    )
    assert "FormatError" in done.stdout and "longer than" in done.stdout, done.stdout + done.stderr


def test_a_log_beyond_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _log(tmp_path, _line() * 100)
    monkeypatch.setattr(yieldlog, "MAX_BYTES", 1000)
    with pytest.raises(FormatError, match="more than 1000 bytes"):
        read_log(str(directory))
    monkeypatch.setattr(yieldlog, "MAX_FILES", 1)
    _log(tmp_path, _line(), "2-2.jsonl")
    with pytest.raises(FormatError, match="more than 1"):
        read_log(str(directory))


def test_a_fifo_is_refused_without_a_hang(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    os.mkfifo(tmp_path / "log" / "1-1.jsonl")
    with pytest.raises(FormatError, match="not a regular file"):
        read_log(str(tmp_path / "log"))


def test_symlinks_out_of_the_workdir_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_bytes(_line())
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "1-1.jsonl").symlink_to(outside / "secret.jsonl")
    with pytest.raises(FormatError, match="cannot be opened"):
        read_log(str(tmp_path / "log"))
    (tmp_path / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FormatError, match="not a directory"):
        read_log(str(tmp_path / "linked"))


JOB = """
import os, pathlib, time
if os.path.basename(os.getcwd()) == "straight":
    log = pathlib.Path(os.environ["SHARDIO_YIELD_LOG"])
    log.mkdir(parents=True, exist_ok=True)
    os.symlink({secret!r}, log / "1-1.jsonl")       # a record file that is a link out of the workdir
    os.symlink({outside!r}, "escape")                # and a link out of its working directory
elif not os.path.exists("killed"):
    open("killed", "w").close()
    time.sleep(60)                                   # until killed
"""


def test_check_resume_refuses_a_linked_log_and_its_clean_up_stays_in_the_workdir(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_bytes(_line())
    (outside / "ckpt.pt").write_bytes(b"the user's checkpoint")
    (tmp_path / "job.py").write_text(JOB.format(secret=str(outside / "secret.jsonl"), outside=str(outside)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "shardio.cli", "check-resume", "--workdir", "check", "--link", "job.py"]
    command += ["--kill-after", "1", "--", sys.executable, "job.py"]
    for _ in range(2):  # the second run removes the first's directories (links and all)
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "cannot be opened as a yield log" in done.stderr
    assert (tmp_path / "check" / "straight" / "escape").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == ["ckpt.pt", "secret.jsonl"]
    assert (outside / "ckpt.pt").read_bytes() == b"the user's checkpoint"
