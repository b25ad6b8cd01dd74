"""The measured cases of ``shardio bench``: loaders, resume, balance and a training-loop stall (the floors
they are compared with are in :mod:`shardio.bench.floors`).

Every throughput case is an :class:`Epoch`: a callable that reads its whole corpus once and returns what it
read (samples and audio seconds); :mod:`shardio.bench.run` times it. WebDataset is imported only here, lazily
(it is the ``bench`` extra), and uses the same decoder as users do today: soundfile on ``io.BytesIO``.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from unittest.mock import patch

import numpy as np
import soundfile
from torch.utils.data import DataLoader

from ..datasets.dataset import ShardDataset
from ..errors import FormatError
from ..loader.loader import ShardLoader
from ..packing.source import AUDIO_EXTENSIONS
from ..planning.plan import Batching, plan_epoch
from ..reading.collate import collate
from ..reading.options import Decoding, Reading

__all__ = [
    "Epoch",
    "balance",
    "count_batches",
    "resume_latency",
    "shardio_epoch",
    "stall",
    "webdataset_epoch",
    "webdataset_skip_latency",
]

Epoch = Callable[[], tuple[int, float]]
"""Reads the corpus once; returns ``(samples, audio seconds)``."""


_PAGE_FLOATS = 1024  # float32 values in a 4 KiB page


def count_batches(batches: Iterable[dict[str, Any]]) -> tuple[int, float]:
    """Consume batches as a trainer would: touch every page of the audio (as a copy to the GPU does; from
    workers the batch arrives as shared memory that faults in page by page), count samples and seconds."""
    samples, seconds = 0, 0.0
    for batch in batches:
        samples += len(batch["keys"])
        seconds += float((batch["lengths"].double() / batch["sample_rate"]).sum())
        float(batch["audio"].reshape(-1)[::_PAGE_FLOATS].sum())
    return samples, seconds


def shardio_loader(
    directory: str,
    *,
    workers: int,
    batch_size: int,
    shuffle: bool = True,
    persistent: bool = True,
    unbatched: bool = False,
    dtype: str = "float32",
    lean: bool = False,
    decoded_cache: str | None = None,
) -> Iterable[dict[str, Any]]:
    """A plain DataLoader over a ShardDataset (``batch_size=None``: the dataset batches); ``unbatched``: the
    dataset yields samples and the DataLoader batches them with :func:`shardio.reading.collate.collate`;
    ``lean``: a :class:`~shardio.ShardLoader` instead of the DataLoader; ``decoded_cache``: read through the
    decoded cache in that directory (see :class:`~shardio.reading.options.Reading`)."""
    persistent = persistent and workers > 0
    decoding = Decoding(dtype=dtype)
    if decoded_cache is not None:
        dataset = ShardDataset(
            directory, batch_size=batch_size, shuffle=shuffle, reading=Reading(decoded_cache=decoded_cache)
        )
        return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=persistent)
    if lean:
        return ShardLoader(
            ShardDataset(directory, batch_size=batch_size, shuffle=shuffle, decoding=decoding),
            num_workers=workers,
            persistent_workers=persistent,
        )
    if unbatched:
        return DataLoader(
            ShardDataset(directory, shuffle=shuffle, decoding=decoding),
            batch_size=batch_size,
            collate_fn=collate,
            num_workers=workers,
            persistent_workers=persistent,
        )
    dataset = ShardDataset(directory, batch_size=batch_size, shuffle=shuffle, decoding=decoding)
    return DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=persistent)


def shardio_epoch(
    directory: str,
    *,
    workers: int,
    batch_size: int,
    shuffle: bool = True,
    fresh: bool = False,
    unbatched: bool = False,
    dtype: str = "float32",
    lean: bool = False,
    decoded_cache: str | None = None,
) -> Epoch:
    """shardio end to end: plan, read by offset, decompress, decode, collate, through a DataLoader.

    ``fresh`` builds a new dataset (so a cold reader) for every epoch: the reader keeps decompressed stream
    shards (gzip, bz2) in memory, which on a bench-sized dataset would hide their decompression after the
    first round, while a real epoch over a large dataset decompresses every shard. ``unbatched`` and ``lean``:
    see :func:`shardio_loader`; ``dtype``: the dataset's audio dtype; ``decoded_cache``: read through the
    decoded cache in that directory (its first epoch fills it).
    """

    def make() -> Iterable[dict[str, Any]]:
        return shardio_loader(
            directory,
            workers=workers,
            batch_size=batch_size,
            shuffle=shuffle,
            unbatched=unbatched,
            dtype=dtype,
            lean=lean,
            decoded_cache=decoded_cache,
        )

    if fresh:
        return lambda: count_batches(make())
    loader = make()
    return lambda: count_batches(loader)


def _soundfile_sample(ext: str, dtype: str = "float32") -> Callable[[dict[str, Any]], dict[str, Any]]:
    def decode(sample: dict[str, Any]) -> dict[str, Any]:
        data = sample.get(ext)
        if data is None:  # a dataset of several audio formats: this sample's own audio member
            data = next((sample[name] for name in AUDIO_EXTENSIONS if name in sample), None)
        if data is None:
            raise FormatError(
                f"{sample.get('__url__')}: sample {sample.get('__key__')!r} has no audio "
                f"member (expected one of {', '.join('.' + e for e in AUDIO_EXTENSIONS)})"
            )
        audio, rate = soundfile.read(io.BytesIO(data), dtype=dtype, always_2d=True)
        return {"key": sample["__key__"], "audio": audio.T, "sample_rate": rate}

    return decode


def webdataset_pipeline(
    shards: Sequence[str], *, ext: str, batch_size: int, decode: bool = True, dtype: str = "float32"
) -> Any:
    """WebDataset over ``shards`` in order, decoding ``ext`` with soundfile (to ``dtype``) and batching with
    shardio's collate."""
    import webdataset as wds

    pipeline = wds.WebDataset(list(shards), shardshuffle=False, empty_check=False)
    if decode:
        pipeline = pipeline.map(_soundfile_sample(ext, dtype)).batched(
            batch_size, collation_fn=collate, partial=True
        )
    return pipeline


def webdataset_epoch(
    shards: Sequence[str], *, ext: str, workers: int, batch_size: int, dtype: str = "float32"
) -> Epoch:
    """What users have today: WebDataset + soundfile from ``io.BytesIO``, same batching and collate (audio as
    ``dtype``: soundfile reads 16-bit PCM as int16 as stored, as shardio's ``dtype="int16"`` does)."""
    pipeline = webdataset_pipeline(shards, ext=ext, batch_size=batch_size, dtype=dtype)
    loader = DataLoader(pipeline, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    return lambda: count_batches(loader)


def resume_latency(directory: str, *, fraction: float, batch_size: int, workers: int) -> float:
    """Seconds from a fresh dataset to its first batch after ``load_state_dict`` at
    ``fraction`` of epoch 0."""
    started = time.perf_counter()
    dataset = ShardDataset(directory, batch_size=batch_size)
    position = int(fraction * len(dataset))
    if position:
        dataset.load_state_dict(dataset.state_after({"epoch": 0, "batch_index": position - 1}))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    iterator = iter(loader)
    next(iterator)
    seconds = time.perf_counter() - started
    del iterator
    return seconds


def webdataset_skip_latency(
    shards: Sequence[str], *, ext: str, fraction: float, samples: int, batch_size: int
) -> float:
    """WebDataset has no resume: seconds to skip ``fraction`` of the samples (read, not
    decoded), then batch."""
    started = time.perf_counter()
    raw = iter(webdataset_pipeline(shards, ext=ext, batch_size=batch_size, decode=False))
    for _ in itertools.islice(raw, int(fraction * samples)):
        pass
    decode = _soundfile_sample(ext)
    collate([decode(sample) for sample in itertools.islice(raw, batch_size)])
    return time.perf_counter() - started


def uneven_shards(seed: int = 0, shards: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Metadata of an uneven dataset: ``shards`` shards of 10-400 samples, 1-15 s each
    (shard ids, durations)."""
    rng = np.random.default_rng([seed, 7])
    counts = rng.integers(10, 400, shards)
    shard_ids = np.repeat(np.arange(shards, dtype=np.uint32), counts)
    durations = rng.uniform(1.0, 15.0, shard_ids.shape[0]) * rng.uniform(0.5, 1.5, shards)[shard_ids]
    return shard_ids, durations


def balance(
    shard_ids: np.ndarray, durations: np.ndarray, *, world_sizes: Sequence[int], batch_size: int
) -> list[dict[str, Any]]:
    """Per-rank batch counts and audio seconds: shardio's plan vs WebDataset's
    ``split_by_node`` (metadata only)."""
    from webdataset import split_by_node

    num_shards = int(shard_ids.max()) + 1
    per_shard_samples = np.bincount(shard_ids, minlength=num_shards)
    per_shard_seconds = np.bincount(shard_ids, weights=durations, minlength=num_shards)
    rows = []
    for world in world_sizes:
        plan = plan_epoch(
            shard_ids,
            durations,
            num_shards,
            seed=0,
            epoch=0,
            world_size=world,
            batching=Batching(batch_size=batch_size),
        )
        seconds = [
            float(sum(durations[plan.batch(r, j)].sum() for j in range(plan.num_batches)))
            for r in range(world)
        ]
        rows.append(_balance_row("shardio", world, [plan.num_batches] * world, seconds))
        batches, seconds = [], []
        for rank in range(world):
            with patch.dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world)):
                mine = list(split_by_node(range(num_shards)))
            batches.append(math.ceil(int(per_shard_samples[mine].sum()) / batch_size))
            seconds.append(float(per_shard_seconds[mine].sum()))
        rows.append(_balance_row("webdataset split_by_node", world, batches, seconds))
    return rows


def _balance_row(loader: str, world: int, batches: list[int], seconds: list[float]) -> dict[str, Any]:
    return {
        "loader": loader,
        "world_size": world,
        "batches_per_rank": batches,
        "audio_seconds_per_rank": [round(s, 1) for s in seconds],
        "batch_spread": max(batches) - min(batches),
        "audio_max_over_min": round(max(seconds) / max(min(seconds), 1e-9), 3),
        "synchronised_steps": min(batches),
        "idle_rank_batches": sum(max(batches) - b for b in batches),
    }


def stall(loader: Iterable[dict[str, Any]], *, step_seconds: float, batches: int) -> dict[str, float]:
    """A training loop that spends ``step_seconds`` per batch (sleeping, as while a GPU computes): the share
    of its time spent waiting for data, from the second batch on (the first includes worker start-up)."""
    iterator = iter(loader)
    next(iterator)
    waited, taken = 0.0, 0
    started = time.perf_counter()
    for _ in range(batches):
        asked = time.perf_counter()
        try:
            next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - asked
        taken += 1
        time.sleep(step_seconds)
    total = time.perf_counter() - started
    del iterator
    return {
        "batches": taken,
        "wait_share": waited / max(total, 1e-9),
        "seconds": total,
        "wait_ms_per_batch": 1000 * waited / max(taken, 1),
    }
