"""pack: original bytes kept, exact read-back at the index offsets, determinism, segments, transcoding,
shard rolling, an interrupted (killed or Ctrl-C) pack that leaves nothing half-written and can be re-run, and
a writer that never deletes shard files it did not write."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import zstandard
from audio_factory import make_folder_corpus, tone, write_samples, write_text, write_tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.errors import OptionError
from shardio.packing.pack import pack
from shardio.packing.verification import verify_dataset
from shardio.shards.index import Index
from shardio.shards.tarformat import parse_members, walk
from shardio.shards.writer import ShardWriter

REPO = Path(__file__).resolve().parents[2]


def sample_members(index: Index, sample: int) -> dict[str, bytes]:
    """Sample ``sample``'s members read straight from the shard file at the index's offsets."""
    c = index.columns
    shard = int(c["shard"][sample])
    with open(index.shard_path(shard), "rb") as handle:
        handle.seek(int(c["frame_offset"][sample]))
        frame = handle.read(int(c["frame_size"][sample]))
    if index.shards[shard].codec == "zstd":
        frame = zstandard.ZstdDecompressor().decompress(frame)
    start = int(c["member_offset"][sample])
    data = frame[start : start + int(c["member_size"][sample])]
    return {name: bytes(view) for name, view in parse_members(data, "test")}


def dataset_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_pack_keeps_original_bytes_of_every_format(mixed_corpus: Path, tmp_path: Path) -> None:
    summary = pack(mixed_corpus, tmp_path / "out", progress=False)
    index = Index.load(tmp_path / "out")
    assert (summary.samples, summary.shards, summary.rejected) == (5, 1, [])
    assert summary.bytes == (tmp_path / "out" / "shard-000000.tar").stat().st_size
    assert summary.hours == pytest.approx((0.4 + 0.6 + 0.5 + 0.7 + 0.3) / 3600, rel=0.01)
    assert index.keys == ["a_wav", "b_flac", "e_stereo", "sub/c_ogg", "sub/deep/d_mp3"]
    originals = {
        "a_wav": "a_wav.wav",
        "b_flac": "b_flac.flac",
        "e_stereo": "e_stereo.wav",
        "sub/c_ogg": "sub/c_ogg.ogg",
        "sub/deep/d_mp3": "sub/deep/d_mp3.mp3",
    }
    for sample, key in enumerate(index.keys):
        members = sample_members(index, sample)
        ext = originals[key].rsplit(".", 1)[1]
        assert list(members) == [f"{key}.{ext}", f"{key}.json"]
        assert members[f"{key}.{ext}"] == (mixed_corpus / originals[key]).read_bytes()
        info = sf.info(mixed_corpus / originals[key])
        meta = json.loads(members[f"{key}.json"])
        assert meta["duration"] == round(int(index.columns["num_frames"][sample]) / info.samplerate, 6)
        assert (int(index.columns["sample_rate"][sample]), int(index.columns["channels"][sample])) == (
            info.samplerate,
            info.channels,
        )
    assert json.loads(sample_members(index, 0)["a_wav.json"]) == {"duration": 0.4, "text": "the wav one"}
    assert sorted(index.formats) == ["flac", "mp3", "ogg", "wav"]
    assert verify_dataset(tmp_path / "out", decode=True) == []


_SAMPLE = st.fixed_dictionaries(
    {
        "seconds": st.floats(0.01, 0.3),
        "rate": st.sampled_from([8000, 16000, 22050]),
        "channels": st.integers(1, 2),
        "ext": st.sampled_from(["wav", "flac"]),
        "text": st.text(max_size=30),
        "extra": st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    samples=st.lists(_SAMPLE, min_size=1, max_size=8),
    compression=st.sampled_from(["none", "zstd"]),
    per_shard=st.integers(1, 4),
    by_count=st.booleans(),
)
def test_read_back_at_index_offsets_returns_exact_bytes_and_metadata(
    samples: list[dict], compression: str, per_shard: int, by_count: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = []
        for i, spec in enumerate(samples):
            path = write_tone(
                root / "in" / f"s{i}.{spec['ext']}",
                spec["seconds"],
                spec["rate"],
                channels=spec["channels"],
                seed=i,
            )
            lines.append(
                {
                    "audio_filepath": path.name,
                    "text": spec["text"],
                    "extra": spec["extra"],
                    "duration": spec["seconds"],
                }
            )
        write_text(root / "in" / "manifest.jsonl", "\n".join(json.dumps(x) for x in lines))
        pack(
            root / "in" / "manifest.jsonl",
            root / "out",
            compression=compression,
            progress=False,
            samples_per_shard=per_shard if by_count else None,
            shard_bytes=None if by_count else 4096,
        )
        index = Index.load(root / "out")
        assert index.keys == [f"s{i}" for i in range(len(samples))]
        for i, spec in enumerate(samples):
            members = sample_members(index, i)
            audio = (root / "in" / f"s{i}.{spec['ext']}").read_bytes()
            assert members[f"s{i}.{spec['ext']}"] == audio
            frames = sf.info(io.BytesIO(audio)).frames
            assert json.loads(members[f"s{i}.json"]) == {
                "text": spec["text"],
                "extra": spec["extra"],
                "duration": round(frames / spec["rate"], 6),
            }
            assert int(index.columns["num_frames"][i]) == frames


def test_workers_give_byte_identical_shards_index_and_report(wav_corpus: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 40, formats=("wav", "flac", "ogg"))
    (corpus / "d0" / "broken.wav").write_bytes(b"RIFF not really")
    options = dict(
        compression="zstd", transcode="flac", samples_per_shard=15, on_error="skip", progress=False
    )
    one = pack(corpus, tmp_path / "j1", workers=1, **options)
    two = pack(corpus, tmp_path / "j2", workers=2, **options)
    assert (one.samples, one.shards, len(one.rejected)) == (40, 3, 1)
    assert (two.samples, two.shards, two.rejected) == (one.samples, one.shards, one.rejected)
    assert dataset_files(tmp_path / "j1") == dataset_files(tmp_path / "j2")
    assert "rejected.jsonl" in dataset_files(tmp_path / "j1")


def test_same_input_same_bytes_and_shuffle_by_seed(wav_corpus: Path, tmp_path: Path) -> None:
    pack(wav_corpus, tmp_path / "a", samples_per_shard=10, progress=False)
    pack(wav_corpus, tmp_path / "b", samples_per_shard=10, progress=False)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")
    keys = {}
    for name, seed in (("s1", 1), ("s1again", 1), ("s2", 2)):
        pack(wav_corpus, tmp_path / name, shuffle=True, seed=seed, progress=False)
        keys[name] = Index.load(tmp_path / name).keys
    plain = Index.load(tmp_path / "a").keys
    assert keys["s1"] == keys["s1again"] and keys["s1"] != keys["s2"] and keys["s1"] != plain
    assert sorted(keys["s1"]) == sorted(plain)


def _kaldi_segments(root: Path) -> tuple[Path, np.ndarray]:
    audio = (tone(3.0, 8000) * 32767).astype(np.int16)
    write_samples(root / "rec.wav", audio, 8000)
    write_text(root / "data" / "wav.scp", f"rec {root / 'rec.wav'}\n")
    write_text(root / "data" / "segments", "a rec 0.5 1.0\nb rec 1.0 2.75\nwhole rec 0 3.0\n")
    write_text(root / "data" / "text", "a first\nb second\nwhole all of it\n")
    return root / "data", audio


@pytest.mark.parametrize("transcode", [None, "wav"])
def test_segments_are_cut_exactly(tmp_path: Path, transcode: str | None) -> None:
    data, audio = _kaldi_segments(tmp_path)
    pack(data, tmp_path / "out", transcode=transcode, progress=False)
    index = Index.load(tmp_path / "out")
    ext = transcode or "flac"
    members = sample_members(index, 0)
    cut, rate = sf.read(io.BytesIO(members[f"a.{ext}"]), dtype="int16")
    assert rate == 8000 and np.array_equal(cut, audio[4000:8000, 0])
    assert json.loads(members["a.json"]) == {
        "text": "first",
        "recording": "rec",
        "offset": 0.5,
        "duration": 0.5,
    }
    cut, _ = sf.read(io.BytesIO(sample_members(index, 1)[f"b.{ext}"]), dtype="int16")
    assert np.array_equal(cut, audio[8000:22000, 0])
    # a "segment" covering the whole recording keeps the original bytes
    assert sample_members(index, 2)["whole.wav"] == (tmp_path / "rec.wav").read_bytes()
    assert list(index.columns["num_frames"]) == [4000, 14000, 24000]


def test_transcode_is_lossless_for_pcm_and_clips_lossy(tmp_path: Path) -> None:
    pcm = (tone(0.5, 16000, channels=2) * 32767).astype(np.int16)
    write_samples(tmp_path / "in" / "pcm16.wav", pcm, 16000)
    pcm24 = (tone(0.5, 16000) * 2**31).astype(np.int32) & ~0xFF
    write_samples(tmp_path / "in" / "pcm24.wav", pcm24, 16000, subtype="PCM_24")
    write_samples(tmp_path / "in" / "loud.ogg", tone(0.5, 16000) * 3.5, 16000)
    write_samples(tmp_path / "in" / "float.wav", tone(0.5, 16000), 16000, subtype="FLOAT")
    pack(tmp_path / "in", tmp_path / "flac", transcode="flac", progress=False)
    index = Index.load(tmp_path / "flac")
    assert index.formats == ["flac"]
    decoded = {
        key: sf.read(io.BytesIO(sample_members(index, i)[f"{key}.flac"]), dtype="int32")[0]
        for i, key in enumerate(index.keys)
    }
    assert np.array_equal(decoded["pcm16"] >> 16, pcm) and np.array_equal(decoded["pcm24"], pcm24[:, 0])
    assert (
        sf.info(io.BytesIO(sample_members(index, index.keys.index("loud"))["loud.flac"])).subtype == "PCM_16"
    )
    pack(tmp_path / "in", tmp_path / "wav", transcode="wav", progress=False)
    wav = Index.load(tmp_path / "wav")
    assert wav.keys == ["float", "loud", "pcm16", "pcm24"]
    assert sample_members(wav, 0)["float.wav"] == (tmp_path / "in" / "float.wav").read_bytes()  # already WAV
    loud = sf.read(io.BytesIO(sample_members(wav, 1)["loud.wav"]), dtype="float32")[0]
    assert loud.max() <= 1.0 and loud.min() >= -1.0
    assert (
        verify_dataset(tmp_path / "flac", decode=True) == []
        and verify_dataset(tmp_path / "wav", decode=True) == []
    )


def test_float_segment_as_wav_is_deterministic(tmp_path: Path) -> None:
    write_samples(tmp_path / "f.wav", tone(2.0, 8000), 8000, subtype="FLOAT")
    manifest = write_text(
        tmp_path / "m.jsonl", json.dumps({"audio_filepath": "f.wav", "offset": 0.5, "duration": 0.5})
    )
    pack(manifest, tmp_path / "a", transcode="wav", progress=False)
    time.sleep(1.1)  # libsndfile's own float WAV would carry a different PEAK timestamp now
    pack(manifest, tmp_path / "b", transcode="wav", progress=False)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")
    index = Index.load(tmp_path / "a")
    cut, _ = sf.read(io.BytesIO(sample_members(index, 0)["f.wav"]), dtype="float32")
    assert np.array_equal(cut, tone(2.0, 8000)[4000:8000, 0])


def test_shards_roll_by_samples_and_bytes(wav_corpus: Path, tmp_path: Path) -> None:
    summary = pack(wav_corpus, tmp_path / "n", samples_per_shard=20, progress=False)
    index = Index.load(tmp_path / "n")
    assert [s.samples for s in index.shards] == [20, 20, 8] and summary.shards == 3
    pack(wav_corpus, tmp_path / "b", shard_bytes=50_000, compression="zstd", progress=False)
    index = Index.load(tmp_path / "b")
    assert len(index.shards) > 2 and sum(s.samples for s in index.shards) == 48
    assert [s.name for s in index.shards][:2] == ["shard-000000.tar.zst", "shard-000001.tar.zst"]


def test_pack_refuses_a_finished_dataset_and_bad_options(wav_corpus: Path, tmp_path: Path) -> None:
    pack(wav_corpus, tmp_path / "out", progress=False)
    with pytest.raises(OptionError, match="already holds a dataset"):
        pack(wav_corpus, tmp_path / "out", progress=False)
    for bad in (
        dict(transcode="mp3"),
        dict(on_error="ignore"),
        dict(workers=0),
        dict(compression="gzip"),
        dict(samples_per_shard=0),
    ):
        with pytest.raises(OptionError):
            pack(wav_corpus, tmp_path / "other", progress=False, **bad)


def _start_pack(tmp_path: Path, *options: str, **popen: Any) -> tuple[subprocess.Popen[Any], Path, Path]:
    """``shardio pack`` of 600 short WAVs into FLAC/zstd shards of 25 samples, started in the background:
    the process, the corpus and the output directory.

    The command line starts with SIGINT at Python's default handler, as in a terminal's foreground: a child
    inherits an ignored SIGINT, and glibc's ``system()`` ignores SIGINT and SIGQUIT process-wide while it
    runs, so a library calling it in a thread of this process now and then (seen in full runs) made a child
    deaf to Ctrl-C."""
    corpus = tmp_path / "corpus"
    make_folder_corpus(corpus, 600, seconds=(0.4, 0.6), sample_rate=16000, texts=False)
    out = tmp_path / "out"
    shardio = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from shardio.cli import main; sys.exit(main())"
    )
    command = [
        sys.executable,
        "-c",
        shardio,
        "pack",
        str(corpus),
        str(out),
        "--samples-per-shard",
        "25",
        "--transcode",
        "flac",
        "--compression",
        "zstd",
        "--zstd-level",
        "12",
        "--no-progress",
        *options,
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    return process, corpus, out


def _wait_for(process: subprocess.Popen[Any], shard: Path) -> None:
    """Wait (at most 120 s) until the running pack has written ``shard``."""
    deadline = time.monotonic() + 120
    while not shard.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"pack never wrote {shard.name}"
        time.sleep(0.005)


@pytest.mark.slow
def test_killed_pack_leaves_no_partial_shard_and_reruns(tmp_path: Path) -> None:
    process, corpus, out = _start_pack(tmp_path)
    try:
        _wait_for(process, out / "shard-000002.tar.zst")
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert not (out / "index.json").exists(), "the pack finished before it was killed: use a bigger corpus"
    finals = sorted(out.glob("shard-*.tar.zst"))
    assert len(finals) >= 3
    for shard in finals:  # every shard under a final name is complete: it ends with the end-of-archive
        with zstandard.ZstdDecompressor().stream_reader(open(shard, "rb"), read_across_frames=True) as stream:
            assert sum(1 for _ in walk(stream, str(shard))) == 50
    # the journal, and the lock file (unlocked: the kernel dropped the dead process's lock)
    leftovers = (
        {p.name for p in out.iterdir()} - {s.name for s in finals} - {".shard.writing", ".shardio.lock"}
    )
    assert all(name.startswith(".") and name.endswith(".partial") for name in leftovers), leftovers
    assert (out / ".shard.writing").exists()  # the journal: these shards are a run's leftovers, to replace
    summary = pack(
        corpus,
        out,
        samples_per_shard=25,
        transcode="flac",
        compression="zstd",
        zstd_level=12,
        progress=False,
        workers=1,
    )
    assert (
        summary.samples == 600 and not list(out.glob(".*partial")) and not (out / ".shard.writing").exists()
    )
    assert verify_dataset(out) == []
    assert os.path.exists(out / "index.json")


def _tone_wav() -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, tone(0.1, 8000), 8000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _write(out: Path, keys: list[str], **options: object) -> Index:
    with ShardWriter(out, max_samples=1, **options) as writer:  # type: ignore[arg-type]
        for key in keys:
            writer.write(
                key, {"wav": _tone_wav()}, audio_ext="wav", num_frames=800, sample_rate=8000, channels=1
            )
    return Index.load(out)


def test_writer_replaces_an_interrupted_runs_shards_but_never_other_files(tmp_path: Path) -> None:
    import webdataset as wds

    out = tmp_path / "data[1]"  # glob metacharacters in the directory's name
    writer = ShardWriter(out, max_samples=1)
    for key in "abc":
        writer.write(key, {"wav": _tone_wav()}, audio_ext="wav", num_frames=800, sample_rate=8000, channels=1)
    writer.abort()  # as an interrupted run: finished shards under final names, no index
    assert len(list(out.glob("shard-*.tar"))) == 2
    assert [s.name for s in _write(out, ["d"]).shards] == ["shard-000000.tar"]
    assert sorted(p.name for p in out.iterdir()) == ["index.columns", "index.json", "shard-000000.tar"]

    other = tmp_path / "other"
    other.mkdir()
    with wds.TarWriter(str(other / "shard-000007.tar")) as sink:  # somebody else's shard, named like ours
        sink.write({"__key__": "x", "txt": "not shardio's"})
    foreign = (other / "shard-000007.tar").read_bytes()
    with pytest.raises(OptionError, match=r"holds shard files \(shard-000007.tar\) that no interrupted"):
        ShardWriter(other)
    assert (other / "shard-000007.tar").read_bytes() == foreign
    _write(other, ["e"], overwrite=True)  # asked for: replaced
    assert sorted(p.name for p in other.glob("shard-*")) == ["shard-000000.tar"]


@pytest.mark.slow
def test_ctrl_c_stops_a_parallel_pack_cleanly(tmp_path: Path) -> None:
    """SIGINT to the whole process group (what Ctrl-C in a terminal does), with a worker pool running: the
    pack exits with 130 and leaves neither an index nor any shard of its own; every process
    of the group is gone."""
    process, _, out = _start_pack(tmp_path, "-j", "2", start_new_session=True, text=True)
    try:
        _wait_for(process, out / "shard-000001.tar.zst")
        status = [
            line for line in open(f"/proc/{process.pid}/status").read().splitlines() if line.startswith("Sig")
        ]
        parent = [line for line in open("/proc/self/status").read().splitlines() if line.startswith("Sig")]
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        stderr += f"\nchild {status}\nparent {parent} {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, (stderr, sorted(p.name for p in out.iterdir()))
    assert "shardio pack: interrupted" in stderr
    assert not (out / "index.json").exists()
    assert not list(out.glob("shard-*")) and not list(out.glob(".*.partial")), sorted(out.iterdir())
    deadline = time.monotonic() + 30
    while True:  # the pool's processes exit too
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the interrupted pack are still running"
        time.sleep(0.1)
