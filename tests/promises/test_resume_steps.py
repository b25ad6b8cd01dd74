"""Steps on any world (``Batching(step_batches=K)``): a job saved at an optimizer step's boundary on ``W``
ranks resumes on ``W'`` ranks (``W'`` divides ``K``) onto the straight run's steps, sample for sample, over
the configurations of the resume harness (workers, start methods, loaders, batchings, a mix); a state saved
inside a step is refused on another world, naming the step, and resumes exactly on the same one."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from resume_harness import (
    Case,
    check_same_world,
    check_steps_world_change,
    life,
    resumed_dataset,
    write_corpora,
)
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardio import OptionError, StateError, World, collate


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_corpora(tmp_path_factory.mktemp("corpora"))


FIXED = {"step_batches": 4}


@pytest.mark.parametrize(
    ("case", "old", "new", "step"),
    [
        (Case(batching="fixed", loader="in_process", extra=FIXED), 2, 1, 3),
        (Case(batching="fixed", loader="state_after", workers=2, extra=FIXED), 2, 4, 2),
        (Case(batching="duration", loader="shardio", workers=2, start_method="spawn", extra=FIXED), 1, 2, 1),
        (Case(batching="bucketed", loader="stateful", workers=2, ds_load=True, extra=FIXED), 4, 1, 1),
        (
            Case(batching="bucketed", loader="state_after", workers=2, extra={**FIXED, "remainder": "drop"}),
            2,
            1,
            1,
        ),
        (Case(batching="unbatched", loader="state_after", workers=2, extra={"step_batches": 8}), 2, 4, 3),
        (Case(mixed=True, batching="fixed", loader="shardio", workers=2, extra=FIXED), 2, 1, 2),
    ],
    ids=[
        "in-process-2to1",
        "fork-2to4",
        "spawn-shardio-1to2",
        "stateful-bucketed-4to1",
        "drop-2to1",
        "unbatched-2to4",
        "mix-2to1",
    ],
)
def test_a_resume_on_another_world_plays_the_straight_runs_steps(
    dirs: dict[str, str], case: Case, old: int, new: int, step: int
) -> None:
    check_steps_world_change(case, dirs, old, new, step)


@pytest.mark.parametrize(
    ("case", "old", "new", "step"),
    [
        (Case(batching="bucketed", loader="state_after", workers=2, persistent=True, extra=FIXED), 2, 1, 1),
        pytest.param(
            Case(batching="duration", loader="shardio", workers=2, persistent=True, extra=FIXED),
            4,
            2,
            2,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            Case(batching="fixed", loader="state_after", workers=2, start_method="forkserver", extra=FIXED),
            1,
            4,
            3,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            Case(
                batching="bucketed",
                loader="shardio",
                workers=2,
                persistent=True,
                start_method="forkserver",
                extra=FIXED,
            ),
            2,
            4,
            1,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            Case(
                mixed=True,
                batching="duration",
                loader="stateful",
                workers=2,
                persistent=True,
                start_method="forkserver",
                ds_load=True,
                extra=FIXED,
            ),
            1,
            2,
            2,
            marks=pytest.mark.slow,
        ),
    ],
    ids=[
        "persistent-fork-2to1",
        "persistent-shardio-4to2",
        "forkserver-1to4",
        "persistent-forkserver-shardio-2to4",
        "persistent-forkserver-stateful-mix-1to2",
    ],
)
def test_persistent_and_forkserver_workers_resume_on_another_world_onto_the_straight_runs_steps(
    dirs: dict[str, str], case: Case, old: int, new: int, step: int
) -> None:
    """Two epochs: the resumed life's persistent workers play the rest of the first and all of the next."""
    check_steps_world_change(case, dirs, old, new, step, epochs=2)


def test_a_state_inside_a_step_is_refused_on_another_world_and_resumes_on_the_same(
    dirs: dict[str, str],
) -> None:
    case = Case(batching="fixed", loader="state_after", epochs=1, extra=FIXED)
    _, state = life(case, dirs, World(0, 2), None, 3)  # step 1, micro-batch 1 of 2
    assert state is not None
    with pytest.raises(StateError, match=r"micro-batch 1 of optimizer step 1 .*step_batches=4"):
        resumed_dataset(case, dirs, World(0, 1), state)
    check_same_world(replace(case, stops=(3,)), dirs, World(0, 2))


def test_a_world_that_does_not_divide_step_batches_is_refused_naming_both(dirs: dict[str, str]) -> None:
    case = Case(batching="fixed", extra=FIXED)
    from resume_harness import make_dataset

    ds = make_dataset(case, dirs, World(0, 3))
    with pytest.raises(OptionError, match="step_batches=4 .* 3 ranks"):
        print(ds.accumulation)
    with pytest.raises(OptionError, match="step_batches=4 .* 3 ranks"):
        next(iter(ds))


COLLATED_STEPS = r"step_batches=8 counts the dataset.s batches, .*unbatched .* DataLoader batching"


def _keys(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate_fn of the user's own (not shardio.collate): the samples' keys and positions."""
    return {name: [sample[name] for sample in samples] for name in ("key", "epoch", "batch_index")}


def test_a_dataloader_batching_an_unbatched_datasets_samples_with_step_batches_is_refused(
    dirs: dict[str, str],
) -> None:
    """Its batches are no steps' batches (with workers, not even in plan order): refused where shardio sees
    it, with an OptionError naming step_batches and the DataLoader's batching."""
    case = Case(batching="unbatched", extra={"step_batches": 8})
    from resume_harness import make_dataset

    # state_after of a batch the DataLoader made
    ds = make_dataset(case, dirs, World(0, 2))
    batch = next(iter(DataLoader(ds, batch_size=3, collate_fn=collate)))
    with pytest.raises(OptionError, match=COLLATED_STEPS):
        ds.state_after(batch)
    # shardio.collate in a DataLoader worker
    with pytest.raises(OptionError, match=COLLATED_STEPS):
        next(iter(DataLoader(ds, batch_size=3, collate_fn=collate, num_workers=1)))
    # a StatefulDataLoader's state of such batches, at a round's end and between its workers' rounds
    for workers, taken in ((0, 2), (2, 2), (2, 1)):
        ds = make_dataset(case, dirs, World(0, 2))
        loader = StatefulDataLoader(
            ds, batch_size=3, collate_fn=collate if not workers else _keys, num_workers=workers
        )
        batches = iter(loader)
        for _ in range(taken):
            next(batches)
        state = json.loads(json.dumps(loader.state_dict()))
        del batches
        for world in (World(0, 2), World(0, 4)):
            with pytest.raises(OptionError, match=COLLATED_STEPS):
                make_dataset(case, dirs, world).load_state_dict(state)
        if workers and taken == 1:  # without the loader's counts, its workers' samples consumed ahead tell
            state["_snapshot"]["_main_snapshot"]["_sampler_iter_state"] = None
            with pytest.raises(OptionError, match=COLLATED_STEPS):
                make_dataset(case, dirs, World(0, 1)).load_state_dict(state)
    # samples handed over one by one are the steps' batches: resumed as steps (the unbatched harness cases)
    ds = make_dataset(case, dirs, World(0, 2))
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    make_dataset(case, dirs, World(0, 1)).load_state_dict(loader.state_dict())


@pytest.mark.parametrize("value", [-1, "6", 6.0, True, None, 2**62, [6]])
def test_a_hostile_loader_sample_count_is_a_state_error(dirs: dict[str, str], value: Any) -> None:
    """The StatefulDataLoader counts read to tell its batching are data: a malformed one is refused, naming
    it, not a TypeError."""
    from resume_harness import make_dataset

    case = Case(batching="unbatched", extra={"step_batches": 8})
    ds = make_dataset(case, dirs, World(0, 2))
    loader = StatefulDataLoader(ds, batch_size=None)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))
    state["_sampler_iter_state"] = {"samples_yielded": value}
    with pytest.raises(StateError, match="samples_yielded must be an integer"):
        make_dataset(case, dirs, World(0, 2)).load_state_dict(state)
