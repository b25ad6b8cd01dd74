"""``shardio bench``: a quick run on tiny generated corpora holds every comparison and renders its report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("webdataset")

from shardio.bench import run_bench
from shardio.bench.floors import numpy_floor, pcm_layout


@pytest.mark.slow  # a whole (tiny) benchmark run: ~25 s alone, minutes on a loaded machine
def test_quick_bench_holds_every_comparison(tmp_path: Path) -> None:
    result = run_bench(None, out_dir=tmp_path, quick=True, progress=False)
    corpora = {c["name"]: c for c in result["corpora"]}
    assert set(corpora) == {"wav16k", "flac"} and corpora["wav16k"]["audio_format"] == "wav"
    cases = {(r["corpus"], r["case"]) for r in result["throughput"]}
    for corpus in ("wav16k", "flac"):
        for workers in (0, 1, 2):  # both loaders through DataLoader with the same workers
            assert (corpus, f"shardio .tar, {workers}w") in cases
            assert (corpus, f"webdataset + soundfile .tar, {workers}w") in cases
        for workers in (0, 2):
            assert (corpus, f"shardio .tar unbatched (DataLoader batches), {workers}w") in cases
        assert (corpus, "shardio .tar int16, 2w") in cases
        assert (corpus, "shardio .tar ShardLoader, 2w") in cases
        assert (corpus, "shardio .tar int16, 0w") in cases
        assert (corpus, "shardio .tar ShardLoader int16, 2w") in cases
        assert (corpus, "webdataset + soundfile .tar int16, 2w") in cases  # int16 compared with int16
        assert (corpus, "shardio .tar, 2 processes x 0w (parallel floor)") in cases
        assert (corpus, "shardio .tar.zst (zstd-3), 0w") in cases
        assert (corpus, "shardio .tar through the decoded cache (warm), 0w") in cases
        assert (corpus, "zstd-3 decompression floor (frames in memory)") in cases
        assert (corpus, "soundfile floor (bytes in memory)") in cases
    assert ("wav16k", "numpy raw floor (bytes in memory)") in cases
    assert ("flac", "numpy raw floor (bytes in memory)") not in cases  # no raw floor for FLAC
    python_floor = "pure-Python floor (mapped .tar: members, key, JSON, WAV header, cast into reused rows)"
    assert ("wav16k", python_floor) in cases and ("flac", python_floor) not in cases
    for row in result["throughput"]:
        assert row["samples"] == corpora[row["corpus"]]["samples"]  # every case read the whole corpus
        assert row["samples_per_s"]["min"] <= row["samples_per_s"]["median"] <= row["samples_per_s"]["max"]
        assert len(row["samples_per_s"]["runs"]) == 2 and row["peak_rss_mb"] > 0
        assert 0 <= row["trainer_cpu_share"]["median"] <= 1
    codecs = {r["codec"] for r in result["compression"]}
    assert {"none", "zstd-1", "zstd-3", "zstd-19", "gzip", "bz2"} <= codecs
    assert {(r["position"], r["loader"]) for r in result["resume"]} >= {
        (0.9, "shardio, 0w"),
        (0.5, "shardio, 2w"),
    }
    shardio_balance = [r for r in result["balance"] if r["loader"] == "shardio"]
    assert [r["world_size"] for r in shardio_balance] == [2, 4, 8]
    assert all(r["batch_spread"] == 0 for r in shardio_balance)  # every rank the same number of batches
    assert {(r["loader"], r["workers"]) for r in result["stall"]} == {
        (loader, w) for loader in ("shardio", "shardio ShardLoader", "webdataset + soundfile") for w in (1, 2)
    }
    assert {t["ratio"] for t in result["targets"]} >= {
        "shardio_vs_webdataset",
        "shardio_vs_webdataset_2w",
        "shardio_vs_numpy_floor",
        "shardio_vs_soundfile_floor",
        "shardio_2w_vs_soundfile_floor",
        "zstd_vs_floor",
        "two_workers_vs_zero",
        "two_workers_vs_zero_per_cpu_s",
        "parallel_floor_vs_zero",
        "parallel_floor_vs_zero_per_cpu_s",
        "two_workers_vs_parallel_floor_per_cpu_s",
        "shard_loader_vs_webdataset_2w",
        "shard_loader_vs_zero",
        "shard_loader_vs_zero_per_cpu_s",
        "shard_loader_vs_soundfile_floor",
        "shardio_vs_python_floor",
        "python_floor_vs_webdataset",
        "int16_vs_float32_0w",
        "int16_shard_loader_vs_webdataset_2w",
        "int16_shard_loader_vs_zero_per_cpu_s",
    }
    assert (
        result["targets"][0]["ratio"] == "shard_loader_vs_webdataset_2w"
    )  # the headline: the recommended set-up
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["targets"] == result["targets"]
    markdown = (tmp_path / "bench.md").read_text()
    assert "## Targets" in markdown and "webdataset + soundfile" in markdown
    if importlib.util.find_spec("matplotlib") is not None:  # the chart needs the bench extra
        assert "bench.png" in saved["files"].values() and (tmp_path / "bench.png").stat().st_size > 1000
    else:
        assert not (tmp_path / "bench.png").exists()
    assert str(tmp_path) not in (tmp_path / "bench.json").read_text()  # no machine paths in the results


def test_numpy_floor_reads_pcm_and_refuses_other_formats() -> None:
    import io

    import numpy as np
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((800, 2), np.float32), 8000, subtype="PCM_16", format="WAV")
    wav = buffer.getvalue()
    assert pcm_layout(wav)[1:] == (800, 2, 8000, 16)  # type: ignore[index]
    floor = numpy_floor([("wav", wav)])
    assert floor is not None and floor() == (1, 0.1)
    assert numpy_floor([("flac", b"fLaC....")]) is None


def test_python_floor_reads_every_sample_of_a_wav_dataset_and_refuses_others(tmp_path: Path) -> None:
    from shardio.bench.floors import python_floor
    from tests.sample_shards import make_uneven_dataset

    index = make_uneven_dataset(tmp_path / "tar", [5, 3, 4], duration_range=(0.05, 0.2))
    floor = python_floor(index.root, 4)
    assert floor is not None
    samples, seconds = floor()
    assert samples == 12 and seconds == pytest.approx(float(index.durations.sum()), rel=1e-6)
    assert floor() == pytest.approx((samples, seconds))  # another shuffle, the same samples
    zstd = make_uneven_dataset(tmp_path / "zstd", [3], duration_range=(0.05, 0.2), compression="zstd")
    assert python_floor(zstd.root, 4) is None  # plain .tar shards only


# -- the in-place batch path (decode_audio(out=...) into collate's audio_block) ---------------------


def test_decoding_into_an_audio_block_gives_the_same_batch() -> None:
    import io

    import numpy as np
    import soundfile
    import torch

    from shardio.reading.collate import audio_block, collate, collate_into
    from shardio.reading.decode import decode_audio

    rng = np.random.default_rng(3)
    encoded = []
    for frames, (container, subtype) in zip(
        (900, 400, 1200), (("WAV", "PCM_16"), ("FLAC", "PCM_24"), ("WAV", "FLOAT"))
    ):
        buffer = io.BytesIO()
        soundfile.write(buffer, rng.uniform(-1, 1, (frames, 1)), 16000, format=container, subtype=subtype)
        encoded.append((container.lower(), buffer.getvalue()))
    plain = collate(
        [
            {"key": str(i), "audio": decode_audio(data, ext)[0], "sample_rate": 16000}
            for i, (ext, data) in enumerate(encoded)
        ]
    )
    block = audio_block([900, 400, 1200], 1)
    rows = block.numpy()
    samples = []
    for i, (ext, data) in enumerate(encoded):
        audio, rate = decode_audio(data, ext, out=rows[i])
        assert np.shares_memory(audio, rows[i])  # decoded in place
        samples.append({"key": str(i), "audio": audio, "sample_rate": rate})
    batch = collate_into(samples, audio=block)
    assert batch["audio"] is block
    for name in ("audio", "lengths", "sample_rate"):
        assert torch.equal(batch[name], plain[name]), name
    too_small = audio_block([10, 10, 10], 1)  # a sample that does not fit: a new batch, same content
    assert torch.equal(collate_into(samples, audio=too_small)["audio"], plain["audio"])


def test_ab_script_compares_a_commit_with_this_checkout_in_one_process(tmp_path: Path) -> None:
    """``benchmarks/ab.py`` exports a commit's package beside this one and times both, round by round."""
    import importlib.util
    import subprocess

    from sample_shards import make_uneven_dataset

    repo = Path(__file__).resolve().parents[2]
    inside = subprocess.run(["git", "rev-parse", "--verify", "HEAD:shardio"], cwd=repo, capture_output=True)
    if inside.returncode != 0:
        pytest.skip("not a git checkout with a committed shardio package")
    index = make_uneven_dataset(tmp_path / "ds", [3, 4], seed=1)
    spec = importlib.util.spec_from_file_location("ab_script", repo / "benchmarks" / "ab.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (
        script.main(
            [
                index.root,
                "--base",
                "HEAD",
                "--rounds",
                "2",
                "--seconds",
                "0",
                "--results",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "out" / "ab.json").read_text())
    assert len(report["us_per_sample"]["base"]["runs"]) == len(report["speedup"]["runs"]) == 2
    assert report["speedup"]["median"] > 0 and (tmp_path / "out" / "ab.md").read_text().startswith("# A/B")


def test_parallel_floor_reads_the_corpus_once_across_its_processes_and_reports_a_failing_reader(
    tmp_path: Path,
) -> None:
    from sample_shards import make_uneven_dataset

    from shardio.bench.parallel import parallel_floor
    from shardio.errors import ReadError

    data = tmp_path / "data"
    make_uneven_dataset(data, [7, 4, 9])  # 20 samples: ranks of 2 with batches of 3 repeat some to even out
    epoch = parallel_floor(str(data), processes=2, batch_size=3)
    samples, seconds = epoch()
    assert samples == 20 and seconds > 0
    assert epoch() == (samples, seconds)  # the readers stay and read again
    for shard in data.glob("*.tar"):
        shard.write_bytes(b"")  # the readers' next epoch fails: the bench says which, instead of hanging
    with pytest.raises(ReadError, match="reader process 0 of 2 failed"):
        epoch()


def test_workers_script_splits_the_cpu_of_a_batch_by_thread(tmp_path: Path) -> None:
    """``benchmarks/workers.py``: CPU per batch by thread role, for 0 and 2 workers and the parallel floor."""
    import importlib.util

    from sample_shards import make_uneven_dataset

    from shardio.reading import blocks

    make_uneven_dataset(tmp_path / "ds", [20, 20], duration_range=(1.0, 2.0))
    spec = importlib.util.spec_from_file_location(
        "workers_script", Path(__file__).resolve().parents[2] / "benchmarks" / "workers.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    figures = script.measure(str(tmp_path / "ds"), rounds=1, epochs=20)
    assert set(figures) >= {"0 workers", "2 workers", "2 reader processes, 0 workers each (parallel floor)"}
    for row in figures.values():
        assert row["samples_per_s"] > 0
        assert row["total"] == pytest.approx(sum(row[role] for role in script.ROLES))
    assert (
        figures["0 workers"]["worker main threads"] == 0
    )  # (CPU counts in 10 ms ticks: no lower bounds here)
    assert blocks.LIMIT == 8  # the bundles' extra blocks were the workers' own
