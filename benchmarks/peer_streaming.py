"""MosaicML Streaming as a peer of ``benchmarks/peers.py``: ``MDSWriter`` with each file's bytes, then
``StreamingDataset`` read through ``StreamingDataLoader`` (its own resumable loader), as its docs write and
read a dataset. Streaming imports torchvision: it runs in an environment of its own (see
docs/benchmarks/peers.md)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile


def _decode(data: bytes) -> np.ndarray:
    audio, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return np.ascontiguousarray(audio[:, 0])


def streaming_pack(root: Path, out: Path, files: list[Path], text_of: Callable[[Path], str]) -> None:
    from streaming import MDSWriter

    columns = {"key": "str", "audio": "bytes", "text": "str"}
    with MDSWriter(out=str(out), columns=columns, size_limit="256mb") as writer:
        for path in files:
            key = path.relative_to(root).with_suffix("").as_posix()
            writer.write({"key": key, "audio": path.read_bytes(), "text": text_of(path)})


def streaming_collate(items: list[dict[str, Any]]) -> tuple[list[str], Any]:
    audios = [_decode(item["audio"]) for item in items]
    batch = np.zeros((len(audios), max(len(a) for a in audios)), np.float32)
    for row, audio in enumerate(audios):
        batch[row, : len(audio)] = audio
    return [item["key"] for item in items], batch


def streaming_loader(out: Path, size: int, workers: int) -> Any:
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    dataset = StreamingDataset(local=str(out), shuffle=False, batch_size=size)
    return StreamingDataLoader(dataset, batch_size=size, num_workers=workers, collate_fn=streaming_collate)


def streaming_batches(out: Path, size: int | None, workers: int) -> Iterator[list[str]] | None:
    if size is None:
        return None
    return (list(keys) for keys, _ in streaming_loader(out, size, workers))


def streaming_read(out: Path) -> int:
    return sum(len(keys) for keys in streaming_batches(out, 16, 0) or [])


def streaming_ranks(out: Path, size: int, world: int) -> list[int]:
    """Batches per rank (those holding a sample) by Streaming's own partition of the samples over ``world``
    nodes of one rank, with its default algorithm: given RANK and WORLD_SIZE, ``StreamingDataset`` would
    start a process group, which one process cannot."""
    from streaming import StreamingDataset
    from streaming.base.partition import get_partitions

    samples = StreamingDataset(local=str(out), shuffle=False, batch_size=size).num_samples
    partitions = get_partitions("relaxed", samples, world, world, 1, 1, size)
    return [int((partitions[node, 0, 0] >= 0).any(axis=1).sum()) for node in range(world)]
