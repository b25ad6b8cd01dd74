"""One resume-equivalence harness, applied to every loader configuration.

Run to a point, save the state, build a fresh dataset and loader, load, finish: the concatenated key
sequence equals the uninterrupted one (same world and workers), or covers the rest of the epoch exactly
once (changed world size). Real shards on disk, real DataLoader worker processes.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardio import EpochPlan, OptionError, ShardDataset, ShardWriter, StateError, World

SHARD_SIZES = (1, 9, 40, 3, 27, 2)


def _write_dataset(directory: Path, shard_sizes: tuple[int, ...], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with ShardWriter(directory, compression="zstd", max_samples=max(shard_sizes)) as writer:
        for shard, size in enumerate(shard_sizes):
            for i in range(size):
                frames = int(rng.integers(400, 4000))
                buffer = io.BytesIO()
                soundfile.write(buffer, rng.uniform(-0.5, 0.5, frames).astype(np.float32), 8000, format="WAV",
                                subtype="PCM_16")
                writer.write(f"s{shard:02d}_{i:03d}", {"wav": buffer.getvalue(), "json": b'{"text": "t"}'},
                             audio_ext="wav", num_frames=frames, sample_rate=8000, channels=1)
            writer.end_shard()  # one shard per entry of shard_sizes
    return directory


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_dataset(tmp_path_factory.mktemp("resume"), SHARD_SIZES, seed=3)


def make(dataset_dir: Path, **options: Any) -> ShardDataset:
    options.setdefault("max_duration", 1.5)
    options.setdefault("seed", 7)
    options.setdefault("shuffle_shards", 2)
    return ShardDataset(dataset_dir, **options)


def keys_of(batches: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[list[str]]:
    return [list(batch["keys"]) if "keys" in batch else [batch["key"]] for batch in batches]


def uninterrupted(dataset_dir: Path, epoch: int = 0, **options: Any) -> list[list[str]]:
    ds = make(dataset_dir, **options)
    ds.set_epoch(epoch)
    return keys_of(iter(ds))


LoaderFactory = Callable[[ShardDataset], Any]


def plain(workers: int, **extra: Any) -> LoaderFactory:
    return lambda ds: DataLoader(ds, batch_size=None, num_workers=workers, **extra)


def stateful(workers: int) -> LoaderFactory:
    return lambda ds: StatefulDataLoader(ds, batch_size=None, num_workers=workers)


def run_interrupted(dataset_dir: Path, loader: LoaderFactory, stops: list[int], epoch: int = 0,
                    sdl: bool = False, **options: Any) -> list[list[str]]:
    """Consume ``stops[0]`` batches, save, restart from the state; repeat per stop; finish the epoch."""
    seen: list[list[str]] = []
    state: dict[str, Any] | None = None
    for stop in [*stops, None]:
        ds = make(dataset_dir, **options)
        ds.set_epoch(epoch)
        it_loader = loader(ds)
        if state is not None:
            # the state travels through JSON, as a checkpoint would
            state = json.loads(json.dumps(state))
            (it_loader if sdl else ds).load_state_dict(state)
        taken = 0
        for batch in it_loader:
            if stop is not None and taken == stop:
                break
            seen.extend(keys_of([batch]))
            taken += 1
            state = it_loader.state_dict() if sdl else ds.state_after(batch)
        else:
            if stop is not None:
                state = it_loader.state_dict() if sdl else (ds.state_dict() if taken == 0 else state)
        del it_loader
    return seen


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_plain_dataloader_resume_is_exact(dataset_dir: Path, workers: int) -> None:
    expected = uninterrupted(dataset_dir)
    n = len(expected)
    for stops in ([n // 2], [1, n // 3], [n - 1]):
        assert run_interrupted(dataset_dir, plain(workers), stops) == expected


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resume_is_exact(dataset_dir: Path, workers: int) -> None:
    expected = uninterrupted(dataset_dir)
    n = len(expected)
    for stops in ([n // 2], [3, 4]):
        assert run_interrupted(dataset_dir, stateful(workers), stops, sdl=True) == expected


def test_resume_at_zero_and_exact_end(dataset_dir: Path) -> None:
    expected = uninterrupted(dataset_dir)
    ds = make(dataset_dir)
    ds.load_state_dict(ds.state_dict())  # position 0
    assert keys_of(iter(ds)) == expected
    at_end = ds.state_dict()  # iterated to the end in this process: the exact end of epoch 0
    resumed = make(dataset_dir)
    resumed.load_state_dict(at_end)
    resumed.set_epoch(0)  # a training loop re-entering the epoch it was saved in keeps the position
    assert keys_of(iter(resumed)) == []
    resumed.set_epoch(1)
    assert keys_of(iter(resumed)) == uninterrupted(dataset_dir, epoch=1)


def test_resume_with_more_or_fewer_workers_is_exact(dataset_dir: Path) -> None:
    expected = uninterrupted(dataset_dir)
    ds = make(dataset_dir)
    first = keys_of(b for _, b in zip(range(5), DataLoader(ds, batch_size=None, num_workers=3)))
    state = ds.state_after({"epoch": 0, "batch_index": 4})
    resumed = make(dataset_dir)
    resumed.load_state_dict(state)
    rest = keys_of(DataLoader(resumed, batch_size=None, num_workers=1))
    assert first + rest == expected


def test_persistent_workers_across_epochs(dataset_dir: Path) -> None:
    ds = make(dataset_dir)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append(keys_of(loader))
    assert epochs == [uninterrupted(dataset_dir, epoch=e) for e in range(3)]
    assert epochs[0] != epochs[1]
    # interrupted in epoch 1, resumed with persistent workers: epochs 1 and 2 match the straight run
    ds2 = make(dataset_dir)
    ds2.set_epoch(1)
    state = None
    for i, batch in enumerate(DataLoader(ds2, batch_size=None, num_workers=2)):
        if i == 4:
            break
        state = ds2.state_after(batch)
    ds3 = make(dataset_dir)
    ds3.load_state_dict(state)
    loader3 = DataLoader(ds3, batch_size=None, num_workers=2, persistent_workers=True)
    ds3.set_epoch(1)
    assert epochs[1][:4] + keys_of(loader3) == epochs[1]
    ds3.set_epoch(2)
    assert keys_of(loader3) == epochs[2]


def test_rank0_state_restores_every_rank(dataset_dir: Path) -> None:
    world_size = 3
    straight = {r: uninterrupted(dataset_dir, world=World(rank=r, world_size=world_size))
                for r in range(world_size)}
    assert len({len(v) for v in straight.values()}) == 1
    ds0 = make(dataset_dir, world=World(rank=0, world_size=world_size))
    batches = iter(ds0)
    for _ in range(3):
        state = ds0.state_after(next(batches))
    for rank in range(world_size):
        ds = make(dataset_dir, world=World(rank=rank, world_size=world_size))
        ds.load_state_dict(state)
        assert straight[rank][:3] + keys_of(iter(ds)) == straight[rank]


def consumed_counts(dataset_dir: Path, world_size: int, stop: int, new_world: int,
                    **options: Any) -> tuple[Counter[str], EpochPlan]:
    """Keys consumed by all ranks: ``stop`` batches under ``world_size``, then the rest under ``new_world``."""
    counts: Counter[str] = Counter()
    state = None
    for rank in range(world_size):
        ds = make(dataset_dir, world=World(rank=rank, world_size=world_size), **options)
        for j, batch in enumerate(iter(ds)):
            if j == stop:
                break
            counts.update(batch["keys"])
            if rank == 0:
                state = ds.state_after(batch)
    plan = None
    for rank in range(new_world):
        last = make(dataset_dir, world=World(rank=rank, world_size=new_world), **options)
        if state is not None:
            last.load_state_dict(state)
        lengths, plan = len(last) - last.state_dict()["start"], last.plan()
        got = keys_of(iter(last))
        assert len(got) == lengths  # every rank yields what len() says (the rest of the epoch)
        counts.update(k for batch in got for k in batch)
    assert plan is not None
    return counts, plan


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.integers(1, 5), new=st.integers(1, 5), fraction=st.floats(0.05, 0.95),
       remainder=st.sampled_from(["drop", "pad"]))
def test_elastic_resume_consumes_the_rest_exactly_once(dataset_dir: Path, old: int, new: int, fraction: float,
                                                       remainder: str) -> None:
    total = sum(SHARD_SIZES)
    per_rank = len(make(dataset_dir, world=World(0, old), remainder=remainder))
    stop = max(1, int(per_rank * fraction))
    counts, plan = consumed_counts(dataset_dir, old, stop, new, remainder=remainder)
    all_keys = set(make(dataset_dir).index.keys)
    if remainder == "pad":
        assert set(counts) == all_keys
    # exactly once, up to what the remainder policies report: repeats (pad) or leftovers (drop)
    duplicates = sum(c - 1 for c in counts.values())
    missing = len(all_keys - set(counts))
    assert sum(counts.values()) - duplicates + missing == total
    if remainder == "drop":
        assert duplicates == 0
        assert missing == plan.dropped  # only the last segment's dropped round is lost
    else:
        assert missing == 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_stops_resume_exactly(dataset_dir: Path, data: st.DataObject) -> None:
    options = data.draw(st.sampled_from([{"max_duration": 1.5}, {"batch_size": 4, "max_duration": None},
                                         {"max_duration": 1.5, "num_buckets": 3, "quadratic_duration": 20.0},
                                         {"batch_size": None, "max_duration": None}]))
    epoch = data.draw(st.integers(0, 3))
    expected = uninterrupted(dataset_dir, epoch=epoch, **options)
    stops = data.draw(st.lists(st.integers(0, len(expected)), min_size=1, max_size=3))
    assert run_interrupted(dataset_dir, plain(0), stops, epoch=epoch, **options) == expected


def test_incompatible_state_names_every_difference(dataset_dir: Path, tmp_path: Path) -> None:
    state = make(dataset_dir).state_dict()
    with pytest.raises(StateError) as raised:
        make(dataset_dir, seed=8, max_duration=2.0).load_state_dict(state)
    message = str(raised.value)
    assert "seed: state 7, dataset 8" in message and "option max_duration: state 1.5, dataset 2.0" in message
    other = _write_dataset(tmp_path / "other", (3, 4), seed=1)
    with pytest.raises(StateError, match="index fingerprint"):
        make(other).load_state_dict(state)
    with pytest.raises(StateError, match="not a shardio loader state"):
        make(dataset_dir).load_state_dict({"epoch": 1})
    beyond = dict(state, start=10_000)
    with pytest.raises(StateError, match="has only"):
        make(dataset_dir).load_state_dict(beyond)
    with pytest.raises(OptionError):
        make(dataset_dir).state_after({"keys": []})


def test_resume_seeks_without_decoding_skipped_samples(dataset_dir: Path) -> None:
    decoded: list[str] = []

    def record(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        decoded.append(sample["key"])
        return sample

    expected = uninterrupted(dataset_dir)
    ds = make(dataset_dir)
    ds.load_state_dict(ds.state_after({"epoch": 0, "batch_index": len(expected) - 3}))
    ds.transform = record
    rest = keys_of(iter(ds))
    assert rest == expected[-2:]
    assert decoded == [k for batch in expected[-2:] for k in batch]


def test_transform_rng_is_identical_after_resume_and_across_workers(dataset_dir: Path) -> None:
    def noise(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        sample["gain"] = float(rng.uniform())
        return sample

    def gains(loader: Any) -> dict[str, float]:
        return {k: g for batch in loader for k, g in zip(batch["keys"], batch["gain"])}

    one = gains(DataLoader(make(dataset_dir, transform=noise), batch_size=None, num_workers=0))
    two = gains(DataLoader(make(dataset_dir, transform=noise), batch_size=None, num_workers=2))
    assert one == two and len(set(one.values())) == len(one)
    ds = make(dataset_dir, transform=noise)
    ds.load_state_dict(ds.state_after({"epoch": 0, "batch_index": 2}))
    resumed = gains(iter(ds))
    assert all(one[k] == g for k, g in resumed.items())
    ds.set_epoch(1)
    assert gains(iter(ds)) != one  # a new epoch draws new augmentation


def test_a_stateful_dataloader_state_resumes_with_other_workers_and_ranks(dataset_dir: Path) -> None:
    expected = uninterrupted(dataset_dir)
    ds = make(dataset_dir)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    first = []
    for batch in loader:
        first.append(list(batch["keys"]))
        if len(first) == 5:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    del loader
    resumed = make(dataset_dir)
    resumed.load_state_dict(state)  # the whole loader state: its workers' states combine into the position
    assert first + keys_of(DataLoader(resumed, batch_size=None, num_workers=3)) == expected
    counts: Counter[str] = Counter(k for keys in first for k in keys)
    for rank in range(2):  # and onto two ranks: the rest of the epoch exactly once (up to the pad remainder)
        elastic = make(dataset_dir, world=World(rank=rank, world_size=2))
        elastic.load_state_dict(state)
        padded = elastic.plan().padded  # the resumed epoch's plan (once iterated, the next epoch's)
        counts.update(k for keys in keys_of(iter(elastic)) for k in keys)
    assert set(counts) == set(make(dataset_dir).index.keys)
    assert sum(counts.values()) - len(counts) == padded
