"""Reused shared-memory batch blocks (shardio.reading.blocks): DataLoader workers give exactly the batches of
the 0-worker path, a held batch is never overwritten, and dropped batches' blocks are reused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, IterableDataset

from shardio import Decoding, ShardDataset
from shardio.reading import blocks
from shardio.reading.collate import collate
from tests.sample_shards import make_uneven_dataset

BATCH = 8  # samples of 2-5 s at 8 kHz: batches of 1.3-2.6 MB, over the 1 MiB where blocks are pooled


@pytest.fixture(scope="module")
def long_wavs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("long_wavs")
    make_uneven_dataset(directory, [70, 50, 40], seed=5, duration_range=(2.0, 5.0))
    return directory


Snapshot = tuple[list[str], torch.Tensor, torch.Tensor, Any]


def _snapshot(batch: dict[str, Any]) -> Snapshot:
    """Copies of what a batch holds (its block may be reused once it is dropped)."""
    return list(batch["keys"]), batch["audio"].clone(), batch["lengths"].clone(), batch["batch_index"]


def _equal(a: Snapshot, b: Snapshot) -> bool:
    return a[0] == b[0] and a[3] == b[3] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_held_batches_from_workers_are_the_zero_worker_batches_and_never_overwritten(long_wavs: Path) -> None:
    expected = [_snapshot(b) for b in ShardDataset(long_wavs, batch_size=BATCH, seed=2)]
    assert len(expected) == 20 > 2 * blocks.LIMIT  # each worker runs out of blocks while all are held
    loader = DataLoader(ShardDataset(long_wavs, batch_size=BATCH, seed=2), batch_size=None, num_workers=2)
    held = list(loader)  # every batch kept alive until the end: no block may be written again meanwhile
    assert len(held) == len(expected)
    for batch, want in zip(held, expected):
        assert _equal(_snapshot(batch), want)
        assert type(batch) is dict


def test_dropped_blocks_are_reused_and_views_keep_theirs(long_wavs: Path) -> None:
    expected = [_snapshot(b) for b in ShardDataset(long_wavs, batch_size=BATCH, seed=4)]
    loader = DataLoader(ShardDataset(long_wavs, batch_size=BATCH, seed=4), batch_size=None, num_workers=2)
    pointers, views = set(), []
    for position, batch in enumerate(loader):
        assert _equal(_snapshot(batch), expected[position])
        pointers.add(batch["audio"].data_ptr())
        if position % 5 == 0:  # keep only a view of one row: its block must stay held for it
            views.append((position, batch["audio"][1]))
        del batch
    assert len(pointers) < len(expected)  # dropped batches' blocks came back
    for position, view in views:
        assert torch.equal(view, expected[position][1][1])


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_epochs_from_workers_match_zero_workers(long_wavs: Path, dtype: str) -> None:
    decoding = Decoding(dtype=dtype)
    plain = ShardDataset(
        long_wavs, batch_size=BATCH * 2, seed=7, decoding=decoding
    )  # int16: still over 1 MiB
    pooled = ShardDataset(long_wavs, batch_size=BATCH * 2, seed=7, decoding=decoding)
    loader = DataLoader(pooled, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        plain.set_epoch(epoch)
        want = [_snapshot(b) for b in plain]
        got = [_snapshot(b) for b in loader]
        assert len(got) == len(want) and all(_equal(g, w) for g, w in zip(got, want))


def test_resume_through_workers_continues_onto_the_zero_worker_batches(long_wavs: Path) -> None:
    expected = [_snapshot(b) for b in ShardDataset(long_wavs, batch_size=BATCH, seed=9)]
    first = ShardDataset(long_wavs, batch_size=BATCH, seed=9)
    held = []
    for batch in DataLoader(first, batch_size=None, num_workers=2):
        held.append(batch)  # held while the job "saves": its block must not change meanwhile
        if len(held) == 7:
            state = first.state_after(batch)
            break
    resumed = ShardDataset(long_wavs, batch_size=BATCH, seed=9)
    resumed.load_state_dict(state)
    rest = [_snapshot(b) for b in DataLoader(resumed, batch_size=None, num_workers=2)]
    got = [_snapshot(b) for b in held] + rest
    assert len(got) == len(expected) and all(_equal(g, w) for g, w in zip(got, expected))


def _samples(batches: list[dict[str, Any]]) -> list[tuple[int, str, torch.Tensor]]:
    """(position in the plan, key, audio) of each sample of collated unbatched samples, in plan order."""
    found = [
        (position, key, batch["audio"][row, :, : int(batch["lengths"][row])].clone())
        for batch in batches
        for row, (position, key) in enumerate(zip(batch["batch_index"], batch["keys"]))
    ]
    return sorted(found, key=lambda sample: sample[0])


def test_samples_collated_in_workers_use_blocks_and_match_zero_workers(long_wavs: Path) -> None:
    def loader(workers: int) -> DataLoader:
        return DataLoader(
            ShardDataset(long_wavs, seed=3), batch_size=BATCH, collate_fn=collate, num_workers=workers
        )

    expected = _samples(list(loader(0)))
    held = list(loader(2))  # all held: each worker runs out of blocks
    assert len(held) > 2 * blocks.LIMIT
    got = _samples(
        held
    )  # with workers the DataLoader batches each worker's samples: compare sample by sample
    assert [s[:2] for s in got] == [s[:2] for s in expected]
    assert all(torch.equal(g[2], w[2]) for g, w in zip(got, expected))
    pointers = {batch["audio"].data_ptr() for batch in loader(2)}  # each dropped at once: blocks come back
    assert len(pointers) < len(held)


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_collated_into_reused_memory_are_zero_padded(long_wavs: Path, workers: int) -> None:
    # each batch is dropped once the next is made, so later batches reuse earlier batches' memory (a block of
    # each worker, or with 0 workers the process's pool), which is not zeroed: their padding must be
    decoded = {sample["key"]: sample["audio"] for sample in ShardDataset(long_wavs, seed=7)}
    loader = DataLoader(
        ShardDataset(long_wavs, seed=7), batch_size=BATCH, collate_fn=collate, num_workers=workers
    )
    pointers, batches, padded_rows = set(), 0, 0
    for batch in loader:
        audio, lengths = batch["audio"], batch["lengths"].tolist()
        assert audio.shape == (len(lengths), 1, max(lengths))
        for row, (key, length) in enumerate(zip(batch["keys"], lengths)):
            assert torch.equal(audio[row, :, :length], decoded[key])
            assert not audio[row, :, length:].any()
            padded_rows += length < audio.shape[2]
        pointers.add(audio.data_ptr())
        batches += 1
    assert (
        batches > len(pointers) and padded_rows > batches
    )  # memory came back, and rows had padding to clear


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_unbatched_samples_are_never_overwritten_while_held_and_their_memory_comes_back(
    long_wavs: Path, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardio.reading import batchmemory

    arena = batchmemory._SampleArena()  # this test's own, empty
    monkeypatch.setattr(batchmemory, "_SAMPLES", arena)

    def block_of(audio: torch.Tensor) -> int | None:  # which of the arena's pooled blocks holds the sample
        start = audio.data_ptr()
        found = [
            n
            for n, block in enumerate(arena._pool._arrays)
            if block.ctypes.data <= start < block.ctypes.data + block.nbytes
        ]
        return found[0] if found else None

    decoding = Decoding(dtype=dtype)
    expected = {
        b["keys"][0]: b["audio"][0, :, : int(b["lengths"][0])].clone()  # batches of one: not the arena
        for b in ShardDataset(long_wavs, batch_size=1, seed=8, decoding=decoding)
    }
    blocks_used = set()
    for sample in ShardDataset(
        long_wavs, seed=9, decoding=decoding
    ):  # each dropped before the next is decoded
        assert torch.equal(sample["audio"], expected[sample["key"]])
        blocks_used.add(block_of(sample["audio"]))
    assert None not in blocks_used and len(blocks_used) <= 2  # every sample in the same few blocks
    held = list(
        ShardDataset(long_wavs, seed=8, decoding=decoding)
    )  # every sample kept: no memory may be reused
    assert len(held) == len(expected) == 160
    assert all(torch.equal(s["audio"], expected[s["key"]]) for s in held)


class _Reworked(IterableDataset):
    """Post-processing in the worker, as trainers do: a strided view of the block, or audio replaced."""

    def __init__(self, dataset: ShardDataset, replace: bool) -> None:
        self.dataset, self.replace = dataset, replace

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.dataset:
            if self.replace:
                batch["audio"] = batch["audio"] * 2
            else:
                batch["strided"] = batch["audio"][:, :, ::2]
            yield batch


@pytest.mark.parametrize("replace", [False, True])
def test_batches_reworked_in_the_worker_are_never_overwritten(long_wavs: Path, replace: bool) -> None:
    expected = [_snapshot(b) for b in ShardDataset(long_wavs, batch_size=BATCH, seed=6)]
    dataset = _Reworked(ShardDataset(long_wavs, batch_size=BATCH, seed=6), replace)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    held = [batch if replace else batch["strided"] for batch in loader]  # only the strided view is kept
    assert len(held) == len(expected)
    for batch, (keys, audio, lengths, _) in zip(held, expected):
        if replace:
            assert batch["keys"] == keys and torch.equal(batch["lengths"], lengths)
            assert torch.equal(batch["audio"], audio * 2)
        else:
            assert torch.equal(batch, audio[:, :, ::2])
    more = list(DataLoader(dataset, batch_size=None, num_workers=2))  # blocks of replaced audio came back
    assert len(more) == len(expected)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.integers(1, 3 << 20)),
            st.tuples(st.just("drop"), st.integers(0, 20)),
        ),
        max_size=40,
    )
)
def test_a_block_is_never_written_while_a_received_batch_holds_it(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, int]]
) -> None:
    monkeypatch.setattr(blocks, "_POOL", blocks._Pool())  # this process plays the worker and the trainer
    monkeypatch.setattr(blocks, "_MAPPED", blocks._Mapped())
    held: list[tuple[dict[str, Any], int]] = []
    for step, (kind, value) in enumerate(steps):
        if kind == "drop":
            if held:
                del held[value % len(held)]  # the trainer drops a batch: its block may be written again
            continue
        block = blocks.take(value)
        assert len(blocks._POOL.blocks) <= blocks.LIMIT
        if block is None:  # every pooled block is held: the worker would make a fresh one
            assert len(held) >= blocks.LIMIT
            continue
        audio = block[: value - value % 4].view(torch.float32)
        audio.fill_(float(step))  # the worker writes its batch
        rebuild, args = cast(tuple[Any, ...], blocks.outgoing({"audio": audio, "step": step}).__reduce__())
        held.append((rebuild(*args), step))  # as the training process unpickles it
        # the training process keeps mapped only the worker's current blocks (replaced ones were dropped)
        assert set(blocks._MAPPED.storages) <= {block.token for block in blocks._POOL.blocks}
        for batch, wrote in held:
            assert batch["step"] == wrote and bool((batch["audio"] == float(wrote)).all())


def test_keeping_a_batch_s_lengths_does_not_hold_its_block(long_wavs: Path) -> None:
    kept = [
        batch["lengths"]
        for batch in DataLoader(
            ShardDataset(long_wavs, batch_size=BATCH, seed=8), batch_size=None, num_workers=2
        )
    ]  # as a trainer's logs do
    assert [lengths.tolist() for lengths in kept] == [
        b["lengths"].tolist() for b in ShardDataset(long_wavs, batch_size=BATCH, seed=8)
    ]
    pointers = set()
    for batch in DataLoader(
        ShardDataset(long_wavs, batch_size=BATCH, seed=8), batch_size=None, num_workers=2
    ):
        kept.append(batch["lengths"])
        pointers.add(batch["audio"].data_ptr())
        del batch
    assert len(pointers) < len(kept) // 2  # the blocks came back although every batch's lengths are kept
