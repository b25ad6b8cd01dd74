"""Test datasets: real WAV samples written by :class:`shardio.ShardWriter` into shards of chosen sizes."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from shardio import Index, ShardDataset, ShardWriter, World
from shardio.shards.index import COLUMNS, ShardInfo

__all__ = ["dataset_fixture", "make_uneven_dataset", "wav_bytes"]


def wav_bytes(samples: np.ndarray, sample_rate: int, subtype: str = "PCM_16") -> bytes:
    """``samples`` (frames, or ``(frames, channels)``) encoded as a WAV file by soundfile."""
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sample_rate, subtype=subtype, format="WAV")
    return buffer.getvalue()


def make_uneven_dataset(
    directory: str | os.PathLike[str],
    shard_sizes: Sequence[int],
    *,
    seed: int = 0,
    sample_rate: int = 8000,
    compression: str = "none",
    duration_range: tuple[float, float] = (0.1, 0.5),
) -> Index:
    """Write a dataset whose shard ``s`` holds exactly ``shard_sizes[s]`` samples; return its index.

    Each sample is a mono 16-bit WAV of uniform noise with a duration drawn uniformly from
    ``duration_range`` seconds (whole frames), keyed ``s{shard:03d}_{i:05d}`` (``i`` counts within the
    shard), with a ``json`` member ``{"text": key, "shard": s, "index": i}``. The same arguments write
    byte-identical shards. ``compression`` is ``"none"`` (``.tar``) or ``"zstd"`` (``.tar.zst``).
    """
    if not shard_sizes or min(shard_sizes) < 1:
        raise ValueError(f"every shard needs at least one sample, got sizes {list(shard_sizes)}")
    low, high = duration_range
    if not 0 < low <= high:
        raise ValueError(f"duration_range must satisfy 0 < low <= high, got {duration_range}")
    rng = np.random.default_rng(seed)
    writer = ShardWriter(directory, compression=compression)
    try:
        for shard, size in enumerate(shard_sizes):
            if shard:
                writer.end_shard()
            for i in range(size):
                key = f"s{shard:03d}_{i:05d}"
                frames = max(1, round(rng.uniform(low, high) * sample_rate))
                audio = rng.uniform(-0.5, 0.5, frames).astype(np.float32)
                meta = json.dumps({"text": key, "shard": shard, "index": i}).encode()
                writer.write(
                    key,
                    {"wav": wav_bytes(audio, sample_rate), "json": meta},
                    audio_ext="wav",
                    num_frames=frames,
                    sample_rate=sample_rate,
                    channels=1,
                )
    except BaseException:
        writer.abort()
        raise
    index = writer.close()
    counts = [shard.samples for shard in index.shards]
    if counts != list(shard_sizes):  # the writer would have had to change for this to happen
        raise RuntimeError(f"ShardWriter wrote shards of {counts} samples, asked for {list(shard_sizes)}")
    return index


def tar_members(out: Path) -> dict[str, bytes]:
    """Every tar member of every shard of the dataset at ``out``, by member name (read with ``tarfile``)."""
    found = {}
    for shard in Index.load(out).shards:
        with tarfile.open(out / shard.name) as archive:
            for info in archive:
                handle = archive.extractfile(info)
                assert handle is not None
                found[info.name] = handle.read()
    return found


def planned_keys(data: Path, world_size: int, epochs: int, **options: Any) -> list[list[list[str]]]:
    """Per rank, the keys of every batch an uninterrupted run yields over ``epochs`` epochs (in step order),
    each rank a ``ShardDataset(data, world=World(rank, world_size), **options)``."""
    ranks = []
    for rank in range(world_size):
        dataset = ShardDataset(data, world=World(rank, world_size), **options)
        batches = []
        for epoch in range(epochs):
            dataset.set_epoch(epoch)
            batches += [list(batch["keys"]) for batch in dataset]
        ranks.append(batches)
    return ranks


def dataset_fixture(name: str, shard_sizes: Sequence[int], **options: Any) -> Any:
    """A module-scoped pytest fixture: the directory of ``make_uneven_dataset(dir, shard_sizes, **options)``,
    made once in a temporary directory named after ``name``."""

    @pytest.fixture(scope="module")
    def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
        directory = tmp_path_factory.mktemp(name)
        make_uneven_dataset(directory, shard_sizes, **options)
        return directory

    return dataset


def memory_index(shard_sizes: list[int], seed: int, prefix: str = "k") -> Index:
    """An index of ``shard_sizes`` samples per shard, in memory (durations 0.1-3 s at 1 kHz), keys
    ``{prefix}{i}``: no audio, no files, for properties of the planner."""
    rng = np.random.default_rng(seed)
    n = sum(shard_sizes)
    columns = {name: np.zeros(n, kind) for name, kind in COLUMNS.items()}
    columns.update(
        shard=np.repeat(np.arange(len(shard_sizes), dtype=np.uint32), shard_sizes),
        num_frames=rng.integers(100, 3000, n).astype(np.uint32),
        sample_rate=np.full(n, 1000, np.uint32),
    )
    shards = [ShardInfo(f"m{s}.tar", 0, "", size, 0.0) for s, size in enumerate(shard_sizes)]
    return Index(
        root="",
        shards=shards,
        formats=["wav"],
        columns=columns,
        fingerprint=f"mem{prefix}{seed}",
        _keys=[f"{prefix}{i}" for i in range(n)],
    )
