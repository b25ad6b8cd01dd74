"""The ledger with steps (``Batching(step_batches=K)``): a step is an optimizer step, ``K / W`` batches per
rank; ``Trace`` and ``shardio trace --step S`` name its samples, with the rank and micro-batch each went to,
and they are the same samples on any world (across a resume on another world too); ``quarantine`` takes
optimizer steps, and refuses a state inside one."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Batching, Ordering, ShardDataset, StateError, World
from shardio.ledger.quarantine import quarantine
from shardio.ledger.trace import Trace

K = 4


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trace_steps")
    make_uneven_dataset(root, [9, 30, 2, 17, 11], seed=4, duration_range=(0.05, 0.3))
    return root


def make(source: Path, world: World) -> ShardDataset:
    batching = Batching(max_duration=0.8, num_buckets=2, step_batches=K)
    return ShardDataset(source, world=world, seed=5, ordering=Ordering(shuffle_shards=2), batching=batching)


def played(source: Path, world_size: int, state: dict[str, Any] | None = None) -> dict[int, set[str]]:
    """Each optimizer step's keys over every rank, as real 2-worker DataLoaders yield them (from
    ``state``)."""
    steps: dict[int, set[str]] = {}
    for rank in range(world_size):
        ds = make(source, World(rank, world_size))
        first = 0
        if state is not None:
            ds.load_state_dict(state)
            first = Trace(ds, state).position_step()
        each = ds.accumulation
        assert each == K // world_size
        for batch in DataLoader(ds, batch_size=None, num_workers=2):
            steps.setdefault(first + batch["batch_index"] // each, set()).update(batch["keys"])
    return steps


def traced(trace: Trace, step: int) -> set[str]:
    return {key for record in trace.steps(0, step) for key in trace.row(record)["keys"]}


def test_trace_names_an_optimizer_steps_samples_on_any_world(dataset_dir: Path) -> None:
    straight = played(dataset_dir, 2)
    on_two = make(dataset_dir, World(0, 2))
    two = Trace(on_two, on_two.state_dict())
    on_four = make(dataset_dir, World(0, 4))
    four = Trace(on_four, on_four.state_dict())
    assert len(straight) > 3
    for step, keys in straight.items():
        assert traced(two, step) == traced(four, step) == keys
    records = two.steps(0, 1)
    assert [(r.rank, r.micro_batch, r.step) for r in records] == [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]
    assert [r.batch_index for r in records] == [2, 3, 2, 3]
    # a state saved on 2 ranks after 2 steps, resumed on 1 rank: its trace and its run keep the steps
    ds = make(dataset_dir, World(0, 2))
    state: dict[str, Any] = {}
    for n, batch in enumerate(DataLoader(ds, batch_size=None)):
        if n == 2 * K // 2 - 1:
            state = ds.state_after(batch)
            break
    resumed = make(dataset_dir, World(0, 1))
    resumed.load_state_dict(state)
    later = resumed.state_dict()
    after = Trace(resumed, later)
    assert after.position_step() == 2 and after.segments(0)[0] == (2, 0, 2)
    for step, keys in straight.items():
        assert traced(after, step) == keys
    assert played(dataset_dir, 1, state) == {s: k for s, k in straight.items() if s >= 2}


def test_the_cli_traces_an_optimizer_step(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    ds = make(dataset_dir, World(0, 2))
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(ds.state_dict()))
    capsys.readouterr()
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--step", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["step"], row["rank"], row["micro_batch"]) for row in rows] == [
        (2, 0, 0),
        (2, 0, 1),
        (2, 1, 0),
        (2, 1, 1),
    ]
    assert {key for row in rows for key in row["keys"]} == played(dataset_dir, 2)[2]
    # the CSV says each sample's micro-batch too, as the JSON and the text do
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--step", "2", "--csv"]) == 0
    lines = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert lines and all(line.keys() >= {"step", "rank", "micro_batch"} for line in lines)
    by_key = {key: (row["rank"], row["micro_batch"]) for row in rows for key in row["keys"]}
    assert {line["key"]: (int(line["rank"]), int(line["micro_batch"])) for line in lines} == by_key
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--step", "2"]) == 0
    assert "micro-batch 1" in capsys.readouterr().out


def test_quarantine_takes_optimizer_steps_and_refuses_a_state_inside_one(dataset_dir: Path) -> None:
    ds = make(dataset_dir, World(0, 2))
    batches = list(DataLoader(ds, batch_size=None))
    inside = ds.state_after(batches[0])  # micro-batch 1 of step 0
    with pytest.raises(StateError, match="micro-batch 1 of optimizer step 0"):
        quarantine(inside, ds, steps=(2, 3))
    at_step = ds.state_after(batches[1])
    healed = quarantine(at_step, ds, steps=(2, 3))
    left_out = traced(Trace(ds, at_step), 2)
    for rank in range(2):
        resumed = make(dataset_dir, World(rank, 2))
        resumed.load_state_dict(healed)
        assert not left_out & {key for batch in resumed for key in batch["keys"]}


@pytest.mark.parametrize("value", [0, -8, 2**40, "8", 8.0, True])
def test_a_state_with_a_hostile_step_batches_is_refused_by_the_cli(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any
) -> None:
    from shardio.cli import main

    state = make(dataset_dir, World(0, 2)).state_dict()
    state["options"]["step_batches"] = value
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["trace", str(dataset_dir), "--state", str(path), "--step", "0"]) == 2
    assert "step_batches" in capsys.readouterr().err
