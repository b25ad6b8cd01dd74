"""Batch memory reuse in the iterating process: a batch anything still references is never written again,
a dropped one is reused, and a reused block's padding is zero."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sample_shards import make_uneven_dataset

from shardio import ShardDataset
from shardio.reading.decode import decode_audio
from shardio.reading.reader import Reader

BATCH = 16


@pytest.fixture(scope="module")
def long_clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 16 kHz clips of 0.5-3 s: batches of 16 take 0.5-3 MB, above the size the reuse pool starts at
    directory = tmp_path_factory.mktemp("long")
    make_uneven_dataset(directory, [40, 25, 31], sample_rate=16000, duration_range=(0.5, 3.0))
    return directory


@pytest.fixture(scope="module")
def expected(long_clips: Path) -> dict[str, np.ndarray]:
    """Every sample's audio, decoded on its own."""
    reader = Reader(ShardDataset(long_clips).index)
    return {key: decode_audio(reader.members(i)["wav"], "wav")[0] for i, key in enumerate(reader.index.keys)}


def _epochs(dataset: ShardDataset, epochs: int) -> list[dict[str, torch.Tensor]]:
    """Every batch of ``epochs`` epochs, all kept."""
    kept = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        kept.extend(dataset)
    return kept


def _check(batch: dict[str, torch.Tensor], expected: dict[str, np.ndarray]) -> None:
    audio = batch["audio"].numpy()
    for row, key in enumerate(batch["keys"]):
        length = int(batch["lengths"][row])
        assert np.array_equal(audio[row, :, :length], expected[key]), key
        assert not audio[row, :, length:].any(), f"{key}: padding is not zero"


def test_batches_kept_by_the_trainer_are_never_overwritten(
    long_clips: Path, expected: dict[str, np.ndarray]
) -> None:
    kept = _epochs(ShardDataset(long_clips, batch_size=BATCH, seed=1), 2)
    assert len({batch["audio"].data_ptr() for batch in kept}) == len(kept)
    for batch in kept:
        _check(batch, expected)


def test_dropped_batches_are_reused_with_zero_padding(
    long_clips: Path, expected: dict[str, np.ndarray]
) -> None:
    dataset = ShardDataset(long_clips, batch_size=BATCH, seed=2)
    addresses = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for batch in dataset:
            _check(batch, expected)
            addresses.append(batch["audio"].data_ptr())
            del batch  # the last reference: its block returns to the pool now, no collection needed
    # longer batches than before take a new block, so a few addresses are new; most are reused
    assert len(set(addresses)) <= 4 < len(addresses)


def test_a_view_of_a_batch_keeps_its_memory(long_clips: Path, expected: dict[str, np.ndarray]) -> None:
    dataset = ShardDataset(long_clips, batch_size=BATCH, seed=3)
    views, keys = [], []
    for batch in dataset:
        views.append(batch["audio"][0].numpy())  # a numpy view of one row, the batch itself dropped
        keys.append((batch["keys"][0], int(batch["lengths"][0])))
        del batch
    for view, (key, length) in zip(views, keys):
        assert np.array_equal(view[:, :length], expected[key])


def test_datasets_iterated_in_threads_never_share_a_batch(
    long_clips: Path, expected: dict[str, np.ndarray]
) -> None:
    import threading

    kept: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(3)]

    def run(slot: int) -> None:
        kept[slot] = _epochs(ShardDataset(long_clips, batch_size=BATCH, seed=slot), 2)

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    batches = [batch for per_thread in kept for batch in per_thread]
    assert len(batches) == 3 * 2 * len(ShardDataset(long_clips, batch_size=BATCH))
    assert len({batch["audio"].data_ptr() for batch in batches}) == len(batches)
    for batch in batches:
        _check(batch, expected)


def test_the_public_collate_pads_samples_and_refuses_batches(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from shardio import OptionError, collate

    make_uneven_dataset(tmp_path / "d", (5,), seed=1)
    samples = list(ShardDataset(tmp_path / "d", shuffle=False))
    batch = next(
        iter(DataLoader(ShardDataset(tmp_path / "d", shuffle=False), batch_size=5, collate_fn=collate))
    )
    lengths = [sample["audio"].shape[-1] for sample in samples]
    assert batch["keys"] == [sample["key"] for sample in samples] and batch["lengths"].tolist() == lengths
    for row, sample in enumerate(samples):
        assert torch.equal(batch["audio"][row, :, : lengths[row]], sample["audio"])
        assert not batch["audio"][row, :, lengths[row] :].any()
    with pytest.raises(OptionError, match="these are 2 batches of a batched dataset.*batch_size=None"):
        next(iter(DataLoader(ShardDataset(tmp_path / "d", batch_size=2), batch_size=2, collate_fn=collate)))
