"""What the training process decides reaches every worker (issue 12, defects 1-3).

- persistent workers play what ``set_epoch`` / ``load_state_dict`` in the training process said: after a
  ``break``, after ``set_epoch(5)``, after a rollback; an iteration without ``set_epoch`` plays the next epoch
  in every configuration alike;
- spawned workers of ranks from ``init_process_group(rank=..., world_size=...)`` (no ``RANK``/``WORLD_SIZE``)
  plan as their rank (a real gloo group);
- an early ``StatefulDataLoader`` state (worker 1 not started) loads into ``ds.load_state_dict``.
"""

from __future__ import annotations

import copy
import json
import os
import time
import traceback
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import process_groups
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardio import Ordering, ShardDataset, World

SHARD_SIZES = (3, 20, 1, 14, 9)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from sample_shards import make_uneven_dataset

    directory = tmp_path_factory.mktemp("control") / "data"
    make_uneven_dataset(directory, SHARD_SIZES, seed=4)
    return str(directory)


def make(data: str, **options: Any) -> ShardDataset:
    return ShardDataset(data, batch_size=3, seed=11, ordering=Ordering(shuffle_shards=2), **options)


def epoch_keys(data: str, epoch: int, **options: Any) -> list[tuple[int, list[str]]]:
    ds = make(data, **options)
    ds.set_epoch(epoch)
    return [(epoch, list(batch["keys"])) for batch in ds]


def played(loader: Any, stop: int | None = None) -> list[tuple[int, list[str]]]:
    out = []
    for batch in loader:
        if stop is not None and len(out) == stop:
            break
        out.append((int(batch["epoch"]), list(batch["keys"])))
    return out


def persistent(ds: ShardDataset, context: str = "fork", workers: int = 2) -> DataLoader:
    return DataLoader(
        ds, batch_size=None, num_workers=workers, persistent_workers=True, multiprocessing_context=context
    )


@pytest.mark.parametrize("context,workers", [("fork", 2), ("spawn", 1)])
def test_persistent_workers_play_what_the_training_process_said(
    data: str, context: str, workers: int
) -> None:
    ds = make(data)
    loader = persistent(ds, context, workers)
    assert played(loader, stop=3) == epoch_keys(data, 0)[:3]
    ds.set_epoch(1)  # after a break: the whole of epoch 1, not the rest of epoch 0
    assert played(loader) == epoch_keys(data, 1)
    ds.set_epoch(5)
    assert played(loader) == epoch_keys(data, 5)
    rollback = ds.state_after({"epoch": 5, "batch_index": 1})
    ds.load_state_dict(rollback)
    assert played(loader) == epoch_keys(data, 5)[2:]


def test_an_iteration_without_set_epoch_plays_the_next_epoch_everywhere(data: str) -> None:
    expected = [epoch_keys(data, 0)[:2], epoch_keys(data, 1), epoch_keys(data, 2)]
    for make_loader in (
        lambda ds: ds,
        lambda ds: DataLoader(ds, batch_size=None, num_workers=2),
        lambda ds: persistent(ds),
    ):
        ds = make(data)
        loader = make_loader(ds)
        got = [played(loader, stop=2), played(loader), played(loader)]  # the first is left with a break
        assert got == expected
        assert ds.epoch == 3 and len(ds) == len(epoch_keys(data, 3))


def test_iterations_by_loaders_of_other_worker_counts_play_the_next_epoch_whole(data: str) -> None:
    """One dataset, iterated by loaders of 2, 3, 0, 1 (persistent, spawned) and 2 workers in turn, without
    ``set_epoch``: each iteration plays the next epoch, every worker the same one. Workers used to go by their
    own slot: the third of 3 workers played epoch 0 beside the others' epoch 1, and 0 workers
    after 2 replayed epoch 0."""
    ds = make(data)
    loaders = [
        DataLoader(ds, batch_size=None, num_workers=2),
        DataLoader(ds, batch_size=None, num_workers=3),
        ds,
        persistent(ds, "spawn", 1),
        DataLoader(ds, batch_size=None, num_workers=2),
    ]
    got = [
        played(loader, stop=2 if n == 1 else None) for n, loader in enumerate(loaders)
    ]  # one left with a break
    assert got == [epoch_keys(data, 0), epoch_keys(data, 1)[:2], *(epoch_keys(data, e) for e in (2, 3, 4))]
    assert ds.epoch == 5
    # loaders given a freshly seeded generator each: every iterator's workers draw the same seed
    ds = make(data)
    got = [
        played(
            DataLoader(ds, batch_size=None, num_workers=workers, generator=torch.Generator().manual_seed(0))
        )
        for workers in (2, 2, 3, 0, 2)
    ]
    assert got == [epoch_keys(data, e) for e in range(5)]


def test_the_training_processs_own_state_while_workers_play(
    data: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Once its workers finished an epoch, the next one (it was the instruction they had played: resuming it
    replayed the epoch). In the middle of one, which it cannot see: the epoch's start, with a warning, never
    the next epoch (which would skip the rest)."""
    ds = make(data)
    assert played(DataLoader(ds, batch_size=None, num_workers=2)) == epoch_keys(data, 0)
    resumed = make(data)
    resumed.load_state_dict(ds.state_dict())
    assert played(resumed) == epoch_keys(data, 1)
    ds = make(data)
    assert played(DataLoader(ds, batch_size=None, num_workers=2), stop=2) == epoch_keys(data, 0)[:2]
    caplog.clear()
    state = ds.state_dict()
    assert (state["epoch"], state["start"]) == (0, 0) and "cannot see how far" in caplog.text


def test_len_and_epoch_follow_an_iteration_that_workers_play(data: str) -> None:
    lengths = []
    for epoch in range(10):
        probe = ShardDataset(data, max_duration=0.8, seed=11)
        probe.set_epoch(epoch)
        lengths.append(len(probe))
    first = next(e for e in range(9) if lengths[e] != lengths[e + 1])  # epochs of different lengths
    ds = ShardDataset(data, max_duration=0.8, seed=11)
    ds.set_epoch(first)
    loader = DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=8)
    batches = iter(loader)
    next(batches)
    time.sleep(1.0)  # the workers run ahead; the training process is still in the epoch
    assert (ds.epoch, len(ds)) == (first, lengths[first])
    rest = list(batches)
    time.sleep(0.5)
    assert len(rest) + 1 == lengths[first] and (ds.epoch, len(ds)) == (first + 1, lengths[first + 1])


def test_a_copied_dataset_keeps_its_own_control(data: str) -> None:
    ds = make(data)
    twin = copy.deepcopy(ds)
    twin.set_epoch(4)
    assert ds.epoch == 0 and twin.epoch == 4
    assert played(persistent(twin)) == epoch_keys(data, 4)


def test_an_early_stateful_dataloader_state_loads_into_the_dataset(data: str) -> None:
    expected = epoch_keys(data, 0)
    loader = StatefulDataLoader(make(data), batch_size=None, num_workers=2)
    batches = iter(loader)
    first = [(0, list(next(batches)["keys"]))]
    state = json.loads(json.dumps(loader.state_dict()))  # worker 1 has yielded nothing yet
    del batches, loader
    resumed = make(data)
    resumed.load_state_dict(state)
    assert len(resumed) == len(expected) and resumed.state_dict()["start"] == 1
    assert first + played(DataLoader(resumed, batch_size=None, num_workers=3)) == expected


# -- spawned workers of ranks without RANK/WORLD_SIZE (a real gloo group) ------------------------------------


def rank_main(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    import torch.distributed as dist

    out = Path(config["out"])
    try:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            os.environ.pop(name, None)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=60),
        )
        ds = make(config["data"])  # nothing asks the dataset for its world before the workers start
        loader = DataLoader(
            ds, batch_size=None, num_workers=config["workers"], multiprocessing_context=config["context"]
        )
        keys = [list(batch["keys"]) for batch in loader]
        result = {"keys": keys, "len": len(ds), "padded": ds.plan().padded}
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


@pytest.mark.parametrize(
    "context,ranks,workers",
    [
        ("spawn", 2, 1),
        pytest.param(
            "forkserver",
            3,
            2,
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    not os.environ.get("SHARDIO_RESUME_EXAMPLES"),
                    reason="with the full matrix (SHARDIO_RESUME_EXAMPLES=N)",
                ),
            ],
        ),
    ],
)
def test_spawned_workers_plan_as_their_rank(
    data: str, tmp_path: Path, context: str, ranks: int, workers: int
) -> None:
    results = process_groups.run_group(
        rank_main,
        ranks,
        {"data": data, "context": context, "workers": workers},
        tmp_path / "out",
        timeout_s=120,
    )
    counts = Counter(key for result in results for batch in result["keys"] for key in batch)
    assert [len(result["keys"]) for result in results] == [results[0]["len"]] * ranks
    assert results[0]["len"] == len(epoch_keys(data, 0, world=World(0, ranks)))
    assert set(counts) == set(make(data).index.keys)
    assert counts.total() - len(counts) == results[0]["padded"]


def test_a_stateful_dataloader_state_from_another_world_is_refused_at_the_first_iteration(data: str) -> None:
    from shardio import StateError

    loader = StatefulDataLoader(make(data, world=World(0, 3)), batch_size=None, num_workers=2)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    del batches, loader
    ds = make(data, world=World(0, 2))
    ds.load_state_dict(state)  # the route for another world: fine
    assert len(ds) == len(played(DataLoader(ds, batch_size=None, num_workers=2)))
    resumed = StatefulDataLoader(make(data, world=World(0, 2)), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    with pytest.raises(StateError, match="load the loader's whole state into a fresh dataset") as caught:
        next(iter(resumed))
    traceback.clear_frames(caught.tb)  # ends the iterator's workers now (the garbage collector: 5 s for each)


def test_a_quarantine_loaded_after_persistent_workers_started_is_refused(data: str) -> None:
    from shardio import OptionError, quarantine

    ds = make(data)
    loader = persistent(ds)
    first = played(loader)
    state = ds.state_after({"epoch": 0, "batch_index": 2})
    healed = quarantine(state, make(data), keys=[first[5][1][0]])
    ds.load_state_dict(healed)  # the persistent workers plan without the quarantine: refuse, never play wrong
    with pytest.raises(OptionError, match="persistent_workers=False") as caught:
        played(loader)
    # the loader's workers end with it, here: left to the garbage collector, torch waits 5 s for each
    traceback.clear_frames(caught.tb)
    del loader, caught
    fresh = make(data)
    fresh.load_state_dict(healed)  # loaded before the workers start: it reaches them
    rest = played(persistent(fresh))
    assert first[5][1][0] not in {key for _, keys in rest for key in keys}
    assert first[:3] + rest != first and len(rest) > 0
