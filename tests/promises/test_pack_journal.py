"""Issue 46, the pack journal: a run's ``.shard.writing`` names each shard it finished (size, SHA-256), and
the next ``shardio pack`` into the folder removes only files the journal vouches for. A pack killed with
SIGKILL right after it starts or mid-pack, then foreign or altered shard files planted: refused, nothing
deleted; a tampered, huge, garbage or non-regular journal: refused, never trusted."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from audio_factory import make_folder_corpus
from hostile import REPO

from shardio.errors import OptionError, OutputError
from shardio.shards.journal import MAX_JOURNAL_BYTES
from shardio.shards.writer import ShardWriter

JOURNAL = ".shard.writing"


def _pack_command(corpus: Path, out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "shardio.cli", "pack", str(corpus), str(out), "--no-progress", *options]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _killed_pack(tmp_path: Path, until: str) -> tuple[Path, Path]:
    """``shardio pack`` of 300 short WAVs into shards of 10 samples, killed with SIGKILL once ``until``
    exists in its output folder: the corpus and the folder."""
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 300, seconds=(0.2, 0.3), sample_rate=16000, texts=False)
    out = tmp_path / "out"
    command = _pack_command(corpus, out, "--samples-per-shard", "10", "--transcode", "flac")
    process = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / until).exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"pack never wrote {until}"
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert not (out / "index.json").exists(), "the pack finished before it was killed"
    assert (out / JOURNAL).exists()
    return corpus, out


def _foreign_shard(path: Path, text: str = "not shardio's") -> bytes:
    """A tar named like a shard that no shardio run wrote."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("x.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def _run(corpus: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = _pack_command(corpus, out, "--samples-per-shard", "10", "--transcode", "flac")
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, check=False)


def _files(out: Path) -> dict[str, str]:
    files = (p for p in out.iterdir() if p.is_file() and p.name != ".shardio.lock")  # the lock: released
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_a_pack_killed_right_after_start_leaves_a_journal_that_vouches_for_nothing(tmp_path: Path) -> None:
    corpus, out = _killed_pack(tmp_path, JOURNAL)
    foreign = {name: _foreign_shard(out / name) for name in ("shard-000000.tar", "shard-000003.tar")}
    done = _run(corpus, out)  # main 2e2a2c2 deleted both and exited 0
    assert done.returncode == 2, done.stderr
    assert "that its run did not write" in done.stderr and "nothing was replaced" in done.stderr
    assert {name: (out / name).read_bytes() for name in foreign} == foreign
    assert not (out / "index.json").exists()


@pytest.mark.slow  # its refusals are held by the fast hostile-journal cases too
def test_a_pack_killed_mid_pack_resumes_over_its_own_shards_only(tmp_path: Path) -> None:
    corpus, out = _killed_pack(tmp_path, "shard-000002.tar")
    journal = (out / JOURNAL).read_text().splitlines()
    ours = sorted(p.name for p in out.glob("shard-*.tar"))
    assert len(journal) >= 1 + len(ours) and len(ours) >= 3
    for line in journal[1:]:  # every finished shard is named with its size and digest
        entry = json.loads(line)
        if (out / entry["name"]).exists():
            data = (out / entry["name"]).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"])

    planted = _foreign_shard(out / "shard-000250.tar")  # not a name the journal holds
    before = _files(out)
    done = _run(corpus, out)
    assert done.returncode == 2 and "shard-000250.tar" in done.stderr, done.stderr
    assert _files(out) == before
    (out / "shard-000250.tar").unlink()

    first = out / "shard-000000.tar"  # one of the run's names, its bytes changed (same size)
    original = first.read_bytes()
    first.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    before = _files(out)
    done = _run(corpus, out)
    assert done.returncode == 2 and "size or SHA-256 differs" in done.stderr, done.stderr
    assert _files(out) == before

    first.write_bytes(original)  # the run's own files again: replaced, the pack completes
    done = _run(corpus, out)
    assert done.returncode == 0, done.stderr
    assert not (out / JOURNAL).exists() and not list(out.glob(".*.partial"))
    assert len(list(out.glob("shard-*.tar"))) == 30
    assert planted  # (the planted file was the user's to remove)


def _journal_line(record: object) -> str:
    return json.dumps(record) + "\n"


_HEADER = _journal_line({"journal": "shardio-shards", "version": 1, "prefix": "shard", "suffix": ".tar"})


def _entry(name: str, data: bytes) -> str:
    return _journal_line({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def _hostile_journals(foreign: bytes) -> dict[str, bytes | str]:
    """Journals that must not be trusted, each beside a foreign ``shard-000000.tar`` (``foreign``)."""
    good_entry = _entry("shard-000000.tar", foreign)
    return {
        "old flag (empty)": b"",
        "garbage bytes": os.urandom(4096),
        "not UTF-8": _HEADER.encode() + b"\xff\xfe\n",
        "cut last line": _HEADER + good_entry[:-5],
        "no header": good_entry,
        "other prefix": _HEADER.replace('"shard"', '"other"') + good_entry,
        "unknown version": _HEADER.replace('"version": 1', '"version": 2') + good_entry,
        "a list": _HEADER + "[1, 2]\n",
        "deep nesting": _HEADER + "[" * 100_000 + "]" * 100_000 + "\n",
        "huge line": _HEADER + _journal_line({"name": "shard-000000.tar", "pad": "x" * 10_000}),
        "path outside": _HEADER + _entry("../shard-000000.tar", foreign),
        "escape in name": _HEADER + _entry("shard-000000.tar\n\x1b[2J", foreign),
        "out of order": _HEADER + _entry("shard-000001.tar", foreign),
        "bool size": _HEADER + _journal_line({"name": "shard-000000.tar", "bytes": True, "sha256": "0" * 64}),
        "negative size": _HEADER
        + _journal_line({"name": "shard-000000.tar", "bytes": -1, "sha256": "0" * 64}),
        "huge size": _HEADER
        + _journal_line({"name": "shard-000000.tar", "bytes": 1 << 70, "sha256": "0" * 64}),
        "bad digest": _HEADER + _journal_line({"name": "shard-000000.tar", "bytes": 5, "sha256": "zz"}),
        "extra key": _HEADER
        + _journal_line({"name": "shard-000000.tar", "bytes": 5, "sha256": "0" * 64, "x": 1}),
        "wrong digest": _HEADER
        + _journal_line({"name": "shard-000000.tar", "bytes": len(foreign), "sha256": "0" * 64}),
        "wrong size": _HEADER
        + _journal_line(
            {
                "name": "shard-000000.tar",
                "bytes": len(foreign) + 1,
                "sha256": hashlib.sha256(foreign).hexdigest(),
            }
        ),
    }


@pytest.mark.parametrize("case", sorted(_hostile_journals(b"")))
def test_a_hostile_journal_deletes_nothing(tmp_path: Path, case: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    foreign = _foreign_shard(out / "shard-000000.tar")
    journal = _hostile_journals(foreign)[case]
    (out / JOURNAL).write_bytes(
        journal.encode("utf-8", "surrogateescape") if isinstance(journal, str) else journal
    )
    partial = out / ".shard-000000.tar.partial"
    partial.write_bytes(b"someone's")
    with pytest.raises(OptionError) as caught:
        ShardWriter(out)
    assert (out / "shard-000000.tar").read_bytes() == foreign and partial.read_bytes() == b"someone's"
    message = str(caught.value)
    assert message.isprintable() and "\x1b" not in message and len(message) < 2000


def test_a_journal_over_the_bound_is_refused_unread(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    foreign = _foreign_shard(out / "shard-000000.tar")
    with open(out / JOURNAL, "wb") as handle:  # sparse: MAX_JOURNAL_BYTES + 1 bytes, a valid start
        handle.write((_HEADER + _entry("shard-000000.tar", foreign)).encode())
        handle.truncate(MAX_JOURNAL_BYTES + 1)
    with pytest.raises(OptionError, match="holds over"):
        ShardWriter(out)
    assert (out / "shard-000000.tar").read_bytes() == foreign


@pytest.mark.parametrize("what", ["fifo", "directory", "symlink", "dangling symlink"])
def test_a_journal_that_is_not_a_regular_file_is_refused_without_a_hang(tmp_path: Path, what: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    foreign = _foreign_shard(out / "shard-000000.tar")
    journal = out / JOURNAL
    target = tmp_path / "elsewhere"
    target.write_text(_HEADER + _entry("shard-000000.tar", foreign))  # would vouch, if followed
    make: dict[str, Any] = {
        "fifo": lambda: os.mkfifo(journal),
        "directory": journal.mkdir,
        "symlink": lambda: journal.symlink_to(target),
        "dangling symlink": lambda: journal.symlink_to(tmp_path / "nowhere"),
    }
    make[what]()
    with pytest.raises(OutputError, match="not a journal shardio wrote"):
        ShardWriter(out)
    assert (out / "shard-000000.tar").read_bytes() == foreign


def test_a_journal_vouches_only_for_regular_files_not_links(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "precious.tar"
    data = _foreign_shard(elsewhere)
    (out / "shard-000000.tar").symlink_to(elsewhere)
    (out / JOURNAL).write_text(_HEADER + _entry("shard-000000.tar", data))
    with pytest.raises(OptionError, match="size or SHA-256 differs"):
        ShardWriter(out)
    assert (out / "shard-000000.tar").is_symlink() and elsewhere.read_bytes() == data


@pytest.mark.parametrize("finished", [0, 1, 2])
def test_the_partial_of_the_shard_being_written_is_replaced_and_no_other(
    tmp_path: Path, finished: int
) -> None:
    """Killed while writing shard ``finished`` (its partial there), or after journaling shard ``finished - 1``
    but before its rename: the run's own partials go, any other partial is a refusal."""
    out = tmp_path / "out"
    out.mkdir()
    shards = [_foreign_shard(out / f"shard-{n:06d}.tar", f"shard {n}") for n in range(finished)]
    (out / JOURNAL).write_text(
        _HEADER + "".join(_entry(f"shard-{n:06d}.tar", shards[n]) for n in range(finished))
    )
    stranger = out / f".shard-{finished + 1:06d}.tar.partial"
    stranger.write_bytes(b"someone's")
    (out / f".shard-{finished:06d}.tar.partial").write_bytes(b"half a shard")
    with pytest.raises(OptionError, match=r"\.shard-\d+\.tar\.partial, which is not the partial shard"):
        ShardWriter(out)
    assert stranger.exists() and len(list(out.glob("shard-*.tar"))) == finished
    stranger.unlink()
    if finished:  # journaled, killed before its rename: its partial is there, its final name not
        (out / f"shard-{finished - 1:06d}.tar").rename(out / f".shard-{finished - 1:06d}.tar.partial")
    ShardWriter(out).abort()
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_partitioned_re_run_never_replaces_a_file_in_a_partition_s_way(tmp_path: Path) -> None:
    """A plan from an interrupted partitioned pack, then a foreign file planted under the name of an
    uncommitted partition's shard: the re-run refuses it, naming it (main 2e2a2c2 replaced it)."""
    from audio_factory import make_folder_corpus as corpus_of

    from shardio.packing.engines import pack_partitioned
    from shardio.packing.partitions import PartitionPlan, pack_partition

    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus_of(corpus, 12, seed=6)
    options: dict[str, Any] = dict(partition_bytes=20_000, samples_per_shard=2, progress=False)

    def first(plan: PartitionPlan, numbers: list[int]) -> None:
        pack_partition(plan.job(numbers[0]))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pack_partitioned(corpus, out, engine=first, **options)
    foreign = _foreign_shard(out / "shard-00001-000000.tar")
    with pytest.raises(OptionError, match=r"shard-00001-000000.tar: a file that is not partition 1's shard"):
        pack_partitioned(corpus, out, **options)
    assert (out / "shard-00001-000000.tar").read_bytes() == foreign
    (out / "shard-00001-000000.tar").unlink()
    summary = pack_partitioned(corpus, out, **options)
    assert summary.samples == 12


def test_a_fifo_named_like_a_journaled_shard_is_refused_unopened(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "shard-000000.tar")
    (out / JOURNAL).write_text(_HEADER + _entry("shard-000000.tar", b"x"))
    with pytest.raises(OptionError, match="size or SHA-256 differs"):
        ShardWriter(out)
    assert (out / "shard-000000.tar").exists()


def test_a_failing_pack_removes_its_own_shards_and_no_file_put_there_meanwhile(tmp_path: Path) -> None:
    """``on_error="raise"``: the first failing input makes the run remove the shards it finished. A
    shard-named file another put in the folder while it ran is not among them (main 2e2a2c2 removed every
    shard-named file that was not there when the run began)."""
    import threading

    from audio_factory import make_folder_corpus as corpus_of

    from shardio.errors import InputError
    from shardio.packing.pack import pack

    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus_of(corpus, 200, seconds=(0.1, 0.2), sample_rate=8000, texts=False)
    inputs = sorted(corpus.rglob("*.wav"))
    assert len(inputs) == 200
    inputs[150].write_bytes(b"RIFF not audio")  # an input late in the run fails
    planted: list[bytes] = []

    def plant() -> None:
        deadline = time.monotonic() + 60
        while not (out / "shard-000001.tar").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        planted.append(_foreign_shard(out / "shard-000777.tar"))

    planter = threading.Thread(target=plant)
    planter.start()
    try:
        with pytest.raises(InputError):
            pack(corpus, out, samples_per_shard=1, workers=1, progress=False)
    finally:
        planter.join()
    assert sorted(p.name for p in out.iterdir()) == ["shard-000777.tar"]
    assert (out / "shard-000777.tar").read_bytes() == planted[0]
