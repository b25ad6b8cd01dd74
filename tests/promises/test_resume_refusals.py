"""States that no position describes are refused loudly, or resumed without what they consumed ahead; never
resumed onto repeated or lost samples.

A position is "the plan's first N batches (or samples) per rank". Workers take the plan's steps in turn, so
the workers' states of a ``StatefulDataLoader`` describe one where what they yielded together is such a
prefix: always when the DataLoader hands over the dataset's own batches (or single samples) in order, but not
when it batches an unbatched dataset's samples (``collate_fn=shardio.collate``), several at a time from one
worker, between rounds of workers: the dataset resumes those after the prefix they consumed, leaving out the
samples consumed ahead of it (each once, re-planned). A ``StatefulDataLoader`` with
``snapshot_every_n_steps > 1`` saves its workers' states as of its last snapshot: the dataset counts the
batches since, which for an unbatched dataset are an unknown number of samples. The resume harness covers
every configuration that resumes; these are the ones it leaves out because they are refused.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardio import Decoding, OptionError, ShardDataset, StateError, World, collate
from shardio.jobstate import combine, job_state, split
from shardio.ledger.quarantine import quarantine_report
from shardio.ledger.trace import Trace
from shardio.state import LoaderState

BATCH = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sample_shards import make_uneven_dataset

    directory = tmp_path_factory.mktemp("refusals") / "data"
    make_uneven_dataset(directory, (7, 5, 9), seed=4, duration_range=(0.05, 0.2))
    return str(directory)


def keys_of(batches: list[dict[str, Any]]) -> list[str]:
    return [key for batch in batches for key in batch["keys"]]


def taken(loader: Any, count: int) -> list[dict[str, Any]]:
    iterator = iter(loader)
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize("world_size", [1, 2])
def test_collated_workers_state_between_rounds_resumes_each_sample_once(
    data: str, world_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Between rounds, worker 0 has handed over one batch more than worker 1 (samples 0, 2, 4 but not 1): the
    dataset resumes after the prefix (sample 0) without the samples consumed ahead of it (2 and 4)."""
    every = [sample["key"] for sample in ShardDataset(data, seed=1)]
    for count in (1, 2, 3, 4):
        ds = ShardDataset(data, seed=1)
        loader = StatefulDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=collate)
        seen = keys_of(taken(loader, count))
        state = loader.state_dict()
        rest: list[str] = []
        caplog.clear()
        for rank in range(world_size):
            resumed = ShardDataset(data, seed=1, world=World(rank, world_size))
            resumed.load_state_dict(state)
            loaded = resumed.state_dict()
            rest += [sample["key"] for sample in resumed]
        counted = Counter(seen + rest)
        assert set(counted) == set(every)
        assert sum(counted.values()) - len(every) <= world_size - 1  # only the new plan's padding repeats
        if count % 2 == 0 and world_size == 1:  # a whole round is a prefix: the exact rest of the epoch
            assert sorted(seen) == sorted(every[: len(seen)]) and rest == every[len(seen) :]
        replanned = (
            "re-planned without them; with the same workers, the loader's own load_state_dict" in caplog.text
        )
        assert replanned == (
            count % 2 == 1 and world_size == 1
        )  # the same world: not the uninterrupted order
        if count % 2:
            with pytest.raises(StateError, match="do not describe a position.*ds.load_state_dict resumes it"):
                job_state(
                    state
                )  # the ledger reads a position: the dataset's own state after loading this one
            assert job_state(loaded).position == 0
            trace = Trace(ShardDataset(data, seed=1, world=World(0, world_size)), loaded)
            last = len(trace.segments(0)) - 1
            planned = [
                resumed.index.keys[int(i)]
                for step in trace.epoch(0)
                if step.segment == last
                for i in step.ids
            ]
            assert (
                sorted(planned) == sorted(rest) and quarantine_report(loaded) == []
            )  # consumed, not quarantined


def test_state_after_refuses_samples_a_dataloader_batched(data: str) -> None:
    ds = ShardDataset(data, seed=1)
    batch = next(iter(DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=collate)))
    assert len(batch["batch_index"]) == BATCH
    with pytest.raises(OptionError, match=f"holds {BATCH} samples a DataLoader batched.*StatefulDataLoader"):
        ds.state_after(batch)


@pytest.mark.parametrize("batched", [True, False])
def test_unbatched_state_between_snapshots_is_refused_a_batched_one_counts_the_steps(
    data: str, batched: bool
) -> None:
    options: dict[str, Any] = {"seed": 1, "batch_size": 2} if batched else {"seed": 1}
    every = (
        keys_of(list(ShardDataset(data, **options)))
        if batched
        else [sample["key"] for sample in ShardDataset(data, **options)]
    )
    ds = ShardDataset(data, **options)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, snapshot_every_n_steps=3)
    seen = taken(loader, 5)  # two steps after the snapshot at step 3
    state = loader.state_dict()
    resumed = ShardDataset(data, **options)
    if not batched:
        with pytest.raises(StateError, match="2 step\\(s\\) after its last snapshot.*unbatched"):
            resumed.load_state_dict(state)
        return
    resumed.load_state_dict(state)
    assert keys_of(seen) + keys_of(list(resumed)) == every


def worker_states(start: int, counts: list[int]) -> list[LoaderState]:
    return [
        LoaderState(
            epoch=0,
            seed=0,
            index="i",
            options={"batch_size": 2},
            world_size=1,
            start=start,
            yielded=count,
            worker=worker,
            num_workers=len(counts),
        )
        for worker, count in enumerate(counts)
    ]


@given(workers=st.integers(1, 6), start=st.integers(0, 20), total=st.integers(0, 40), steps=st.integers(0, 3))
def test_workers_that_took_the_plans_first_steps_combine_into_that_position(
    workers: int, start: int, total: int, steps: int
) -> None:
    consumed = range(start, start + total)
    counts = [sum(1 for step in consumed if (step - start) % workers == worker) for worker in range(workers)]
    assert combine(worker_states(start, counts), steps).position == start + total + steps


@given(counts=st.lists(st.integers(0, 9), min_size=2, max_size=6), start=st.integers(0, 20))
def test_workers_that_did_not_take_a_prefix_split_into_one_and_what_they_took_ahead(
    counts: list[int], start: int
) -> None:
    workers = len(counts)
    consumed = {start + worker + k * workers for worker, count in enumerate(counts) for k in range(count)}
    loaded, ahead = split(worker_states(start, counts))
    prefix = range(start, loaded.position)
    assert set(prefix) <= consumed and loaded.position not in consumed
    assert sorted(consumed - set(prefix)) == list(ahead)
    if ahead:
        with pytest.raises(StateError, match="do not describe a position"):
            combine(worker_states(start, counts))
    else:
        assert combine(worker_states(start, counts)).position == start + sum(counts)


def test_workers_states_far_apart_are_a_malformed_state_not_a_long_walk() -> None:
    with pytest.raises(
        StateError, match="malformed loader state: its workers' states are 999999999999 batches"
    ):
        split(worker_states(0, [10**12, 0]))


def test_job_state_reads_the_steps_after_a_snapshot_wherever_the_checkpoint_holds_it(tmp_path: Path) -> None:
    states = [state.to_dict() for state in worker_states(4, [2, 1])]
    loader = {
        "_snapshot": {
            "_worker_snapshots": {f"worker_{i}": {"dataset_state": s} for i, s in enumerate(states)}
        },
        "_steps_since_snapshot": 2,
        "_iterator_finished": False,
    }
    assert job_state({"model": {}, "data": {"train": loader}}).position == 4 + 3 + 2
    with pytest.raises(StateError, match="_steps_since_snapshot must be an integer"):
        job_state({**loader, "_steps_since_snapshot": "2"})
    with pytest.raises(StateError, match="2 StatefulDataLoader states in one checkpoint"):
        job_state({"train": loader, "valid": dict(loader)})  # two loaders' states (the same one twice is one)


def test_a_checkpoint_that_holds_itself_is_walked_once() -> None:
    state = worker_states(2, [3])[0].to_dict()
    checkpoint: dict[str, Any] = {"loader": state, "again": [state]}
    checkpoint["self"] = checkpoint  # pickle (torch.load) can make such a dict
    assert job_state(checkpoint).position == 2 + 3


def _worker_zero_lags(sample: dict[str, Any], rng: Any) -> dict[str, Any]:
    import time

    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.id == 0:
        time.sleep(0.3)  # worker 1's batches are ready first
    return sample


def test_trained_batches_out_of_plan_order_are_refused(data: str) -> None:
    """A DataLoader with in_order=False hands worker 1's batch over before worker 0's: a state after it would
    skip worker 0's on resume. The integrations see every batch, and refuse."""
    from shardio.integrations.accelerate import LoaderProgress
    from shardio.state import check_follows

    ds = ShardDataset(data, batch_size=2, seed=1, decoding=Decoding(transform=_worker_zero_lags))
    progress = LoaderProgress(ds)
    loader = DataLoader(ds, batch_size=None, num_workers=2, in_order=False)
    with pytest.raises(StateError, match="out of plan order \\(in_order=False\\?\\)"):
        for batch in loader:
            progress.update(batch)
    in_order = ShardDataset(data, batch_size=2, seed=1)
    progress = LoaderProgress(in_order)
    for batch in DataLoader(in_order, batch_size=None, num_workers=2):
        progress.update(batch)
    assert progress.state_dict()["start"] == len(in_order)
    state = in_order.state_after({"epoch": 0, "batch_index": 3})
    check_follows(None, state)
    check_follows(in_order.state_after({"epoch": 0, "batch_index": 2}), state)
    check_follows(
        {**state, "epoch": 1}, state
    )  # another epoch, or a resume onto another world: no order to keep
    with pytest.raises(StateError, match="batch 3 of epoch 0 was trained on right after batch 0"):
        check_follows(in_order.state_after({"epoch": 0, "batch_index": 0}), state)
