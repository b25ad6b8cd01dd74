"""A real multi-process ``torch.distributed`` (gloo) job over shards of very uneven sizes.

Each rank is a separate process (forked from a ``forkserver`` that imported torch once) with the
environment ``torchrun`` gives (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), training a tiny
DDP model (one all-reduce per step) on ``ShardDataset`` through a plain
``DataLoader(batch_size=None, num_workers=1)``. A rank with one batch more than another would block in that
all-reduce: every group runs under a timeout, so a hang fails.

- uninterrupted: every rank yields the same number of batches, and together they cover every sample;
- interrupted: after ``STOP`` steps rank 0 saves ``state_after(batch)`` and every rank is killed with SIGKILL
  mid-epoch (its DataLoader worker alive, its process group never destroyed); a new group of 3 loads rank
  0's state on every rank: each rank's keys continue exactly;
- elastic: the same state resumed by 2 ranks consumes every sample not consumed before the stop exactly
  once (plus the padded repeats that the 2-rank plan reports).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import process_groups
import pytest

SHARD_SIZES = (1, 3, 50, 7, 120)
MAX_DURATION = 2.0
SEED = 5
STOP = 4
GROUP_TIMEOUT_S = 90.0
"""Wall-clock limit for one group of rank processes (a healthy group takes a few seconds)."""
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "shardio")
"""What the forkserver imports once, for every rank."""
COLLECTIVE_TIMEOUT_S = 60
"""The process group's own timeout: a rank stuck in an all-reduce raises after this long."""


# -- one rank (a process of its own) -------------------------------------------------------------


def rank_main(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """One rank: record its exit status and any traceback under ``config["out"]`` around :func:`train`."""
    process_groups.run_rank(train, rank, world_size, port, config, stacks_after_s=GROUP_TIMEOUT_S - 10)


def train(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """Train on the dataset for an epoch (or ``stop`` steps) and write what this rank saw as JSON."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from shardio import ShardDataset

    process_groups.join_gloo(rank, world_size, port, COLLECTIVE_TIMEOUT_S)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = ShardDataset(config["dataset"], max_duration=MAX_DURATION, seed=SEED)
    if config.get("load"):
        dataset.load_state_dict(json.loads(Path(config["load"]).read_text()))
    planned = len(dataset)
    keys: list[list[str]] = []
    batch_indices: list[int] = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=1):
        features = torch.stack([batch["audio"].mean(dim=(1, 2)), batch["lengths"].float() / 8000.0], dim=1)
        loss = model(features).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients: every rank must take part in every step
        optimizer.step()
        keys.append(list(batch["keys"]))
        batch_indices.append(int(batch["batch_index"]))
        if config.get("stop") and len(keys) == config["stop"]:
            if rank == 0:
                saved = Path(config["save"])
                partial = saved.with_suffix(".partial")
                partial.write_text(json.dumps(dataset.state_after(batch)))
                os.replace(partial, saved)
            if config.get("kill"):
                dist.barrier()  # every rank is past its last all-reduce: none is killed inside one
                result = {"rank": rank, "keys": keys, "batch_indices": batch_indices}
                Path(config["out"], f"rank{rank}.json").write_text(json.dumps(result))
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)  # as a preempted node: no clean-up of any kind
            break
    steps = torch.tensor([len(keys)])
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(everyone, steps)
    result = {
        "rank": rank,
        "world_size": world_size,
        "planned": planned,
        "keys": keys,
        "batch_indices": batch_indices,
        "steps_everywhere": [int(t) for t in everyone],
    }
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(result))
    del model, optimizer  # DDP's reducer must go while its process group lives: freed after, it can hang
    dist.barrier()
    dist.destroy_process_group()


# -- the launcher (in the test process) ----------------------------------------------------------


def run_group(world_size: int, config: dict[str, Any], out: Path, exit_code: int = 0) -> list[dict[str, Any]]:
    """Run ``world_size`` ranks of :func:`rank_main`; each rank's result (see :mod:`process_groups`)."""
    return process_groups.run_group(
        rank_main, world_size, config, out, timeout_s=GROUP_TIMEOUT_S, preload=PRELOAD, exit_code=exit_code
    )


def flat(keys: list[list[str]]) -> list[str]:
    """The keys of a list of batches, in order."""
    return [key for batch in keys for key in batch]


# -- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uneven dataset on disk."""
    from sample_shards import make_uneven_dataset

    directory = tmp_path_factory.mktemp("uneven") / "data"
    make_uneven_dataset(directory, SHARD_SIZES, seed=1)
    return directory


@pytest.fixture(scope="module")
def uninterrupted(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results of a whole epoch with 3 ranks."""
    return run_group(3, {"dataset": str(dataset)}, tmp_path_factory.mktemp("full") / "out")


@pytest.fixture(scope="module")
def interrupted(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    """Each rank's results of 3 ranks killed after ``STOP`` steps, and rank 0's saved state."""
    base = tmp_path_factory.mktemp("stopped")
    state = base / "state.json"
    results = run_group(
        3,
        {"dataset": str(dataset), "stop": STOP, "save": str(state), "kill": True},
        base / "out",
        exit_code=-signal.SIGKILL,
    )
    assert state.exists(), "rank 0 did not save its state"
    return results, state


def test_every_rank_yields_the_same_number_of_batches(
    dataset: Path, uninterrupted: list[dict[str, Any]]
) -> None:
    from shardio import Index, plan_epoch
    from shardio.planning.plan import Batching

    counts = [len(result["keys"]) for result in uninterrupted]
    assert counts[0] > STOP and counts == [counts[0]] * 3
    assert all(
        result["planned"] == counts[0] and result["steps_everywhere"] == counts for result in uninterrupted
    )
    assert all(result["batch_indices"] == list(range(counts[0])) for result in uninterrupted)
    index = Index.load(dataset)
    seen = Counter(key for result in uninterrupted for key in flat(result["keys"]))
    assert set(seen) == set(index.keys), "a sample was never yielded"
    plan = plan_epoch(
        index.shard_ids,
        index.durations,
        len(index.shards),
        seed=SEED,
        epoch=0,
        world_size=3,
        batching=Batching(max_duration=MAX_DURATION),
    )
    assert sum(seen.values()) - len(seen) == plan.padded
    durations = dict(zip(index.keys, index.durations.tolist()))
    for result in uninterrupted:
        for batch in result["keys"]:
            assert len(batch) * max(durations[key] for key in batch) <= MAX_DURATION * (1 + 1e-9)


@pytest.mark.slow
def test_resume_on_a_new_group_continues_exactly(
    dataset: Path,
    uninterrupted: list[dict[str, Any]],
    interrupted: tuple[list[dict[str, Any]], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    stopped, state = interrupted
    assert json.loads(state.read_text())["start"] == STOP
    resumed = run_group(
        3, {"dataset": str(dataset), "load": str(state)}, tmp_path_factory.mktemp("resumed") / "out"
    )
    for before, after, whole in zip(stopped, resumed, uninterrupted):
        assert before["keys"] == whole["keys"][:STOP]
        assert after["batch_indices"] == list(range(STOP, len(whole["keys"])))
        assert before["keys"] + after["keys"] == whole["keys"], f"rank {whole['rank']} diverged after resume"


@pytest.mark.slow
def test_elastic_resume_on_fewer_ranks_consumes_the_rest_once(
    dataset: Path, interrupted: tuple[list[dict[str, Any]], Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from shardio import Index, Segment, plan_epoch
    from shardio.planning.plan import Batching

    stopped, state = interrupted
    resumed = run_group(
        2, {"dataset": str(dataset), "load": str(state)}, tmp_path_factory.mktemp("elastic") / "out"
    )
    counts = [len(result["keys"]) for result in resumed]
    assert counts[0] > 0 and counts == [counts[0]] * 2
    assert all(result["steps_everywhere"] == counts for result in resumed)
    before = Counter(key for result in stopped for key in flat(result["keys"]))
    after = Counter(key for result in resumed for key in flat(result["keys"]))
    index = Index.load(dataset)
    assert not set(before) & set(after), "a sample consumed before the stop was consumed again"
    assert set(before) | set(after) == set(index.keys), "a sample was lost in the elastic resume"
    assert sum(before.values()) == len(before), "repeats before the last round"
    plan = plan_epoch(
        index.shard_ids,
        index.durations,
        len(index.shards),
        seed=SEED,
        epoch=0,
        world_size=2,
        batching=Batching(max_duration=MAX_DURATION),
        history=(Segment(3, STOP),),
    )
    assert plan.num_batches == counts[0]
    assert sum(after.values()) - len(after) == plan.padded, "repeats beyond the plan's reported padding"
    from shardio import ShardDataset, Trace, World

    # the ledger names what each rank of both gloo groups trained on, step for step (the steps count on)
    elastic = ShardDataset(dataset, max_duration=MAX_DURATION, seed=SEED, world=World(0, 2))
    elastic.load_state_dict(json.loads(state.read_text()))
    trace = Trace(elastic, elastic.state_dict())
    for result in [*stopped, *resumed]:
        first = 0 if result in stopped else STOP
        rows = trace.steps(0, first, first + len(result["keys"]), rank=result["rank"])
        assert [trace.row(row)["keys"] for row in rows] == result["keys"]


def test_trace_names_every_ranks_batches_of_a_gloo_run(
    dataset: Path, uninterrupted: list[dict[str, Any]]
) -> None:
    from shardio import ShardDataset, Trace, World

    ds = ShardDataset(dataset, max_duration=MAX_DURATION, seed=SEED, world=World(0, 3))
    trace = Trace(ds, ds.state_dict())
    for result in uninterrupted:
        assert [trace.row(r)["keys"] for r in trace.epoch(0) if r.rank == result["rank"]] == result["keys"]
