"""Promises of the docs (README.md, docs/) that no other test pinned, each on real shards and real workers.

Each test names the docs passage it holds the code to. Silent wrong answers first: a batch that holds other
audio, rates or keys than the samples', a resume onto other batches, augmentation that depends on the world.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sample_shards import dataset_fixture, wav_bytes
from torch.utils.data import DataLoader

from shardio import (
    Batching,
    Decoding,
    EpochSize,
    MixedDataset,
    ShardDataset,
    ShardLoader,
    ShardWriter,
    StateError,
    World,
    collate,
)

small = dataset_fixture("promises_small", [3, 9, 14, 5], seed=2)
"""31 short 8 kHz samples in 4 uneven shards."""
long = dataset_fixture("promises_long", [40, 25, 31], sample_rate=16000, duration_range=(0.5, 2.0), seed=4)
"""96 16 kHz samples of 0.5-2 s: batches of 8 large enough for the workers' reused shared-memory blocks."""


def keys_of(batches: Iterable[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [tuple(batch["keys"]) for batch in batches]


def epoch_keys(data: Path, epoch: int, **options: Any) -> list[tuple[str, ...]]:
    ds = ShardDataset(data, **options)
    ds.set_epoch(epoch)
    return keys_of(ds)


# -- docs/guides/loading.md "Options": dtype="int16" ---------------------------------------------------------


@pytest.mark.parametrize("loader", ["shardloader", "dataloader"])
def test_int16_batches_from_workers_are_the_float32_batches_times_32768(long: Path, loader: str) -> None:
    """Docs: ``dtype="int16"`` (16-bit PCM as stored) ``audio.float() / 32768`` "gives exactly the float32
    batch". Through 2 worker processes, whose shared-memory blocks are reused once a batch is dropped (every
    batch here is dropped at once), over 2 epochs: the same keys, and the same audio and lengths to the bit,
    padding included (a reused block's stale padding would show)."""
    options: dict[str, Any] = {"batch_size": 8, "seed": 1}
    reference = []
    floats = ShardDataset(long, **options)
    for epoch in range(2):
        floats.set_epoch(epoch)
        reference += [(tuple(b["keys"]), b["audio"].clone(), b["lengths"].clone()) for b in floats]
    ds = ShardDataset(long, decoding=Decoding(dtype="int16"), **options)
    made: Any = (
        ShardLoader(ds, num_workers=2)
        if loader == "shardloader"
        else DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    )
    got = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        for batch in made:
            assert batch["audio"].dtype == torch.int16
            got.append((tuple(batch["keys"]), batch["audio"].float() / 32768, batch["lengths"].clone()))
            del batch  # dropped: its block goes back to the worker
    if isinstance(made, ShardLoader):
        made.close()
    assert [g[0] for g in got] == [r[0] for r in reference]
    for (keys, audio, lengths), (_, expected, expected_lengths) in zip(got, reference):
        assert torch.equal(lengths, expected_lengths), keys
        assert torch.equal(audio, expected), keys


# -- docs/guides/loading.md "What a batch holds": a sample's own facts win over metadata ---------------------

LYING_METADATA = {"key": "liar", "audio": [1, 2, 3], "sample_rate": 44100, "corpus": "liar", "text": "t"}


def _lying_dataset(directory: Path, samples: int = 6) -> Path:
    """``samples`` 8 kHz samples ``k0``, ``k1``, ... in two shards, whose json members hold
    :data:`LYING_METADATA`: fields named as the sample's own facts (key, audio, sample_rate, a mix's
    corpus)."""
    rng = np.random.default_rng(0)
    with ShardWriter(directory) as writer:
        for i in range(samples):
            if i == samples // 2:
                writer.end_shard()
            frames = 400 + 100 * i
            signal = rng.uniform(-0.5, 0.5, frames).astype(np.float32)
            meta = json.dumps({**LYING_METADATA, "i": i}).encode()
            writer.write(
                f"k{i}",
                {"wav": wav_bytes(signal, 8000), "json": meta},
                audio_ext="wav",
                num_frames=frames,
                sample_rate=8000,
                channels=1,
            )
    return directory


@pytest.fixture(scope="module")
def lying(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("promises_lying")
    return {"a": _lying_dataset(root / "a"), "b": _lying_dataset(root / "b")}


def _check_batch(batch: dict[str, Any], corpora: set[str] | None) -> None:
    """The batch's keys, audio and rates are the samples' own; ``corpus`` is the mix's name in a mix, else the
    metadata's field as any other."""
    count = len(batch["keys"])
    assert count and all(key.startswith("k") for key in batch["keys"]), batch["keys"]
    assert "key" not in batch
    assert isinstance(batch["audio"], torch.Tensor) and batch["audio"].dim() == 3
    assert batch["audio"].shape[0] == count
    assert batch["lengths"].tolist() == [400 + 100 * i for i in batch["i"]]
    assert torch.equal(batch["sample_rate"], torch.full((count,), 8000, dtype=torch.int64))
    assert batch["text"] == ["t"] * count
    if corpora is None:
        assert batch["corpus"] == ["liar"] * count
    else:
        assert set(batch["corpus"]) <= corpora, batch["corpus"]


def _check_sample(sample: dict[str, Any], corpora: set[str] | None) -> None:
    assert sample["key"].startswith("k") and sample["sample_rate"] == 8000
    assert isinstance(sample["audio"], torch.Tensor) and sample["audio"].shape[-1] == 400 + 100 * sample["i"]
    assert sample["corpus"] == "liar" if corpora is None else sample["corpus"] in corpora


@pytest.mark.parametrize(
    "options",
    [{}, {"decoding": Decoding(mono=True)}, {"decoding": Decoding(dtype="int16")}, {"on_error": "skip"}],
    ids=["fast-lane", "general-path", "int16", "skip"],
)
def test_a_samples_own_facts_win_over_metadata_of_the_same_name(
    lying: dict[str, Path], options: dict[str, Any]
) -> None:
    """Docs: "A sample's own facts win over metadata of the same name, and such a metadata field does not
    reach the batch: ``key``, ``audio``, ``sample_rate`` ... and, in a ``MixedDataset``, ``corpus``". In
    process (batched, single samples), and the same batches through 2 workers."""
    data = lying["a"]
    for batch in ShardDataset(data, batch_size=2, **options):
        _check_batch(batch, None)
    for sample in ShardDataset(data, **options):
        _check_sample(sample, None)
    if options:
        return
    with ShardLoader(ShardDataset(data, batch_size=2), num_workers=2) as loader:
        for batch in loader:
            _check_batch(batch, None)
    for batch in DataLoader(ShardDataset(data, batch_size=2), batch_size=None, num_workers=2):
        _check_batch(batch, None)
    for batch in DataLoader(ShardDataset(data), batch_size=2, num_workers=2, collate_fn=collate):
        _check_batch(batch, None)


def test_a_mixs_corpus_name_wins_over_a_corpus_metadata_field(lying: dict[str, Path]) -> None:
    def mix(**options: Any) -> MixedDataset:
        return MixedDataset(
            {"x": str(lying["a"]), "y": str(lying["b"])},
            {"x": 0.5, "y": 0.5},
            EpochSize(primary="x"),
            **options,
        )

    corpora = {"x", "y"}
    seen = set()
    for batch in mix(batch_size=2):
        _check_batch(batch, corpora)
        seen.update(batch["corpus"])
    assert seen == corpora
    for batch in DataLoader(mix(batch_size=2), batch_size=None, num_workers=2):
        _check_batch(batch, corpora)
    for sample in mix():
        _check_sample(sample, corpora)


# -- docs/guides/loading.md "Samples the DataLoader batches" -------------------------------------------------


@pytest.mark.parametrize("workers", [2, 3])
def test_collated_samples_of_workers_every_rank_as_many_batches_within_workers_less_one(
    small: Path, workers: int
) -> None:
    """Docs: with ``collate_fn=shardio.collate`` "each worker batches its own share of the samples, so an
    epoch can hold up to ``num_workers - 1`` batches more than ``len(loader)`` says, every rank as many". Two
    ranks, real workers: each rank consumes its share of samples exactly once, its batch count lies in
    ``[len(loader), len(loader) + num_workers - 1]``, and both ranks yield the same count (DDP would hang
    else)."""
    counts = []
    for rank in range(2):
        share = [sample["key"] for sample in ShardDataset(small, seed=3, world=World(rank, 2))]
        loader = DataLoader(
            ShardDataset(small, seed=3, world=World(rank, 2)),
            batch_size=4,
            num_workers=workers,
            collate_fn=collate,
        )
        batches = keys_of(loader)
        assert sorted(key for keys in batches for key in keys) == sorted(share)
        assert len(loader) <= len(batches) <= len(loader) + workers - 1, (len(loader), len(batches))
        counts.append(len(batches))
    assert counts[0] == counts[1]


# -- docs/guides/checkpoint-resume.md: load_state_dict "applies to the next iteration only" ------------------


def _loaders() -> dict[str, Callable[[ShardDataset], Any]]:
    return {
        "in_process": lambda ds: ds,
        "persistent_dataloader": lambda ds: DataLoader(
            ds, batch_size=None, num_workers=2, persistent_workers=True
        ),
        "shardloader": lambda ds: ShardLoader(ds, num_workers=2),
    }


@pytest.mark.parametrize("loader", ["in_process", "persistent_dataloader", "shardloader"])
def test_a_state_loaded_mid_iteration_applies_to_the_next_iteration_only(small: Path, loader: str) -> None:
    """Docs: ``ds.load_state_dict(...)`` "applies to the next iteration only". Loaded while an iteration is
    two batches in, the running iteration still plays the rest of its own epoch, every batch once; the next
    iteration plays the loaded state's rest of epoch 1."""
    options: dict[str, Any] = {"batch_size": 3, "seed": 1}
    first, second = epoch_keys(small, 0, **options), epoch_keys(small, 1, **options)
    state = ShardDataset(small, **options).state_after({"epoch": 1, "batch_index": 2})
    ds = ShardDataset(small, **options)
    made = _loaders()[loader](ds)
    running = iter(made)
    got = [tuple(next(running)["keys"]) for _ in range(2)]
    ds.load_state_dict(json.loads(json.dumps(state)))
    got += keys_of(running)
    assert got == first
    assert keys_of(made) == second[3:]
    if isinstance(made, ShardLoader):
        made.close()


# -- docs/guides/loading.md "Duration buckets": a bucketed state saved before sync_buckets existed -----------


def test_a_bucketed_state_from_before_sync_buckets_resumes_with_sync_buckets_off(small: Path) -> None:
    """Docs: "A bucketed state saved before ``sync_buckets`` existed resumes into a dataset built with
    ``sync_buckets=False`` (one with the default refuses it, saying so)." Such a state records no
    ``sync_buckets`` (as one saved with it off still does not): into a dataset made with
    ``sync_buckets=False`` it resumes onto exactly that plan's batches; into the default (synchronised,
    another plan) it is a ``StateError`` naming the option, never a resume onto the other plan's batches."""
    options: dict[str, Any] = {"max_duration": 1.5, "num_buckets": 3}
    off = Batching(**options, sync_buckets=False)
    unsynced = keys_of(ShardDataset(small, batching=off, seed=2))
    assert unsynced != keys_of(ShardDataset(small, **options, seed=2))  # the two plans differ here
    old = json.loads(
        json.dumps(ShardDataset(small, batching=off, seed=2).state_after({"epoch": 0, "batch_index": 2}))
    )
    assert "sync_buckets" not in json.dumps(old)
    resumed = ShardDataset(small, batching=off, seed=2)
    resumed.load_state_dict(old)
    assert keys_of(resumed) == unsynced[3:]
    with pytest.raises(
        StateError, match=r"sync_buckets: state None, dataset True .*Batching\(sync_buckets=False\)"
    ):
        ShardDataset(small, **options, seed=2).load_state_dict(old)


# -- docs/guides/checkpoint-resume.md "What a resume guarantees": a transform's generator --------------------


def _gain(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    sample["gain"] = float(rng.uniform())
    return sample


def _gains(batches: Iterable[dict[str, Any]], into: dict[str, float]) -> None:
    for batch in batches:
        for key, gain in zip(batch["keys"], batch["gain"]):
            assert into.setdefault(key, gain) == gain, f"{key} drew twice, differently"


@pytest.mark.parametrize("epoch", [0, 3])
def test_a_transforms_draws_depend_on_seed_epoch_and_key_only(small: Path, epoch: int) -> None:
    """Docs: "a ``transform`` receives a generator seeded by ``(seed, epoch, key)``": a key's augmentation
    is the same whatever world, batching, worker count or loader plays it, and a resume elsewhere (another
    world size) draws what the uninterrupted run drew; another epoch or seed draws otherwise."""
    gain = Decoding(transform=_gain)
    alone: dict[str, float] = {}
    ds = ShardDataset(small, batch_size=3, seed=4, decoding=gain)
    ds.set_epoch(epoch)
    _gains(ds, alone)
    assert len(alone) == 31
    ranks: dict[str, float] = {}
    for rank in range(2):
        ds = ShardDataset(small, max_duration=1.0, seed=4, decoding=gain, world=World(rank, 2))
        ds.set_epoch(epoch)
        _gains(DataLoader(ds, batch_size=None, num_workers=2), ranks)
    assert ranks == alone
    resumed: dict[str, float] = {}
    first = ShardDataset(small, batch_size=3, seed=4, decoding=gain, world=World(0, 2))
    first.set_epoch(epoch)
    batches = iter(first)
    batch = next(batches)
    _gains([batch], resumed)
    state = json.loads(json.dumps(first.state_after(batch)))
    for rank in range(3):  # 2 -> 3 ranks
        ds = ShardDataset(small, batch_size=3, seed=4, decoding=gain, world=World(rank, 3))
        ds.load_state_dict(state)
        with ShardLoader(ds, num_workers=2) as loader:
            _gains(loader, resumed)
    assert {key: alone[key] for key in resumed} == resumed
    other = ShardDataset(small, batch_size=3, seed=4, decoding=gain)
    other.set_epoch(epoch + 1)
    later: dict[str, float] = {}
    _gains(other, later)
    assert all(later[key] != alone[key] for key in alone)


# -- docs/guides/evaluation.md: every batch carries repeat, a bool per sample --------------------------------


def test_the_readme_evaluation_mask_works_on_every_kind_of_batch(small: Path) -> None:
    """Docs: "Every batch carries ``repeat``, a bool per sample ... ``keep = ~batch["repeat"]``". The
    dataset's batches (in process, through workers) and the samples a DataLoader batches with
    ``shardio.collate``: in each, ``~batch["repeat"]`` keeps exactly the samples that are not planned repeats,
    and over the 3 ranks those are every sample once."""
    kinds: dict[str, Callable[[int], Iterable[dict[str, Any]]]] = {
        "batched": lambda rank: ShardDataset(small, batch_size=4, seed=1, world=World(rank, 3)),
        "workers": lambda rank: DataLoader(
            ShardDataset(small, batch_size=4, seed=1, world=World(rank, 3)), batch_size=None, num_workers=2
        ),
        "collated": lambda rank: DataLoader(
            ShardDataset(small, seed=1, world=World(rank, 3)), batch_size=4, collate_fn=collate
        ),
        "collated in workers": lambda rank: DataLoader(
            ShardDataset(small, seed=1, world=World(rank, 3)), batch_size=4, collate_fn=collate, num_workers=2
        ),
    }
    for kind, make in kinds.items():
        kept = []
        for rank in range(3):
            for batch in make(rank):
                keep = ~batch["repeat"]
                kept += [key for key, flag in zip(batch["keys"], keep.tolist()) if flag]
        everything = [key for keys in epoch_keys(small, 0, batch_size=31) for key in keys]
        assert sorted(kept) == sorted(everything), kind
