"""Ordering(node_stable=True) through the one resume harness: every node plays the same part of the corpus
every epoch, and every promise holds: exact resume on the same world (workers 0 and 2, a plain DataLoader,
StatefulDataLoader, ShardLoader), every rank the same number of batches, and on another world (more nodes,
fewer, or as many ranks on other nodes) the rest of the epoch exactly once, the parts dealt again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import process_groups
import pytest
from resume_harness import (
    Case,
    case_config,
    check_same_world,
    check_world_change,
    length,
    records_of,
    uninterrupted,
    write_corpora,
)
from test_resume_matrix import GROUP_TIMEOUT_S, group

from shardio import (
    Batching,
    EpochSize,
    MixedDataset,
    OptionError,
    Ordering,
    ShardDataset,
    StateError,
    World,
)

NODES = Case(node_stable=True)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.mark.parametrize(
    "loader, workers, batching",
    [
        ("in_process", 0, "duration"),
        ("state_after", 2, "bucketed"),
        ("stateful", 2, "fixed"),
        ("shardio", 2, "duration"),
    ],
)
def test_each_rank_of_two_nodes_resumes_exactly(
    dirs: dict[str, str], loader: str, workers: int, batching: str
) -> None:
    case = replace(NODES, loader=loader, workers=workers, batching=batching)
    n = length(case, dirs, World(0, 2))
    for rank in range(2):
        check_same_world(replace(case, stops=(1, n // 2, n + 1)), dirs, World(rank, 2))


def test_each_node_with_its_decoded_cache_resumes_exactly(dirs: dict[str, str]) -> None:
    case = replace(NODES, workers=2, persistent=True, decoded_cache=True)
    n = length(case, dirs, World(0, 2))
    for rank in range(2):
        check_same_world(replace(case, stops=(1, n // 2, n + 2)), dirs, World(rank, 2))


def test_two_nodes_of_two_ranks_resume_exactly(dirs: dict[str, str]) -> None:
    case = replace(NODES, batching="bucketed", loader="stateful", workers=2)
    world = World(0, 4, ranks_per_node=2)
    n = length(case, dirs, world)
    for rank in range(4):
        check_same_world(replace(case, stops=(2, n + 1)), dirs, World(rank, 4, ranks_per_node=2))


@pytest.mark.parametrize("launcher, per_node", [("torchrun", 2), ("forkserver", 1)])
def test_a_process_group_finds_its_nodes(
    dirs: dict[str, str], tmp_path: Path, launcher: str, per_node: int
) -> None:
    """torchrun's ranks read LOCAL_WORLD_SIZE (2 ranks on one node: the global plan); ranks that only have
    RANK/WORLD_SIZE are a node each. Stopped and resumed, each rank plays that world's plan."""
    case = replace(NODES, workers=2, persistent=True, epochs=2)
    n = length(case, dirs, World(0, 2, ranks_per_node=per_node))
    case = replace(case, stops=(n // 2, n + 1))
    config = {"case": case_config(case), "dirs": dirs, "ranks": "env", "whole": True}
    for result in group(launcher, 2, config, tmp_path / "out"):
        rank = result["rank"]
        assert records_of(result) == uninterrupted(case, dirs, World(rank, 2, ranks_per_node=per_node))
        assert records_of(result) != uninterrupted(case, dirs, World(rank, 2, ranks_per_node=3 - per_node))


def test_two_torchrun_nodes_of_two_ranks(dirs: dict[str, str], tmp_path: Path) -> None:
    """Two torchrun agents (``--nnodes=2``, 2 ranks each, on loopback): torchrun gives node ``k`` ranks
    ``2k`` and ``2k + 1`` and ``LOCAL_WORLD_SIZE=2``, so each rank plays the plan of 2 nodes of 2 ranks,
    stopped and resumed."""
    case = replace(NODES, loader="in_process", batching="bucketed", epochs=2)
    world = World(0, 4, ranks_per_node=2)
    n = length(case, dirs, world)
    case = replace(case, stops=(n // 2, n + 1))
    out = tmp_path / "out"
    out.mkdir()
    config = {"case": case_config(case), "dirs": dirs, "ranks": "env", "whole": True, "out": str(out)}
    (out / "config.json").write_text(json.dumps(config))
    script = Path(__file__).parents[1] / "resume_rank.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).parents[1]), str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")]
    )
    port = process_groups.free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=2",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(script),
                str(out / "config.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(2)
    ]
    try:
        outputs = [agent.communicate(timeout=GROUP_TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(timeout=10)
    assert all(agent.returncode == 0 for agent in agents), "\n".join(o[-3000:] for o in outputs)
    for rank in range(4):
        result = json.loads((out / f"rank{rank}.json").read_text())
        assert records_of(result) == uninterrupted(case, dirs, World(rank, 4, ranks_per_node=2))
    # what it would have played, were each rank a node of its own (LOCAL_WORLD_SIZE not read)
    assert records_of(result) != uninterrupted(case, dirs, World(3, 4, ranks_per_node=1))


@pytest.mark.parametrize("batching", ["fixed", "bucketed"])
def test_a_node_plays_its_part_every_epoch_in_another_order(dirs: dict[str, str], batching: str) -> None:
    case = replace(NODES, batching=batching, epochs=3)
    every = set(ShardDataset(dirs["main"]).index.keys)
    by_epoch: list[list[list[str]]] = [[] for _ in range(3)]  # [epoch][node]: its keys in play order
    for rank in range(2):
        records = uninterrupted(case, dirs, World(rank, 2))
        for epoch in range(3):
            by_epoch[epoch].append([key for e, keys, _ in records if e == epoch for key in keys])
    for epoch in range(3):
        parts = [set(keys) for keys in by_epoch[epoch]]
        assert parts[0] | parts[1] == every and not parts[0] & parts[1]  # the corpus, dealt to the nodes
        assert parts == [set(keys) for keys in by_epoch[0]]  # the same parts every epoch
    assert by_epoch[0] != by_epoch[1]  # in another order


@pytest.mark.parametrize(
    "old, new, per_node, loader",
    [
        (2, 3, (1, 1), "state_after"),
        (3, 2, (1, 1), "stateful"),
        (4, 4, (2, 1), "state_after"),  # as many ranks, on other nodes: the parts are dealt again
        (2, 1, (1, 1), "shardio"),  # one node: the rest in the global order
    ],
)
def test_another_world_plays_the_rest_of_the_epoch_once(
    dirs: dict[str, str], old: int, new: int, per_node: tuple[int, int], loader: str
) -> None:
    case = replace(NODES, loader=loader, workers=1, epochs=1, ds_load=True)
    stop = length(case, dirs, World(0, old, ranks_per_node=per_node[0])) // 2
    check_world_change(case, dirs, old, new, stop, per_node)


def test_a_state_records_the_nodes_and_a_dataset_without_node_stable_refuses_it(
    dirs: dict[str, str],
) -> None:
    ordering = Ordering(node_stable=True)
    ds = ShardDataset(dirs["main"], batch_size=2, ordering=ordering, world=World(1, 4, ranks_per_node=2))
    state = json.loads(json.dumps(ds.state_dict()))
    assert state["nodes"] == 2 and state["options"]["node_stable"] is True
    one = ShardDataset(dirs["main"], batch_size=2, ordering=ordering, world=World(0, 4, ranks_per_node=4))
    assert "nodes" not in one.state_dict()  # one node: recorded as every state before node_stable
    plain = ShardDataset(dirs["main"], batch_size=2, world=World(1, 4, ranks_per_node=2))
    assert "nodes" not in plain.state_dict() and "node_stable" not in plain.state_dict()["options"]
    with pytest.raises(StateError, match="node_stable"):
        plain.load_state_dict(state)
    forged = {**state, "options": plain.state_dict()["options"]}
    with pytest.raises(StateError, match="node_stable"):
        plain.load_state_dict(forged)


def test_refusals_name_both_options(dirs: dict[str, str]) -> None:
    ordering = Ordering(node_stable=True)
    with pytest.raises(OptionError, match="step_batches"):
        ShardDataset(dirs["main"], batching=Batching(batch_size=2, step_batches=4), ordering=ordering)
    with pytest.raises(OptionError, match="mix"):
        MixedDataset(dirs, {"main": 0.5, "extra": 0.5}, EpochSize(primary="main"), ordering=ordering)
    ds = ShardDataset(dirs["main"], batch_size=2, ordering=ordering, world=World(0, 3, ranks_per_node=2))
    with pytest.raises(OptionError, match="2 ranks per node"):
        ds.plan()
