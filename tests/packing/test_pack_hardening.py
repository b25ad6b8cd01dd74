"""Issue 13, pack side: no silent loss at pack, index and verify time, and CLI errors that say what happened.

Real files throughout; permission cases run in a real process without the capabilities that let root read
anything (``setpriv``), and the lock case holds the directory from a second real process.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import soundfile as sf
from audio_factory import audio_bytes, tone, write_text, write_tone
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.cli import build_parser, main
from shardio.errors import FormatError, InputError, OptionError
from shardio.packing.corpus import read_folder, read_jsonl, read_kaldi, read_table
from shardio.packing.folder import LOOP, UNUSED_SIDECAR
from shardio.packing.indexer import build_index
from shardio.packing.pack import pack
from shardio.packing.truncation import truncation_problem
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index
from shardio.shards.writer import ShardWriter

REPO = Path(__file__).resolve().parents[2]


def _unprivileged(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` in a real process that file permissions apply to (root
    without its DAC override)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    result = subprocess.run(
        [*prefix, sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if result.stderr.startswith("setpriv:"):
        pytest.skip(f"setpriv cannot drop the capabilities here: {result.stderr.strip()}")
    return result


def _wav(seconds: float = 0.5, rate: int = 8000) -> bytes:
    return audio_bytes(tone(seconds, rate), rate, "wav")


# -- 1-3, 5, 6: corpus reading ------------------------------------------------------------------------


def test_folder_follows_symlinked_directories_once_and_counts_what_it_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
    write_tone(corpus / "one.wav", 0.2)
    for i in range(3):
        write_tone(elsewhere / f"linked_{i}.wav", 0.2)
    (corpus / "more").symlink_to(elsewhere, target_is_directory=True)
    (corpus / "again").symlink_to(elsewhere, target_is_directory=True)  # a second path to the same files
    (elsewhere / "loop").symlink_to(corpus, target_is_directory=True)  # back to the root
    for name in ("a.aiff", "b.aiff", "c.m4a", "NOTES"):
        write_text(corpus / name, "x")
    summary = pack(corpus, tmp_path / "out", progress=False)
    assert Index.load(tmp_path / "out").keys == ["again/linked_0", "again/linked_1", "again/linked_2", "one"]
    assert summary.left_out == {".aiff": 2, ".m4a": 1, "(no extension)": 1, LOOP: 2}
    assert main(["pack", str(corpus), str(tmp_path / "cli"), "--no-progress"]) == 0
    assert f"left out: 1 (no extension), 2 .aiff, 1 .m4a, 2 {LOOP}\n" in capsys.readouterr().out


def test_folder_counts_transcripts_no_sample_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    for stem in ("a", "b", "c"):
        write_tone(corpus / f"{stem}.wav", 0.2)
    write_text(corpus / "a.TXT", "upper case extension")  # a's transcript, whatever the case
    write_text(corpus / "b.txt", "the txt wins")
    write_text(corpus / "b.lab", "beside the txt: unused")
    write_text(corpus / "c.lab", "a lab alone")
    write_text(corpus / "gone.txt", "its audio never arrived")  # a lost download must not vanish unseen
    write_text(corpus / "sub" / "gone.lab", "nor here")
    left_out: Counter[str] = Counter()
    sources = list(read_folder(corpus, left_out=left_out))
    assert [(source.key, source.meta["text"]) for source in sources] == [
        ("a", "upper case extension"),
        ("b", "the txt wins"),
        ("c", "a lab alone"),
    ]
    summary = pack(corpus, tmp_path / "out", progress=False)
    assert Index.load(tmp_path / "out").keys == ["a", "b", "c"]
    assert (
        left_out == summary.left_out == {UNUSED_SIDECAR.format(".txt"): 1, UNUSED_SIDECAR.format(".lab"): 2}
    )
    assert main(["pack", str(corpus), str(tmp_path / "cli"), "--no-progress"]) == 0
    assert "left out: 2 .lab no sample uses, 1 .txt no sample uses\n" in capsys.readouterr().out


def test_unreadable_subdirectory_is_an_input_error_naming_it(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write_tone(corpus / "one.wav", 0.2)
    write_tone(corpus / "locked" / "two.wav", 0.2)
    for path in (tmp_path, corpus):
        path.chmod(0o755)
    (corpus / "locked").chmod(0)
    try:
        result = _unprivileged(
            f"from shardio.packing.corpus import read_folder; list(read_folder({str(corpus)!r}))"
        )
    finally:
        (corpus / "locked").chmod(0o755)
    assert (
        "InputError" in result.stderr and f"{corpus / 'locked'}: cannot list this directory" in result.stderr
    )


def test_non_utf8_transcript_under_skip_is_one_rejection_not_also_packed(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    write_tone(corpus / "good.wav", 0.2)
    write_tone(corpus / "bad.wav", 0.2)
    (corpus / "bad.txt").write_bytes(b"caf\xe9\n")  # Latin-1
    summary = pack(corpus, tmp_path / "out", on_error="skip", progress=False)
    assert Index.load(tmp_path / "out").keys == ["good"]
    assert summary.samples == 1 and [p.key for p in summary.rejected] == ["bad"]
    assert "not UTF-8" in summary.rejected[0].reason
    rejected = (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 1 and json.loads(rejected[0])["key"] == "bad"


@pytest.mark.parametrize("kind", ["jsonl", "kaldi", "csv"])
def test_non_utf8_manifest_is_an_input_error_naming_file_and_line(tmp_path: Path, kind: str) -> None:
    write_tone(tmp_path / "a.wav", 0.2)
    write_tone(tmp_path / "b.wav", 0.2)
    if kind == "jsonl":
        manifest = tmp_path / "m.jsonl"
        manifest.write_bytes(b'{"audio_filepath": "a.wav"}\n{"audio_filepath": "b.wav", "text": "caf\xe9"}\n')
        reader, where = read_jsonl, f"{manifest}:2"
    elif kind == "kaldi":
        (tmp_path / "wav.scp").write_bytes(f"a {tmp_path / 'a.wav'}\nb {tmp_path / 'b.wav'}\n".encode())
        manifest = tmp_path / "text"
        manifest.write_bytes(b"a fine\nb caf\xe9\n")
        reader, where = read_kaldi, f"{manifest}:2"
    else:
        manifest = tmp_path / "m.csv"
        manifest.write_bytes(b"path,text\na.wav,fine\nb.wav,caf\xe9\n")
        reader, where = read_table, f"{manifest}:3"
    with pytest.raises(InputError, match="not UTF-8") as error:
        list(reader(tmp_path if kind == "kaldi" else manifest))
    assert error.value.problems[0].source == where


# -- 4: truncated audio -------------------------------------------------------------------------------


def _data_chunk(wav: bytes) -> int:
    return wav.index(b"data")


def test_truncated_or_inflated_wav_and_half_mp3_are_rejected_at_pack_time(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    whole = _wav(1.0)
    (corpus / "truncated.wav").write_bytes(whole[: len(whole) // 2])  # RIFF and data sizes claim the whole
    at = _data_chunk(whole)
    (corpus / "inflated.wav").write_bytes(whole[: at + 4] + struct.pack("<I", len(whole)) + whole[at + 8 :])
    mp3 = audio_bytes(tone(3.0, 16000), 16000, "mp3")
    (corpus / "half.mp3").write_bytes(mp3[: len(mp3) // 2])
    tag = mp3.index(b"Xing")  # flags 0x0f: frames, bytes, TOC, quality; a half whose byte count says "half"
    half = mp3[: tag + 12] + struct.pack(">I", len(mp3) // 2) + mp3[tag + 16 : len(mp3) // 2]
    (corpus / "half_frames.mp3").write_bytes(half)
    streaming = bytearray(whole)  # a streaming writer's sizes: 0xFFFFFFFF, "until the end of the file"
    streaming[4:8] = streaming[at + 4 : at + 8] = b"\xff\xff\xff\xff"
    (corpus / "streaming.wav").write_bytes(bytes(streaming))
    (corpus / "whole.mp3").write_bytes(mp3)
    ogg = audio_bytes(tone(3.0, 16000), 16000, "ogg")
    (corpus / "half_ogg.ogg").write_bytes(ogg[: len(ogg) // 2])  # decodes to 1 s of 3 without the check
    (corpus / "whole_ogg.ogg").write_bytes(ogg)
    summary = pack(corpus, tmp_path / "out", on_error="skip", progress=False)
    reasons = {p.key: p.reason for p in summary.rejected}
    assert sorted(reasons) == ["half", "half_frames", "half_ogg", "inflated", "truncated"]
    assert all(reason.startswith("truncated: ") for reason in reasons.values())
    assert (
        "data chunk claims 16000 bytes" in reasons["truncated"]
        and "chunk claims 16044" in reasons["inflated"]
    )
    assert "Xing header claims 12636 bytes" in reasons["half"]
    assert "the last MP3 frame is cut short" in reasons["half_frames"]  # its chain of frames (structure)
    assert "Ogg page at byte" in reasons["half_ogg"]
    assert Index.load(tmp_path / "out").keys == ["streaming", "whole", "whole_ogg"]


@settings(max_examples=60, deadline=None)
@given(
    frames=st.integers(1, 400),
    channels=st.integers(1, 3),
    subtype=st.sampled_from(["PCM_16", "PCM_24", "FLOAT"]),
    cut=st.floats(0.0, 1.0, exclude_max=True),
    trailing=st.booleans(),
)
def test_any_wav_cut_inside_its_samples_is_truncated_and_a_whole_one_is_not(
    frames: int, channels: int, subtype: str, cut: float, trailing: bool
) -> None:
    whole = audio_bytes(tone(frames / 8000, 8000, channels), 8000, "wav", subtype)
    if trailing:  # a chunk after the data chunk (LIST, as some editors write) is no truncation
        whole += b"LIST" + struct.pack("<I", 4) + b"INFO"
    assert truncation_problem(whole, "wav") is None
    start = _data_chunk(whole) + 8
    end = start + frames * channels * {"PCM_16": 2, "PCM_24": 3, "FLOAT": 4}[subtype]
    problem = truncation_problem(whole[: start + int(cut * (end - start))], "wav")
    assert problem is not None and problem.startswith("truncated: the WAV data chunk claims")


def test_verify_reports_a_truncated_member(tmp_path: Path) -> None:
    whole = _wav(1.0)
    with ShardWriter(tmp_path / "d") as writer:  # the writer trusts its caller: as another tool might have
        writer.write(
            "cut",
            {"wav": whole[: len(whole) // 2]},
            audio_ext="wav",
            num_frames=(len(whole) // 2 - 44) // 2,
            sample_rate=8000,
            channels=1,
        )
    for decode in (False, True):  # the structure checks see the cut without decoding
        problems = verify_dataset(tmp_path / "d", decode=decode)
        assert (
            len(problems) == 1
            and "sample 'cut'" in problems[0]
            and "truncated: the WAV data chunk" in problems[0]
        )


# -- 7, 8, 17: shardio index ----------------------------------------------------------------------------


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_index_keeps_txt_beside_json_and_json_wins_on_a_clash(tmp_path: Path) -> None:
    from shardio import ShardDataset

    _tar(
        tmp_path / "s-000000.tar",
        {
            "a.wav": _wav(0.2),
            "a.txt": b"the transcript",
            "a.json": b'{"speaker": 7}',
            "b.wav": _wav(0.2),
            "b.txt": b"from txt",
            "b.json": b'{"text": "from json"}',
        },
    )
    build_index([tmp_path / "s-000000.tar"])
    samples = {s["key"]: s for s in ShardDataset(tmp_path, shuffle=False)}
    assert (samples["a"]["text"], samples["a"]["speaker"]) == ("the transcript", 7)
    assert samples["b"]["text"] == "from json"


def test_index_refuses_to_replace_an_index_unless_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = [_tar(tmp_path / f"s-{i:06d}.tar", {f"k{i}.wav": _wav(0.2)}) for i in range(3)]
    build_index(shards)
    before = (tmp_path / "index.json").read_bytes()
    with pytest.raises(OptionError, match="already holds an index"):
        build_index(shards[:1])
    assert main(["index", str(shards[0])]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "index.json").read_bytes() == before
    assert main(["index", str(shards[0]), "--overwrite"]) == 0
    assert len(Index.load(tmp_path).shards) == 1


@pytest.mark.parametrize("name", ["../../x.wav", "/abs/x.wav", "a/./x.wav"])
def test_index_applies_packs_key_rules(tmp_path: Path, name: str) -> None:
    shard = _tar(tmp_path / "s.tar", {"fine.wav": _wav(0.2), name: _wav(0.2)})
    with pytest.raises(FormatError, match="breaks pack's key rules") as error:
        build_index([shard])
    assert str(shard) in str(error.value) and not (tmp_path / "index.json").exists()


# -- 9: CLI errors, the lock, the journal -------------------------------------------------------------


def test_output_that_cannot_be_written_exits_3_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    write_tone(corpus / "one.wav", 0.2)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "below"):
        assert main(["pack", str(corpus), str(out), "--no-progress"]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and str(tmp_path / "afile") in err
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o555)
    for path in (tmp_path, corpus):
        path.chmod(0o755)
    (corpus / "one.wav").chmod(0o644)
    result = _unprivileged(
        f"import sys; from shardio.cli import main; "
        f"sys.exit(main(['pack', {str(corpus)!r}, {str(readonly)!r}, '--no-progress']))"
    )
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("\n") == 1 and str(readonly) in result.stderr


def test_overwrite_message_names_the_flag_and_the_flag_works(
    wav_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "o")
    assert main(["pack", str(wav_corpus), out, "--no-progress"]) == 0
    assert main(["pack", str(wav_corpus), out, "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (
        main(["pack", str(wav_corpus), out, "--no-progress", "--overwrite", "--samples-per-shard", "16"]) == 0
    )
    assert len(Index.load(out).shards) == 3


def test_a_second_writer_is_refused_naming_the_holder(wav_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import io, time, numpy, soundfile; "
            "from shardio.shards.writer import ShardWriter; "
            f"w = ShardWriter({str(out)!r}, max_samples=1); b = io.BytesIO(); "
            "soundfile.write(b, numpy.zeros(80), 8000, format='WAV'); "
            "[w.write(k, {'wav': b.getvalue()}, audio_ext='wav', num_frames=80, sample_rate=8000, "
            "channels=1) for k in 'ab']; print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = subprocess.run(
            [sys.executable, "-m", "shardio.cli", "pack", str(wav_corpus), str(out), "--no-progress"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 3, result.stderr
        assert f"is being written by another shardio run (pid {holder.pid} on host" in result.stderr
        assert "Traceback" not in result.stderr and not (out / "index.json").exists()
        assert (out / "shard-000000.tar").is_file()  # the holder's finished shard is untouched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert pack(wav_corpus, out, progress=False).samples == 48  # the kernel dropped the dead holder's lock
    assert sorted(p.name for p in out.iterdir()) == ["index.columns", "index.json", "shard-000000.tar"]


def test_a_failed_pack_leaves_no_journal(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    for i in range(3):
        write_tone(corpus / f"{i}.wav", 0.2)
    (corpus / "3.wav").write_bytes(b"not audio")
    with pytest.raises(InputError):
        pack(corpus, tmp_path / "out", samples_per_shard=1, progress=False)
    assert not (tmp_path / "out").exists()  # nothing left, not even the directory the run made


def test_verbose_either_side_help_defaults_version_and_descriptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["inspect", "d"]).verbose == 0
    assert parser.parse_args(["-v", "inspect", "d"]).verbose == 1
    assert parser.parse_args(["inspect", "d", "-vv"]).verbose == 2
    with pytest.raises(SystemExit) as done:
        main(["pack", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--samples-per-shard N roll",
        "--compression {none,zstd} shard compression",
        "(default none)",
        "(default 3)",
        "--seed SEED the seed of --shuffle (default 0)",
        "--workers WORKERS threads reading",
        "--overwrite replace",
    ):
        assert option in text
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("shardio ")
    for command in ("inspect", "verify", "index"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        help_text = capsys.readouterr().out
        assert help_text.split("\n\n")[1].strip()  # a description paragraph after the usage


# -- 10: verify goes on past a shard it cannot read --------------------------------------------------


def test_verify_lists_a_directory_or_unreadable_shard_and_goes_on(wav_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    pack(wav_corpus, out, samples_per_shard=16, progress=False)
    (out / "shard-000000.tar").unlink()
    (out / "shard-000000.tar").mkdir()
    problems = verify_dataset(out)
    assert (
        len(problems) == 1
        and "shard-000000.tar: a directory is where the shard file should be" in problems[0]
    )
    (out / "shard-000000.tar").rmdir()
    pack(wav_corpus, out, samples_per_shard=16, progress=False, overwrite=True)
    for path in (tmp_path, out):
        path.chmod(0o755)
    (out / "shard-000001.tar").chmod(0)
    (out / "shard-000002.tar").write_bytes(b"\0" * 10)
    result = _unprivileged(
        f"import json; from shardio.packing.verification import verify_dataset; "
        f"print(json.dumps(verify_dataset({str(out)!r})))"
    )
    problems = json.loads(result.stdout)
    assert any(
        p.startswith("shard-000001.tar: the shard file cannot be read (Permission denied)") for p in problems
    )
    assert any(p.startswith("shard-000002.tar: SHA-256") for p in problems), problems


# -- 12: samples no plan will ever yield --------------------------------------------------------------


def test_samples_left_out_by_duration_warn_once_per_plan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shardio import ShardDataset

    corpus = tmp_path / "corpus"
    for i, seconds in enumerate((0.5, 0.5, 6.0, 9.0)):
        write_tone(corpus / f"{i}.wav", seconds, 8000)
    pack(corpus, tmp_path / "d", progress=False)
    dataset = ShardDataset(tmp_path / "d", max_duration=5.0)
    with caplog.at_level(logging.WARNING, logger="shardio"):
        dataset.plan(0)
        dataset.plan(0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"epoch 0: 2 samples ({15 / 3600:.3f} h) are left out of the plan: longer than max_duration "
        "alone, or outside min_duration/max_sample_duration"
    ]


# -- 16: index files follow the umask ----------------------------------------------------------------


def test_index_files_follow_the_umask(wav_corpus: Path, tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        pack(wav_corpus, tmp_path / "o", progress=False)
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "o").iterdir()}
    assert modes == {"index.json": 0o600, "index.columns": 0o600, "shard-000000.tar": 0o600}


# -- 11: -j N without process start-up ---------------------------------------------------------------


def _children() -> set[int]:
    return {
        int(pid)
        for task in Path("/proc/self/task").iterdir()
        for pid in (task / "children").read_text().split()
    }


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_parallel_pack_starts_no_process_and_defaults_to_one_worker_a_core(
    wav_corpus: Path, tmp_path: Path
) -> None:
    from shardio.packing.pack import default_workers

    before = _children()
    summary = pack(wav_corpus, tmp_path / "o", workers=3, transcode="flac", progress=False)
    assert summary.samples == 48 and _children() <= before  # workers are threads: nothing to start or pickle
    assert default_workers() == len(os.sched_getaffinity(0))


@settings(max_examples=40, deadline=None)
@given(
    parents=st.lists(st.integers(0, 50), min_size=1, max_size=6),
    files=st.lists(st.integers(0, 50), max_size=8),
    links=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=5),
)
def test_folder_walk_reads_every_reachable_file_once_through_any_links(
    tmp_path_factory: pytest.TempPathFactory,
    parents: list[int],
    files: list[int],
    links: list[tuple[int, int]],
) -> None:
    """Random trees with directory links anywhere (loops included): the walk ends, every audio file that can
    be reached is read exactly once, and every link not followed is counted."""
    root = tmp_path_factory.mktemp("tree")
    dirs = [root]
    for number, parent in enumerate(parents):  # each directory under an earlier one
        dirs.append(dirs[parent % len(dirs)] / f"d{number}")
        dirs[-1].mkdir()
    for number, where in enumerate(files):
        (dirs[where % len(dirs)] / f"f{number}.wav").write_bytes(b"")
    for number, (where, target) in enumerate(links):
        (dirs[where % len(dirs)] / f"l{number}").symlink_to(
            dirs[target % len(dirs)], target_is_directory=True
        )
    left_out: Counter[str] = Counter()
    sources = list(read_folder(root, left_out=left_out))
    real = [os.path.realpath(s.audio_path) for s in sources]
    assert sorted(real) == sorted(
        {os.path.realpath(dirs[w % len(dirs)] / f"f{n}.wav") for n, w in enumerate(files)}
    )
    assert left_out[LOOP] == len(links)  # every link here points at a real directory that is walked anyway


def test_mp3_check_reads_past_an_id3_tag_and_lets_whole_files_through() -> None:
    mp3 = audio_bytes(tone(2.0, 22050, 2), 22050, "mp3")  # MPEG-2 stereo: the Xing tag at another offset
    tag = b"ID3\x04\x00\x00" + bytes([0, 0, 1, 0]) + b"\0" * 128  # a syncsafe size of 128
    frames = len(sf.read(io.BytesIO(mp3))[0])
    assert truncation_problem(tag + mp3, "mp3", frames) is None
    assert (
        truncation_problem(tag + mp3 + b"TAG" + b"\0" * 125, "mp3", frames) is None
    )  # an ID3v1 tag at the end
    assert "claims" in str(truncation_problem(tag + mp3[: len(mp3) * 2 // 3], "mp3"))
    assert "MPEG frames" in str(truncation_problem(tag + mp3, "mp3", frames // 2))
