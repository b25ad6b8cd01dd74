"""The resume matrix of issue 12, through the one harness in ``resume_harness.py``.

A fixed smoke subset runs in the fast tier (its costliest cases, marked ``slow``, in the slow tier). The full
matrix is drawn by hypothesis under the ``slow`` marker and only when asked for, with the number of examples::

    SHARDIO_RESUME_EXAMPLES=300 python -m pytest -m slow tests/promises/test_resume_matrix.py

Multi-rank cases run real gloo groups: forked from a forkserver (``tests/process_groups.py``), started by
``torch.multiprocessing.spawn`` and by ``torchrun``, each under a wall-clock limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import process_groups
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resume_harness import (
    BATCHINGS,
    LOADERS,
    Case,
    case_config,
    check_elastic,
    check_same_world,
    check_world_change,
    length,
    rank_entry,
    records_of,
    resumed_dataset,
    spawn_entry,
    uninterrupted,
    write_corpora,
)

from shardio import StateError, World

GROUP_TIMEOUT_S = 120.0
EXAMPLES = int(os.environ.get("SHARDIO_RESUME_EXAMPLES", "0"))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_corpora(tmp_path_factory.mktemp("corpora"))


# -- the smoke subset (always) -------------------------------------------------------------------


def test_persistent_workers_stopped_twice_in_an_epoch_and_rolled_back(dirs: dict[str, str]) -> None:
    n = length(Case(), dirs)
    check_same_world(Case(workers=2, persistent=True, stops=(1, n // 2), rollback=(2, 5)), dirs)


def test_stateful_dataloader_mix_bucketed_early_state_and_across_the_epoch_boundary(
    dirs: dict[str, str],
) -> None:
    case = Case(mixed=True, batching="bucketed", loader="stateful", workers=2)
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (1, n, n + 2)}), dirs)


def test_decoded_cache_persistent_workers_and_stateful_mix_resume_exactly(dirs: dict[str, str]) -> None:
    n = length(Case(), dirs)
    check_same_world(Case(workers=2, persistent=True, stops=(1, n // 2), decoded_cache=True), dirs)
    case = Case(mixed=True, batching="bucketed", loader="stateful", workers=2, decoded_cache=True)
    check_same_world(replace(case, stops=(2, length(case, dirs) + 1)), dirs)


def test_unbatched_in_process_before_the_first_and_after_the_end(dirs: dict[str, str]) -> None:
    case = Case(batching="unbatched", loader="in_process", epoch=3)
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (0, n - 1, 2 * n)}), dirs)


def test_forkserver_persistent_worker_rollback_across_epochs(dirs: dict[str, str]) -> None:
    n = length(Case(batching="fixed"), dirs)
    check_same_world(
        Case(
            batching="fixed",
            workers=1,
            persistent=True,
            start_method="forkserver",
            stops=(n // 3,),
            rollback=(1, n),
        ),
        dirs,
    )


def test_stateful_dataloader_in_process_rolled_back_within_its_first_epoch(dirs: dict[str, str]) -> None:
    # the rolled-back iteration yields the rest of the epoch, which len(ds) learns only once it begins
    check_same_world(Case(batching="bucketed", loader="stateful", epochs=2, rollback=(1, 2)), dirs)


def test_stateful_state_into_the_dataset_with_three_workers(dirs: dict[str, str]) -> None:
    check_same_world(Case(loader="stateful", workers=3, stops=(1,), ds_load=True), dirs)


@pytest.mark.slow
def test_shard_loader_mix_spawn_pinned_stopped_across_the_epoch_boundary_and_rolled_back(
    dirs: dict[str, str],
) -> None:
    case = Case(
        mixed=True, batching="bucketed", loader="shardio", workers=2, start_method="spawn", pin_memory=True
    )
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (1, n, n + 2), "rollback": (1, 3)}), dirs)


def test_shard_loader_persistent_workers_resume_with_another_worker_count(dirs: dict[str, str]) -> None:
    n = length(Case(batching="fixed"), dirs)
    check_same_world(
        Case(
            batching="fixed", loader="shardio", workers=3, persistent=True, stops=(n // 2,), resume_workers=1
        ),
        dirs,
    )


def test_collated_samples_with_persistent_workers_resume_from_the_loaders_own_state(
    dirs: dict[str, str],
) -> None:
    case = Case(batching="collated", loader="stateful", workers=2, persistent=True)
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (1, n // 2 + 1, n + 2), "rollback": (1, 4)}), dirs)


@pytest.mark.slow
def test_collated_samples_of_two_workers_stopped_between_rounds_and_resumed_by_another_world(
    dirs: dict[str, str],
) -> None:
    # after an odd number of batches worker 0 has handed over more samples than worker 1: some are ahead of
    # the plan's prefix, and the new world's plan leaves them out; near the end, some of them
    # are the old plan's padding
    case = Case(batching="collated", loader="stateful", workers=2, epochs=1, ds_load=True)
    check_world_change(case, dirs, 2, 3, stop=3)
    check_world_change(replace(case, workers=3), dirs, 4, 1, stop=4)
    # a mix draws samples more than once an epoch: one consumed ahead and drawn again later cannot be left out
    with pytest.raises(StateError, match="draws again later"):
        check_world_change(replace(case, mixed=True, epoch=1), dirs, 4, 1, stop=1)


def test_collated_samples_in_process_stopped_and_resumed_by_another_world(dirs: dict[str, str]) -> None:
    case = Case(mixed=True, batching="collated", loader="in_process")
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (1, n - 1, n + 1)}), dirs)
    case = Case(batching="collated", loader="in_process", epochs=1)
    check_world_change(case, dirs, 3, 2, stop=length(case, dirs, World(0, 3)) // 2 + 1)


@pytest.mark.parametrize("workers", [1, 2])
def test_stateful_state_between_snapshots_into_the_dataset(dirs: dict[str, str], workers: int) -> None:
    """snapshot_every_n_steps=3: the workers' states lag up to 2 batches; the dataset counts them."""
    case = Case(batching="fixed", loader="stateful", workers=workers, snapshot_every=3, ds_load=True)
    n = length(case, dirs)
    check_same_world(Case(**{**case.__dict__, "stops": (1, 5, n + 1), "rollback": (1, 5)}), dirs)


@pytest.mark.parametrize("old,new,loader", [(3, 2, "state_after"), (2, 3, "stateful"), (3, 2, "shardio")])
def test_world_change_consumes_the_rest_once(dirs: dict[str, str], old: int, new: int, loader: str) -> None:
    case = Case(mixed=loader == "stateful", loader=loader, workers=1, epochs=1, ds_load=True)
    check_world_change(case, dirs, old, new, stop=length(case, dirs, World(0, old)) // 2)


# -- real process groups -------------------------------------------------------------------------


def group(launcher: str, world_size: int, config: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """Run ``world_size`` ranks of :func:`rank_entry` with ``launcher``; each rank's result."""
    if launcher == "forkserver":
        return process_groups.run_group(rank_entry, world_size, config, out, timeout_s=GROUP_TIMEOUT_S)
    out.mkdir(parents=True)
    config = {**config, "out": str(out)}
    if launcher == "spawn":
        import torch.multiprocessing as tmp

        context = tmp.spawn(
            spawn_entry, args=(world_size, process_groups.free_port(), config), nprocs=world_size, join=False
        )
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                assert time.monotonic() < deadline, (
                    f"spawned ranks did not finish in {GROUP_TIMEOUT_S:.0f} s\n"
                    + (process_groups.errors(out))
                )
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(timeout=10)
    else:
        (out / "config.json").write_text(json.dumps(config))
        script = Path(__file__).parents[1] / "resume_rank.py"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).parents[1]), str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")]
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={world_size}",
                f"--master_port={process_groups.free_port()}",
                str(script),
                str(out / "config.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=GROUP_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stderr[-4000:] + process_groups.errors(out)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]


def check_group_world_change(
    case: Case, dirs: dict[str, str], tmp_path: Path, launcher: str, ranks: str, old: int, new: int, stop: int
) -> None:
    base = {"case": case_config(case), "dirs": dirs, "ranks": ranks}
    first = group(launcher, old, {**base, "stop": stop}, tmp_path / "old")
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    second = group(launcher, new, {**base, "load": str(state)}, tmp_path / "new")
    assert [r["world_size"] for r in first + second] == [old] * old + [new] * new
    before = [r for result in first for r in records_of(result)]
    after = [r for result in second for r in records_of(result)]
    assert len(before) == old * stop
    padded = resumed_dataset(case, dirs, World(0, new), first[0]["state"]).plan().padded
    check_elastic(before, after, uninterrupted(case, dirs, World(0, 1)), padded)


def test_gloo_group_from_init_process_group_changes_world(dirs: dict[str, str], tmp_path: Path) -> None:
    """Ranks from init_process_group without RANK/WORLD_SIZE, 3 -> 2 (spawned workers:
    test_worker_control)."""
    case = Case(workers=1, epochs=1, ds_load=True)
    check_group_world_change(
        case, dirs, tmp_path, "forkserver", "init", 3, 2, stop=length(case, dirs, World(0, 3)) // 2
    )


@pytest.mark.slow
def test_gloo_group_with_shard_loaders_changes_world(dirs: dict[str, str], tmp_path: Path) -> None:
    """Each rank of a real gloo group (RANK/WORLD_SIZE set) iterates a ShardLoader with 2
    spawned workers: 3 -> 2."""
    case = Case(loader="shardio", workers=2, start_method="spawn", epochs=1)
    check_group_world_change(
        case, dirs, tmp_path, "forkserver", "env", 3, 2, stop=length(case, dirs, World(0, 3)) // 2
    )


@pytest.mark.slow
def test_torchrun_group_same_world(dirs: dict[str, str], tmp_path: Path) -> None:
    case = Case(workers=2, persistent=True, epochs=2)
    n = length(case, dirs, World(0, 2))
    case = Case(workers=2, persistent=True, epochs=2, stops=(n // 2, n + 1))
    results = group(
        "torchrun",
        2,
        {"case": case_config(case), "dirs": dirs, "ranks": "env", "whole": True},
        tmp_path / "out",
    )
    for result in results:
        straight = uninterrupted(case, dirs, World(result["rank"], 2))
        assert records_of(result) == straight


# -- the full matrix (slow, on request) ----------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn, loaders: tuple[str, ...] = LOADERS) -> Case:
    loader = draw(st.sampled_from(loaders))
    workers = 0 if loader == "in_process" else draw(st.integers(0, 3))
    persistent = workers > 0 and draw(st.booleans())
    batchings = sorted(
        set(BATCHINGS)
        - ({"unbatched", "collated"} if loader == "shardio" else set())
        - ({"collated"} if loader == "state_after" else set())
    )
    batching = draw(st.sampled_from(batchings))
    # a ShardLoader's state is the dataset's: it resumes with another worker count too
    resume_workers = draw(st.none() | st.integers(1 if persistent else 0, 3)) if loader == "shardio" else None
    # the loader's state into the dataset; between rounds of several workers' collated samples it resumes each
    # sample once but re-planned, not the same sequence: drawn for a world change only (check_drawn)
    ds_load = loader == "stateful" and not (batching == "collated" and workers > 1) and draw(st.booleans())
    unbatched = batching in ("unbatched", "collated")
    snapshot_every = (
        draw(st.sampled_from([1, 3])) if loader == "stateful" and not (ds_load and unbatched) else 1
    )
    return Case(
        mixed=draw(st.booleans()),
        batching=batching,
        loader=loader,
        workers=workers,
        persistent=persistent,
        start_method=draw(st.sampled_from(["fork", "forkserver", "spawn"])) if workers else "fork",
        epoch=draw(st.integers(0, 3)),
        ds_load=ds_load,
        snapshot_every=snapshot_every,
        resume_workers=resume_workers,
        pin_memory=loader == "shardio" and draw(st.booleans()),
    )


@pytest.mark.slow
@pytest.mark.skipif(not EXAMPLES, reason="the full matrix runs with SHARDIO_RESUME_EXAMPLES=N")
@settings(max_examples=max(EXAMPLES, 1), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_full_matrix(dirs: dict[str, str], data: st.DataObject) -> None:
    check_drawn(dirs, data, data.draw(cases()))


@pytest.mark.slow
@pytest.mark.skipif(not EXAMPLES, reason="the full matrix runs with SHARDIO_RESUME_EXAMPLES=N")
@settings(max_examples=max(EXAMPLES, 1), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_full_matrix_of_the_shard_loader(dirs: dict[str, str], data: st.DataObject) -> None:
    check_drawn(dirs, data, data.draw(cases(("shardio",))))


def check_drawn(dirs: dict[str, str], data: st.DataObject, case: Case) -> None:
    """Stops and a rollback drawn for ``case`` in the same world, or a drawn world change (where the case's
    state can go into a dataset of another world)."""
    # a mix's collated multi-worker state between rounds can be refused (a sample consumed
    # ahead drawn again later)
    elastic = not (case.snapshot_every != 1 and case.batching in ("unbatched", "collated")) and not (
        case.mixed and case.batching == "collated" and case.loader == "stateful" and case.workers > 1
    )
    if data.draw(st.booleans()) or not elastic:
        n = length(case, dirs)
        stops = tuple(sorted(data.draw(st.lists(st.integers(0, 2 * n), max_size=3))))
        rollback = data.draw(
            st.none() | st.tuples(st.integers(0, n), st.integers(1, n)).filter(lambda r: r[0] < r[1])
        )
        check_same_world(Case(**{**case.__dict__, "stops": stops, "rollback": rollback}), dirs)
    else:
        old, new = data.draw(st.sampled_from([(3, 2), (2, 3), (1, 4), (4, 1)]))
        case = Case(**{**case.__dict__, "epochs": 1, "ds_load": True})
        stop = data.draw(st.integers(0, length(case, dirs, World(0, old)) - 1))
        check_world_change(case, dirs, old, new, stop)


@pytest.mark.slow
@pytest.mark.skipif(not EXAMPLES, reason="the full matrix runs with SHARDIO_RESUME_EXAMPLES=N")
@pytest.mark.parametrize("launcher", ["forkserver", "spawn", "torchrun"])
@pytest.mark.parametrize("ranks", ["env", "init", "explicit"])
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_group_matrix(
    dirs: dict[str, str], tmp_path: Path, launcher: str, ranks: str, start_method: str
) -> None:
    if launcher == "torchrun" and ranks != "env":
        pytest.skip("torchrun always sets RANK/WORLD_SIZE")
    case = Case(workers=2, start_method=start_method, epochs=1, ds_load=True, loader="stateful")
    check_group_world_change(
        case, dirs, tmp_path, launcher, ranks, 3, 2, stop=length(case, dirs, World(0, 3)) // 2
    )
