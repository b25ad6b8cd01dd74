"""The public API is pinned: adding or removing a public name is a deliberate change to this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shardio
from shardio import OptionError, ShardioError, StateError, World
from shardio.jobstate import combine, find_states
from shardio.planning.plan import Segment
from shardio.state import LoaderState

PUBLIC = {
    "__version__",
    "ShardDataset",
    "MixedDataset",
    "ShardLoader",
    "collate",
    "Mix",
    "EpochSize",
    "Transform",
    "ShardWriter",
    "Index",
    "ShardInfo",
    "World",
    "Batching",
    "Ordering",
    "Decoding",
    "Reading",
    "Segment",
    "EpochPlan",
    "plan_epoch",
    "Planner",
    "LoaderState",
    "RetryPolicy",
    "ShardioError",
    "OptionError",
    "InputError",
    "InputProblem",
    "FormatError",
    "IntegrityError",
    "ReadError",
    "DecodeError",
    "OutputError",
    "StateError",
    "RangeNotSupported",
    "ShardChanged",
    "Trace",
    "quarantine",
    "quarantine_report",
    "remix",
    "remix_report",
}


def test_public_names_are_pinned() -> None:
    assert set(shardio.__all__) == PUBLIC
    for name in shardio.__all__:
        assert getattr(shardio, name) is not None
        if name != "__version__" and not name.startswith("Transform"):
            assert getattr(shardio, name).__doc__, f"{name} has no docstring"


def test_error_tree() -> None:
    for name in (
        "OptionError",
        "InputError",
        "FormatError",
        "ReadError",
        "DecodeError",
        "OutputError",
        "StateError",
    ):
        assert issubclass(getattr(shardio, name), ShardioError)
    assert issubclass(shardio.IntegrityError, shardio.FormatError)
    assert issubclass(shardio.RangeNotSupported, shardio.ReadError)
    assert issubclass(shardio.ShardChanged, shardio.ReadError)
    assert issubclass(OptionError, ValueError)


def test_world_explicit_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert World.detect() == World(rank=2, world_size=4)
    assert World.detect(rank=1, world_size=3) == World(rank=1, world_size=3)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(OptionError, match="RANK"):
        World.detect()
    with pytest.raises(OptionError):
        World(rank=3, world_size=3)


def test_world_from_torch_distributed() -> None:
    code = (
        "import torch.distributed as dist; from shardio import World;"
        "dist.init_process_group('gloo', rank=0, world_size=1); print(World.detect())"
    )
    # the environment says rank 0 of 1 too; the group (not the environment) must be what is read
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "World(rank=0, world_size=1, worker=0, num_workers=1, ranks_per_node=1)" in out.stdout


def test_ranks_per_node_from_torchruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert World.detect() == World(3, 4, ranks_per_node=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(OptionError, match="LOCAL_WORLD_SIZE"):
        World.detect()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert World.detect().ranks_per_node == 1
    with pytest.raises(OptionError, match="ranks_per_node"):
        World(0, 2, ranks_per_node=0)


def _state(**fields: object) -> LoaderState:
    base = dict(epoch=2, seed=5, index="abc", options={"batch_size": 4}, world_size=2)
    return LoaderState(**{**base, **fields})  # type: ignore[arg-type]


def test_state_is_small_json_and_round_trips() -> None:
    state = _state(history=(Segment(4, 10),), start=3, yielded=2)
    text = json.dumps(state.to_dict())
    assert len(text) < 600
    assert LoaderState.from_dict(json.loads(text)) == state
    assert state.position == 5


def test_worker_states_combine_into_the_job_position() -> None:
    workers = [_state(start=4, yielded=y, worker=w, num_workers=3) for w, y in enumerate((3, 2, 2))]
    nested = {
        "_snapshot": {
            "_worker_snapshots": {
                f"worker_{w}": {"dataset_state": s.to_dict()} for w, s in enumerate(workers)
            }
        }
    }
    job = combine(find_states(nested))
    assert job.position == 4 + 7 and job.num_workers == 1
    with pytest.raises(StateError, match="worker"):
        combine(find_states(nested)[:2])
    with pytest.raises(StateError):
        _ = workers[0].position


def test_bad_states_are_state_errors() -> None:
    good = _state().to_dict()
    with pytest.raises(StateError, match="version"):
        LoaderState.from_dict({**good, "version": 99})
    with pytest.raises(StateError, match="malformed"):
        LoaderState.from_dict({k: v for k, v in good.items() if k != "epoch"})
    with pytest.raises(StateError, match="field start must be an integer >= 0"):
        LoaderState.from_dict({**good, "start": -1})


def test_steps_are_stated_once_and_read_from_the_dataset_and_the_state() -> None:
    from shardio import Batching, ShardDataset

    assert Batching(step_batches=8).accumulation(2) == 4 and Batching().accumulation(2) is None
    assert isinstance(ShardDataset.accumulation, property)
    options = {"step_batches": 8}
    state = _state(options=options, world_size=2, history=(Segment(4, 6),), start=5)
    assert state.step == (3 + 1, 1)  # 6 batches on 4 ranks (A=2): 3 steps; 5 on 2 (A=4): 1 step and 1
    assert _state(world_size=2, start=5).step is None
    assert _state(options={"step_batches": 8}, world_size=3).step is None
