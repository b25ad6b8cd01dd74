"""A real gloo job with steps (``Batching(step_batches=4)``): 2 ranks x 2 accumulated batches per optimizer
step (DDP's ``no_sync`` on all but a step's last), killed with SIGKILL after ``STOP`` steps, resumed on 1 rank
x 4 and on 4 ranks x 1 (each rank reads ``ds.accumulation``): from step ``STOP`` on, each step trains on the
straight 2-rank run's samples, sample for sample, with 2 DataLoader workers per rank."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import process_groups
import pytest

SHARD_SIZES = (1, 3, 50, 7, 120, 40)
MAX_DURATION = 2.0
K = 4
SEED = 5
STOP = 3
GROUP_TIMEOUT_S = 120.0
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "shardio")
COLLECTIVE_TIMEOUT_S = 60


def rank_main(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """One rank: its traceback under ``config["out"]`` around :func:`train`."""
    process_groups.run_rank(train, rank, world_size, port, config, stacks_after_s=GROUP_TIMEOUT_S - 10)


def train(rank: int, world_size: int, port: int, config: dict[str, Any]) -> None:
    """Train the epoch (or ``stop`` optimizer steps) with gradient accumulation; write each step's keys."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from shardio import Batching, ShardDataset

    process_groups.join_gloo(rank, world_size, port, COLLECTIVE_TIMEOUT_S)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batching = Batching(max_duration=MAX_DURATION, num_buckets=3, step_batches=K)
    dataset = ShardDataset(config["dataset"], batching=batching, seed=SEED)
    if config.get("load"):
        dataset.load_state_dict(json.loads(Path(config["load"]).read_text()))
    accumulation = dataset.accumulation
    assert accumulation == K // world_size
    steps: list[list[str]] = []
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for number, batch in enumerate(loader):
        last = (number + 1) % accumulation == 0
        features = torch.stack([batch["audio"].mean(dim=(1, 2)), batch["lengths"].float() / 8000.0], dim=1)
        with contextlib.nullcontext() if last else model.no_sync():
            model(features).pow(2).mean().backward()
        if number % accumulation == 0:
            steps.append([])
        steps[-1] += list(batch["keys"])
        if not last:
            continue
        optimizer.step()  # the gradients were all-reduced by the step's last backward
        optimizer.zero_grad()
        if config.get("stop") and len(steps) == config["stop"]:
            if rank == 0:
                saved = Path(config["save"])
                partial = saved.with_suffix(".partial")
                partial.write_text(json.dumps(dataset.state_after(batch)))
                os.replace(partial, saved)
            dist.barrier()
            Path(config["out"], f"rank{rank}.json").write_text(json.dumps({"steps": steps}))
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)  # as a preempted node: no clean-up of any kind
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps({"steps": steps}))
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()


def run_group(world_size: int, config: dict[str, Any], out: Path, exit_code: int = 0) -> list[dict[str, Any]]:
    return process_groups.run_group(
        rank_main, world_size, config, out, timeout_s=GROUP_TIMEOUT_S, preload=PRELOAD, exit_code=exit_code
    )


def steps_of(results: list[dict[str, Any]]) -> list[list[str]]:
    """Each optimizer step's keys over every rank, sorted."""
    counts = {len(result["steps"]) for result in results}
    assert len(counts) == 1, f"ranks took {counts} steps"
    return [sorted(key for result in results for key in result["steps"][s]) for s in range(counts.pop())]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sample_shards import make_uneven_dataset

    directory = tmp_path_factory.mktemp("uneven") / "data"
    make_uneven_dataset(directory, SHARD_SIZES, seed=1)
    return directory


@pytest.mark.slow
def test_a_job_killed_on_2_ranks_resumes_on_1_and_4_ranks_onto_the_same_steps(
    dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.mktemp("steps")
    straight = steps_of(run_group(2, {"dataset": str(dataset)}, base / "straight"))
    assert len(straight) > STOP + 1
    state = base / "state.json"
    stopped = run_group(
        2,
        {"dataset": str(dataset), "stop": STOP, "save": str(state)},
        base / "stopped",
        exit_code=-signal.SIGKILL,
    )
    assert steps_of(stopped) == straight[:STOP]
    for world_size in (1, 4):
        resumed = run_group(
            world_size, {"dataset": str(dataset), "load": str(state)}, base / f"on{world_size}"
        )
        assert steps_of(resumed) == straight[STOP:], f"the resume on {world_size} ranks left the steps"
