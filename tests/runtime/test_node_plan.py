"""The ranks of a node plan an epoch once: one process plans and writes every rank's share; the others map."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sample_shards import make_uneven_dataset
from test_plan_lock import count_plans, epochs_on_disk, planned

import shardio.planning.planner
from shardio import ShardDataset, World
from shardio.runtime import nodeplan, planfiles

WORLD_SIZE = 3


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        shardio.planning.planner, "plan_epoch", shardio.planning.planner.plan_epoch
    )  # restored afterwards
    return make_uneven_dataset(tmp_path / "ds", [13, 4, 9, 6, 11], duration_range=(0.01, 0.02)).root


def dataset(root: str, rank: int, world_size: int = WORLD_SIZE) -> ShardDataset:
    return ShardDataset(root, batch_size=3, seed=5, world=World(rank=rank, world_size=world_size))


def keys(batches: Any) -> list[list[str]]:
    return [list(batch["keys"]) for batch in batches]


def in_memory(
    root: str, rank: int, state: dict[str, Any] | None = None, world_size: int = WORLD_SIZE, epoch: int = 0
) -> list[list[str]]:
    """Rank ``rank``'s batches (from ``state``'s position, else epoch ``epoch``'s start), from the whole plan
    computed in this process (``ShardDataset.plan`` writes no file)."""
    ds = dataset(root, rank, world_size)
    if state is None:
        plan, start = ds.plan(epoch), 0
    else:
        ds.load_state_dict(state)
        plan, start = ds.plan(), ds.state_dict()["start"]
    return [[ds.index.keys[int(i)] for i in plan.batch(rank, j)] for j in range(start, plan.num_batches)]


def rank_process(
    root: str, cache: str, rank: int, log: str, barrier: Any, results: Any, state: dict[str, Any]
) -> None:
    """One rank's training process (started by spawn): ``set_epoch(0)`` with the other ranks at once, then a
    fresh dataset that loads ``state``; counts each whole-epoch planning in ``log``. The node cache is set
    here: a forkserver started by an earlier test would hand its own environment on."""
    os.environ["SHARDIO_CACHE_DIR"] = cache
    count_plans(Path(log))
    ds = dataset(root, rank)
    barrier.wait()
    ds.set_epoch(0)
    first = keys(ds)
    planned_before = len(planned(Path(log)))
    resumed = dataset(root, rank)
    resumed.load_state_dict(state)
    results.put((rank, first, len(planned(Path(log))) - planned_before, keys(resumed)))


@pytest.mark.parametrize("start_method", [pytest.param("spawn", marks=pytest.mark.slow), "forkserver"])
def test_the_ranks_of_a_node_plan_an_epoch_once(root: str, tmp_path: Path, start_method: str) -> None:
    state = dataset(root, 0).state_after({"epoch": 0, "batch_index": 1})
    context = multiprocessing.get_context(start_method)
    barrier, results = context.Barrier(WORLD_SIZE), context.Queue()
    log = tmp_path / "planned"
    processes = [
        context.Process(
            target=rank_process,
            args=(root, os.environ["SHARDIO_CACHE_DIR"], rank, str(log), barrier, results, state),
        )
        for rank in range(WORLD_SIZE)
    ]
    for process in processes:
        process.start()
    outcomes = sorted(results.get(timeout=240) for _ in processes)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert len(planned(log)) == 1  # one whole-epoch planning on the node, for every rank
    for rank, first, planned_by_load, resumed in outcomes:
        assert first == in_memory(root, rank)
        assert planned_by_load == 0  # load_state_dict checked the position on the mapped share
        assert resumed == in_memory(root, rank, state)
    assert epochs_on_disk(tmp_path / "cache") == [0]


@pytest.mark.parametrize("damage", ["truncated ids", "starts of another shape", "offsets of another shape"])
def test_a_damaged_node_plan_is_not_used(
    root: str, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected = [in_memory(root, rank) for rank in range(WORLD_SIZE)]
    dataset(root, 0).set_epoch(0)
    (name,) = os.listdir(tmp_path / "cache" / "plans")
    path = planfiles.path(name)
    if damage == "truncated ids":
        os.truncate(os.path.join(path, "ids.npy"), os.path.getsize(os.path.join(path, "ids.npy")) - 5)
    elif damage == "starts of another shape":
        np.save(os.path.join(path, "starts.npy"), np.load(os.path.join(path, "starts.npy"))[1:])
    else:
        np.save(os.path.join(path, "offsets.npy"), np.load(os.path.join(path, "offsets.npy"))[:2])
    log = tmp_path / "planned"
    count_plans(log)
    for rank in (2, 0, 1):
        ds = dataset(root, rank)
        with caplog.at_level(logging.WARNING, logger="shardio.runtime.nodeplan"):
            ds.set_epoch(0)
        assert keys(ds) == expected[rank]
    assert "planning the epoch in memory" in caplog.text
    assert len(planned(log)) == 1  # the first rank planned by itself and replaced the plan; the others map it
    assert epochs_on_disk(tmp_path / "cache") == [0]


def test_a_job_keeps_the_plans_of_its_last_two_epochs(root: str, tmp_path: Path) -> None:
    ds = dataset(root, 1)
    for epoch in range(5):
        ds.set_epoch(epoch)
        assert keys(ds) == in_memory(root, 1, epoch=epoch)
    assert epochs_on_disk(tmp_path / "cache") == [3, 4]  # no lock file either
    other = ShardDataset(root, batch_size=4, seed=5, world=World(rank=0, world_size=WORLD_SIZE))
    other.set_epoch(7)  # another job (other options): its own name, and it leaves this job's plans alone
    assert epochs_on_disk(tmp_path / "cache") == [3, 4, 7]


def test_an_elastic_resume_maps_the_new_worlds_node_plan(root: str, tmp_path: Path) -> None:
    state = dataset(root, 2).state_after({"epoch": 1, "batch_index": 2})  # saved at world 3
    expected = [in_memory(root, rank, state, world_size=2) for rank in range(2)]
    shutil.rmtree(tmp_path / "cache" / "plans")  # what their load_state_dict wrote
    log = tmp_path / "planned"
    count_plans(log)
    for rank in range(2):
        resumed = dataset(root, rank, world_size=2)
        resumed.load_state_dict(state)
        assert keys(resumed) == expected[rank]
    assert len(planned(log)) == 1  # rank 0 planned the world-2 segment; rank 1 mapped it
    assert epochs_on_disk(tmp_path / "cache") == [1]


def test_one_rank_without_workers_plans_in_memory(root: str, tmp_path: Path) -> None:
    ds = dataset(root, 0, world_size=1)
    ds.set_epoch(0)
    assert keys(ds) == in_memory(root, 0, world_size=1)
    assert not os.path.exists(tmp_path / "cache" / "plans")


@pytest.mark.slow
def test_a_mapped_share_reaches_spawned_workers_as_its_plans_name(root: str, tmp_path: Path) -> None:
    """Pickled for a spawn/forkserver worker (torch's ForkingPickler), a share mapped from the node plan is a
    reference to its files, not its ids nor a shared-memory copy; where the files are
    gone the worker plans."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers its reductions of tensors with ForkingPickler)
    from torch.utils.data import DataLoader

    from shardio.runtime.nodeplan import MappedRankPlan

    ds = dataset(root, 1)
    ds.set_epoch(0)
    (share,) = ds._epochs.shares.values()
    assert isinstance(share, MappedRankPlan)
    sent = bytes(ForkingPickler.dumps(share))
    assert len(sent) < 400 and b"torch" not in sent  # a name, not the ids, nor a shared-memory handle
    received = pickle.loads(bytes(ForkingPickler.dumps(ds)))
    (again,) = received._epochs.shares.values()
    assert isinstance(again, MappedRankPlan) and np.array_equal(again.ids, share.ids)

    context = multiprocessing.get_context("spawn")
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert keys(loader) == in_memory(root, 1)  # each spawned worker mapped the node plan

    expected = in_memory(root, 1)
    ds.set_epoch(0)  # the workers have played epoch 0: without this, the next iteration plays epoch 1
    pickled = bytes(ForkingPickler.dumps(ds))
    shutil.rmtree(tmp_path / "cache" / "plans")  # gone before the worker maps it: it obtains the plan again
    log = tmp_path / "planned"
    count_plans(log)
    gone = pickle.loads(pickled)
    assert gone._epochs.shares == {}
    assert keys(gone) == expected
    assert len(planned(log)) == 1


def test_an_index_made_in_memory_is_planned_in_memory(root: str, tmp_path: Path) -> None:
    """Plan files are named by the index fingerprint: an index made in memory, whose fingerprint was given
    rather than computed from its content, never writes or maps one (two such indexes may
    share a fingerprint)."""
    from shardio import Index

    loaded = Index.load(root)
    assert loaded.fingerprinted

    def in_memory_copy(scale: int) -> Index:
        columns = {name: np.array(column) for name, column in loaded.columns.items()}
        columns["num_frames"] = columns["num_frames"] * np.uint32(scale)
        return Index(
            root=loaded.root,
            shards=list(loaded.shards),
            formats=list(loaded.formats),
            columns=columns,
            fingerprint=loaded.fingerprint,
            _keys=list(loaded.keys),
        )

    for scale in (1, 7):  # the same given fingerprint, other durations: other plans
        index = in_memory_copy(scale)
        assert not index.fingerprinted
        ds = ShardDataset(index, max_duration=0.5, seed=5, world=World(rank=1, world_size=WORLD_SIZE))
        ds.set_epoch(0)
        plan = ds.plan(0)
        assert keys(ds) == [[index.keys[int(i)] for i in plan.batch(1, j)] for j in range(plan.num_batches)]
    assert not os.path.exists(tmp_path / "cache" / "plans")
    (tmp_path / "saved").mkdir()
    index.save(str(tmp_path / "saved"))
    assert index.fingerprinted and index.fingerprint != loaded.fingerprint


@pytest.mark.parametrize(
    "array",
    [
        np.arange(5, dtype=np.int64),
        np.arange(12, dtype=np.int64).reshape(2, 6),
        np.arange(7, dtype=np.int32),
        np.array([True, False, True]),
        np.zeros(0, np.int32),
    ],
)
def test_a_plan_file_reads_back_into_private_memory(tmp_path: Path, array: np.ndarray) -> None:
    """The headers nodeplan writes (np.save's for these dtypes and shapes), read into an array of its own."""
    path = str(tmp_path / "a.npy")
    np.save(path, array)
    fd = os.open(path, os.O_RDONLY)
    try:
        dtype, shape = nodeplan._npy_header(fd, path)
        read = nodeplan._array(str(tmp_path), "a", (fd, dtype, shape), 0, None).reshape(shape)
    finally:
        os.close(fd)
    owner = read if read.base is None else read.base
    assert read.dtype == array.dtype and np.array_equal(read, array) and owner.flags.owndata
    assert not read.flags.writeable


@pytest.mark.parametrize(
    "array", [np.arange(3, dtype=">i8"), np.arange(4.0), np.arange(24, dtype=np.int64).reshape(2, 3, 4)]
)
def test_a_plan_file_of_another_type_or_shape_is_refused(tmp_path: Path, array: np.ndarray) -> None:
    path = str(tmp_path / "a.npy")
    np.save(path, array)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(nodeplan._Doubt, match="not a header of a node plan file"):
            nodeplan._npy_header(fd, path)
    finally:
        os.close(fd)


def test_a_truncated_plan_file_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "a.npy")
    np.save(path, np.arange(100, dtype=np.int64))
    os.truncate(path, 128 + 8 * 99)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(nodeplan._Doubt, match="not what its header says"):
            nodeplan._npy_header(fd, path)
    finally:
        os.close(fd)
