"""How each peer of ``benchmarks/peers.py`` reads a packed corpus: batches of 16 or by duration, with 0 or 2
DataLoader workers, each as its docs recommend (time to the first batch and throughput); where it resumes
mid-epoch, and how exactly (read N batches, save its state as a checkpoint would, read on from that state in
new objects, compare keys with an unbroken epoch; 0 and 2 workers); and how many batches each rank gets at
world 2 and 8 (its own sharding).

A peer without a way (duration batches in LitData, any resume in WebDataset) gets ``None``: not offered.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from peer_streaming import streaming_batches, streaming_loader, streaming_ranks

MAX_SECONDS = 60.0  # a duration batch: at most this many seconds of audio
Batches = Iterator[list[str]]  # each batch: its samples' keys (the audio decoded and padded, then dropped)
Resumed = (
    tuple[list[str], list[str], list[str]] | None
)  # keys unbroken, before a resume, after it; None: no way


def decode(data: bytes) -> np.ndarray:
    audio, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return np.ascontiguousarray(audio[:, 0])


def padded(audios: list[np.ndarray]) -> np.ndarray:
    batch = np.zeros((len(audios), max(len(a) for a in audios)), np.float32)
    for row, audio in enumerate(audios):
        batch[row, : len(audio)] = audio
    return batch


def grouped(
    samples: Iterable[tuple[str, np.ndarray, float]], size: int | None
) -> Iterator[tuple[list[str], Any]]:
    """Batches of ``size`` samples, or (``size`` None) of at most :data:`MAX_SECONDS`, in stream order."""
    keys: list[str] = []
    audios: list[np.ndarray] = []
    seconds = 0.0
    for key, audio, duration in samples:
        if keys and (len(keys) == size or (size is None and seconds + duration > MAX_SECONDS)):
            yield keys, padded(audios)
            keys, audios, seconds = [], [], 0.0
        keys.append(key)
        audios.append(audio)
        seconds += duration
    if keys:
        yield keys, padded(audios)


def _keys(loader: Iterable[Any]) -> Batches:
    for keys, _ in loader:
        yield list(keys)


# -- shardio -----------------------------------------------------------------------------------------


def shardio_dataset(out: Path, size: int | None, rank: int = 0, world: int = 1) -> Any:
    from shardio import ShardDataset, World

    if size is None:
        return ShardDataset(out, max_duration=MAX_SECONDS, shuffle=False, world=World(rank, world))
    return ShardDataset(out, batch_size=size, shuffle=False, world=World(rank, world))


def shardio_loader(out: Path, size: int | None, workers: int) -> Any:
    from shardio import ShardLoader

    dataset = shardio_dataset(out, size)
    return ShardLoader(dataset, num_workers=workers, persistent_workers=False) if workers else dataset


def shardio_batches(out: Path, size: int | None, workers: int) -> Batches:
    for batch in shardio_loader(out, size, workers):
        yield list(batch["keys"])


def saved(state: Any) -> Any:
    """``state`` as a checkpoint gives it back to a new process: through JSON where JSON keeps it as it is,
    else pickle (as ``torch.save`` would keep it)."""
    try:
        if json.loads(json.dumps(state)) == state:
            return json.loads(json.dumps(state))
    except TypeError:
        pass
    return pickle.loads(pickle.dumps(state))


def resumed(make: Callable[[], Any], batches: Callable[[Any], Iterator[list[str]]], after: int) -> Resumed:
    """The keys of an unbroken epoch of a new loader, then of ``after`` batches of another, then of a third
    given the second's state (saved as a checkpoint would be), to the end of the epoch."""
    unbroken = [key for keys in batches(make()) for key in keys]
    first = make()
    iterator = batches(first)
    seen = [key for _ in range(after) for key in next(iterator)]
    state = saved(first.state_dict())
    del iterator
    second = make()
    second.load_state_dict(state)
    return unbroken, seen, [key for keys in batches(second) for key in keys]


def shardio_ranks(out: Path, size: int, world: int) -> list[int]:
    return [sum(1 for _ in shardio_dataset(out, size, rank, world)) for rank in range(world)]


# -- WebDataset --------------------------------------------------------------------------------------


def _webdataset(out: Path, size: int | None) -> Any:
    import webdataset

    urls = [str(path) for path in sorted(out.glob("shard-*.tar"))]

    def samples(source: Iterable[dict[str, Any]]) -> Iterator[tuple[str, np.ndarray, float]]:
        for sample in source:
            audio, rate = soundfile.read(io.BytesIO(sample.get("flac") or sample["wav"]), dtype="float32")
            yield sample["__key__"], audio if audio.ndim == 1 else audio[:, 0], len(audio) / rate

    dataset = webdataset.WebDataset(
        urls, shardshuffle=False, nodesplitter=webdataset.split_by_node, empty_check=False
    )
    return dataset.compose(samples).compose(lambda source: grouped(source, size))


def webdataset_batches(out: Path, size: int | None, workers: int) -> Batches:
    import webdataset

    dataset = _webdataset(out, size)
    loader = webdataset.WebLoader(dataset, batch_size=None, num_workers=workers) if workers else dataset
    return _keys(loader)


def webdataset_ranks(out: Path, size: int, world: int) -> list[int]:
    counts = []
    for rank in range(world):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        try:
            counts.append(sum(1 for _ in _webdataset(out, size)))
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
    return counts


# -- Lhotse (Shar) -----------------------------------------------------------------------------------


class LhotseAudio:
    """Lhotse's map-style dataset over a sampler's CutSets (a module's class: the workers import it)."""

    def __getitem__(self, cuts: Any) -> tuple[list[str], Any]:
        from lhotse.dataset.collation import collate_audio

        return [cut.id for cut in cuts], collate_audio(cuts)[0]


def lhotse_sampler(out: Path, size: int | None, rank: int = 0, world: int = 1, split: bool = False) -> Any:
    from lhotse import CutSet
    from lhotse.dataset import DynamicCutSampler, SimpleCutSampler

    cuts = CutSet.from_shar(in_dir=out, split_for_dataloading=split)
    if size is None:
        return DynamicCutSampler(cuts, max_duration=MAX_SECONDS, world_size=world, rank=rank)
    return SimpleCutSampler(cuts, max_cuts=size, world_size=world, rank=rank)


def lhotse_batches(out: Path, size: int | None, workers: int) -> Batches:
    import torch.utils.data
    from lhotse.dataset import IterableDatasetWrapper

    if not workers:
        dataset = LhotseAudio()
        return _keys(dataset[cuts] for cuts in lhotse_sampler(out, size))
    wrapper = IterableDatasetWrapper(dataset=LhotseAudio(), sampler=lhotse_sampler(out, size, split=True))
    return _keys(torch.utils.data.DataLoader(wrapper, batch_size=None, num_workers=workers))


class LhotseLoader:
    """The sampler's state beside a map-style DataLoader drawing from it, as Lhotse's docs show (a module's
    class: the benchmark's resume after a kill builds it in a new process)."""

    def __init__(self, out: Path, size: int, workers: int) -> None:
        import torch.utils.data

        self.sampler = lhotse_sampler(out, size)
        self.loader = torch.utils.data.DataLoader(
            LhotseAudio(), sampler=self.sampler, batch_size=None, num_workers=workers
        )

    def state_dict(self) -> Any:
        return self.sampler.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.sampler.load_state_dict(state)


def lhotse_ranks(out: Path, size: int, world: int) -> list[int]:
    return [sum(1 for _ in lhotse_sampler(out, size, rank, world)) for rank in range(world)]


# -- LitData -----------------------------------------------------------------------------------------


def litdata_collate(items: list[dict[str, Any]]) -> tuple[list[str], Any]:
    return [item["key"] for item in items], padded([decode(item["audio"]) for item in items])


def litdata_loader(out: Path, size: int, workers: int, rank: int = 0, world: int = 1) -> Any:
    import litdata
    from litdata.utilities.env import _DistributedEnv

    dataset = litdata.StreamingDataset(f"local:{out}")
    if world > 1:  # what torch.distributed would give it, without a process group
        dataset.distributed_env = _DistributedEnv(world, rank, 1)
    return litdata.StreamingDataLoader(
        dataset, batch_size=size, num_workers=workers, collate_fn=litdata_collate
    )


def litdata_batches(out: Path, size: int | None, workers: int) -> Batches | None:
    return None if size is None else _keys(litdata_loader(out, size, workers))


def litdata_ranks(out: Path, size: int, world: int) -> list[int]:
    return [sum(1 for _ in litdata_loader(out, size, 0, rank, world)) for rank in range(world)]


READERS: dict[str, Callable[[Path, int | None, int], Batches | None]] = {
    "shardio": shardio_batches,
    "WebDataset": webdataset_batches,
    "Lhotse Shar": lhotse_batches,
    "LitData": litdata_batches,
    "MosaicML Streaming": streaming_batches,
}
RESUMABLE: dict[str, tuple[Callable[[Path, int, int], Any], Callable[[Any], Batches]]] = {
    # Per peer with a resume mechanism: its loader (out, batch size, workers), with state_dict() and
    # load_state_dict(), and the keys of its batches.
    "shardio": (shardio_loader, lambda loader: (list(batch["keys"]) for batch in loader)),
    "Lhotse Shar": (LhotseLoader, lambda loader: (list(keys) for keys, _ in loader.loader)),
    "LitData": (litdata_loader, lambda loader: (list(keys) for keys, _ in loader)),
    "MosaicML Streaming": (streaming_loader, lambda loader: (list(keys) for keys, _ in loader)),
}
"""WebDataset keeps no state: a resumed run restarts its epoch."""


def resume(peer: str, out: Path, size: int, after: int, workers: int) -> Resumed:
    """``peer``'s resume in one process (:func:`resumed`); None where it has no mechanism."""
    if peer not in RESUMABLE:
        return None
    make, batches = RESUMABLE[peer]
    return resumed(lambda: make(out, size, workers), batches, after)


RANKS: dict[str, Callable[[Path, int, int], list[int]]] = {
    "shardio": shardio_ranks,
    "WebDataset": webdataset_ranks,
    "Lhotse Shar": lhotse_ranks,
    "LitData": litdata_ranks,
    "MosaicML Streaming": streaming_ranks,
}
