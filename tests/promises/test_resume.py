"""Resume cases beyond the matrix's smoke subset, through the one harness (``tests/resume_harness.py``).

The matrix (``test_resume_matrix.py``) checks loader configurations; these add hypothesis draws of stop
points and world-size changes (with either remainder policy), a worker count changed at the resume, rank 0's
state restoring every rank, and what a resume must never do: decode the samples it skips, or load a state
from another dataset.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resume_harness import (
    BATCHINGS,
    Case,
    check_same_world,
    check_world_change,
    length,
    life,
    make_dataset,
    uninterrupted,
    write_corpora,
)

from shardio import OptionError, StateError, World


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_plain_dataloader_stopped_early_midway_and_before_the_last(
    dirs: dict[str, str], workers: int
) -> None:
    n = length(Case(), dirs)
    check_same_world(Case(workers=workers, epochs=1, stops=(1, n // 2, n - 1)), dirs)


def test_stateful_dataloader_without_workers(dirs: dict[str, str]) -> None:
    check_same_world(Case(loader="stateful", epochs=1, stops=(3, 7)), dirs)


def test_in_process_at_zero_and_at_the_exact_end(dirs: dict[str, str]) -> None:
    """A state at batch 0, then one after the last batch: the restarted job's ``set_epoch`` of the saved epoch
    keeps the position (it plays nothing of that epoch), and the next epoch follows."""
    case = Case(loader="in_process")
    check_same_world(Case(loader="in_process", stops=(0, length(case, dirs))), dirs)


@pytest.mark.parametrize("loader", ["state_after", "stateful"])
def test_resumed_with_other_workers(dirs: dict[str, str], loader: str) -> None:
    """3 workers, then 1 (a shardio state), or a StatefulDataLoader state of 2 workers into 3."""
    workers, resume_workers = (3, 1) if loader == "state_after" else (2, 3)
    check_same_world(
        Case(
            loader=loader, workers=workers, resume_workers=resume_workers, ds_load=True, epochs=1, stops=(5,)
        ),
        dirs,
    )


def test_persistent_workers_resumed_in_a_later_epoch(dirs: dict[str, str]) -> None:
    case = Case(batching="fixed", workers=2, persistent=True, epoch=1)
    check_same_world(Case(**{**case.__dict__, "stops": (4,)}), dirs)
    straight = uninterrupted(case, dirs)
    gains = [
        {key: g for epoch, keys, draws in straight if epoch == e for key, g in zip(keys, draws)}
        for e in (1, 2)
    ]
    assert gains[0].keys() == gains[1].keys() and all(gains[0][k] != gains[1][k] for k in gains[0])


def test_rank0_state_restores_every_rank(dirs: dict[str, str]) -> None:
    case = Case(epochs=1)
    _, state = life(case, dirs, World(0, 3), None, 3)
    assert state is not None
    for rank in range(3):
        straight = uninterrupted(case, dirs, World(rank, 3))
        rest, _ = life(case, dirs, World(rank, 3), state, None)
        assert straight[:3] + rest == straight


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_stops_resume_exactly(dirs: dict[str, str], data: st.DataObject) -> None:
    batching = data.draw(st.sampled_from(sorted(BATCHINGS)))
    # state_after refuses a batch the DataLoader made of several samples: those resume from ds.state_dict()
    case = Case(
        batching=batching,
        loader="in_process" if batching == "collated" else "state_after",
        epoch=data.draw(st.integers(0, 3)),
        epochs=1,
    )
    stops = data.draw(st.lists(st.integers(0, length(case, dirs)), min_size=1, max_size=3))
    check_same_world(Case(**{**case.__dict__, "stops": tuple(sorted(stops))}), dirs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    old=st.integers(1, 5),
    new=st.integers(1, 5),
    fraction=st.floats(0.05, 0.95),
    remainder=st.sampled_from(["drop", "pad"]),
)
def test_elastic_resume_consumes_the_rest_exactly_once(
    dirs: dict[str, str], old: int, new: int, fraction: float, remainder: str
) -> None:
    """Any world to any other, either remainder policy: the rest of the epoch once, up to the resumed plan's
    padding (``pad``) or its dropped last round (``drop``)."""
    case = Case(epochs=1, extra={"remainder": remainder})
    stop = max(1, int(length(case, dirs, World(0, old)) * fraction))
    check_world_change(case, dirs, old, new, stop)


def test_resume_seeks_without_decoding_skipped_samples(dirs: dict[str, str]) -> None:
    decoded: list[str] = []

    def record(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        decoded.append(sample["key"])
        return sample

    expected = [keys for _, keys, _ in uninterrupted(Case(epochs=1), dirs)]
    ds = make_dataset(Case(), dirs)
    ds.load_state_dict(ds.state_after({"epoch": 0, "batch_index": len(expected) - 3}))
    ds.decoding = replace(ds.decoding, transform=record)
    assert [tuple(batch["keys"]) for batch in ds] == expected[-2:]
    assert decoded == [key for keys in expected[-2:] for key in keys]


def test_incompatible_state_names_every_difference(dirs: dict[str, str]) -> None:
    state = make_dataset(Case(), dirs).state_dict()
    with pytest.raises(StateError) as raised:
        make_dataset(Case(extra={"seed": 8, "max_duration": 2.0}), dirs).load_state_dict(state)
    message = str(raised.value)
    assert "seed: state 7, dataset 8" in message and "option max_duration: state 1.5, dataset 2.0" in message
    with pytest.raises(StateError, match="index fingerprint"):
        make_dataset(Case(), {"main": dirs["extra"]}).load_state_dict(state)
    with pytest.raises(StateError, match="not a shardio loader state"):
        make_dataset(Case(), dirs).load_state_dict({"epoch": 1})
    with pytest.raises(StateError, match="has only"):
        make_dataset(Case(), dirs).load_state_dict(dict(state, start=10_000))
    with pytest.raises(OptionError):
        make_dataset(Case(), dirs).state_after({"keys": []})
