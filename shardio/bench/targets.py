"""The targets of ``shardio bench``: the ratios shardio's loader must reach against WebDataset and the floors,
and each one checked against a run's results."""

from __future__ import annotations

from typing import Any

__all__ = ["TARGETS", "evaluate_targets"]


TARGETS: list[tuple[str, str, str, float]] = [
    # (ratio name, audio format it applies to ("*": any), description, threshold: the ratio must be >= it)
    (
        "shard_loader_vs_webdataset_2w",
        "wav",
        (
            "headline: shardio's ShardLoader with 2 workers (the set-up the README "
            "recommends) >= 5x WebDataset + soundfile through DataLoader with 2 workers, per core (PCM WAV)"
        ),
        5.0,
    ),
    (
        "shardio_vs_webdataset_2w",
        "wav",
        (
            "through DataLoader with 2 workers, shardio >= 5x WebDataset + soundfile with "
            "2 workers, per core (PCM WAV)"
        ),
        5.0,
    ),
    (
        "shardio_vs_webdataset",
        "wav",
        "shardio >= 5x WebDataset + soundfile, 0 workers, per core (PCM WAV)",
        5.0,
    ),
    ("two_workers_vs_zero", "*", "2 workers >= 1.8x 0 workers (wall samples/s; needs 2 free cores)", 1.8),
    (
        "two_workers_vs_zero_per_cpu_s",
        "*",
        ("loader CPU per sample with 2 workers at most 1.15x 0 workers (per CPU-s ratio >= 1/1.15)"),
        1 / 1.15,
    ),
    (
        "shard_loader_vs_zero",
        "*",
        "ShardLoader, 2 workers >= 1.8x 0 workers (wall samples/s; needs 2 free cores)",
        1.8,
    ),
    (
        "shard_loader_vs_zero_per_cpu_s",
        "*",
        (
            "loader CPU per sample with ShardLoader's 2 workers at most 1.15x 0 "
            "workers (per CPU-s ratio >= 1/1.15)"
        ),
        1 / 1.15,
    ),
    (
        "shard_loader_vs_dataloader_2w",
        "*",
        "(context) ShardLoader vs DataLoader, 2 workers each, per CPU-s",
        1.0,
    ),
    (
        "parallel_floor_vs_zero",
        "*",
        (
            "(context) the machine: 2 reader processes at once, 0 workers each, vs one "
            "(wall samples/s): the most 2 workers can reach here"
        ),
        1.8,
    ),
    (
        "parallel_floor_vs_zero_per_cpu_s",
        "*",
        (
            "(context) the machine: 2 reader processes at once vs one, per "
            "CPU-s (shared caches, memory bandwidth, neighbours)"
        ),
        1 / 1.15,
    ),
    (
        "two_workers_vs_parallel_floor_per_cpu_s",
        "*",
        (
            "(context) the transport: 2 workers vs 2 reader processes "
            "at once, per CPU-s (the DataLoader's hand-off alone)"
        ),
        1 / 1.15,
    ),
    (
        "shard_loader_vs_parallel_floor_per_cpu_s",
        "*",
        ("(context) ShardLoader's transport: 2 workers vs 2 reader processes at once, per CPU-s"),
        1 / 1.15,
    ),
    ("shardio_vs_numpy_floor", "wav", "shardio >= 50% of the numpy raw floor, per core (PCM WAV)", 0.5),
    (
        "shardio_vs_numpy_batch_floor",
        "wav",
        "(context) shardio vs the numpy floor writing padded batches, per core",
        0.5,
    ),
    (
        "shardio_vs_python_floor",
        "wav",
        "(context) shardio vs the pure-Python floor, 0 workers, per core",
        0.8,
    ),
    (
        "python_floor_vs_webdataset",
        "wav",
        (
            "(context) the pure-Python floor vs WebDataset + soundfile, 0 workers, "
            "per core: the most a loader in Python reaches"
        ),
        5.0,
    ),
    (
        "shardio_vs_soundfile_floor",
        "flac",
        "shardio >= 90% of the soundfile decode floor, per core (FLAC)",
        0.9,
    ),
    (
        "shard_loader_vs_soundfile_floor",
        "flac",
        ("shardio's ShardLoader with 2 workers >= 90% of the soundfile decode floor, per core (FLAC)"),
        0.9,
    ),
    (
        "shardio_2w_vs_soundfile_floor",
        "flac",
        ("through DataLoader with 2 workers, shardio >= 90% of the soundfile decode floor, per core (FLAC)"),
        0.9,
    ),
    (
        "shardio_vs_memory_file_floor",
        "flac",
        (
            "(context) shardio vs the soundfile floor reading a memory file, as "
            "shardio does, 0 workers, per core (FLAC)"
        ),
        0.9,
    ),
    (
        "shard_loader_vs_memory_file_floor",
        "flac",
        (
            "(context) ShardLoader with 2 workers vs the soundfile floor "
            "reading a memory file, per core (FLAC)"
        ),
        0.9,
    ),
    (
        "zstd_vs_floor",
        "wav",
        ("zstd-3 >= 90% of its floor (decompressing the same frames + the .tar path), per core"),
        0.9,
    ),
    ("zstd_vs_tar", "*", "(context) zstd-3 vs .tar, per core", 1 / 1.1),
    ("int16_vs_float32_2w", "*", "(context) dtype='int16' vs float32 with 2 workers, per core", 1.0),
    ("int16_vs_float32_0w", "*", "(context) dtype='int16' vs float32, 0 workers, per core", 1.0),
    (
        "int16_shard_loader_vs_webdataset_2w",
        "wav",
        (
            "(context) int16 on both sides: ShardLoader with 2 workers vs "
            "WebDataset + soundfile reading int16 with 2 workers, per core (PCM WAV)"
        ),
        5.0,
    ),
    (
        "webdataset_int16_vs_float32_2w",
        "*",
        (
            "(context) WebDataset + soundfile, int16 vs float32 with 2 workers, "
            "per core (libsndfile's own float conversion)"
        ),
        1.0,
    ),
    (
        "int16_shard_loader_vs_zero_per_cpu_s",
        "*",
        (
            "(context) int16: loader CPU per sample with ShardLoader's 2 "
            "workers vs 0 workers (per CPU-s ratio)"
        ),
        1 / 1.15,
    ),
    (
        "unbatched_vs_batched",
        "*",
        "(context) unbatched mode (the DataLoader collates) vs batched, 0 workers",
        0.9,
    ),
]


def evaluate_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target that applies to a bench corpus, with its measured ratio and whether it is met."""
    rows = []
    for corpus in result["corpora"]:
        ratios = result["ratios"].get(corpus["name"], {})
        for name, audio_format, description, threshold in TARGETS:
            if audio_format not in ("*", corpus["audio_format"]) or name not in ratios:
                continue
            measured = ratios[name]
            rows.append(
                {
                    "corpus": corpus["name"],
                    "target": description,
                    "ratio": name,
                    "threshold": round(threshold, 3),
                    "median": round(measured["median"], 3),
                    "min": round(measured["min"], 3),
                    "max": round(measured["max"], 3),
                    "met": measured["median"] >= threshold,
                }
            )
    return rows
