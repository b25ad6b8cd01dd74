"""A re-mix with steps (``Batching(step_batches=K)``): the state ``shardio.remix`` writes at an optimizer
step's boundary loads on 1 and 2 ranks and plays the rest of the epoch, and the next, as whole steps of
``K`` batches, the same on either world; a state inside a step is refused, naming it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from resume_harness import Case, life, make_dataset, step_records, write_corpora
from resume_harness import stopped as harness_stopped

from shardio import StateError, World
from shardio.ledger.remix import remix, remix_report
from shardio.ledger.trace import Trace

K = 4
OLD = Case(mixed=True, batching="fixed", extra={"step_batches": K}, epochs=2)
NEW = replace(OLD, weights=(("main", 0.4), ("extra", 0.6)))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_corpora(tmp_path_factory.mktemp("corpora"))


def stopped(dirs: dict[str, str], world_size: int, batches: int) -> tuple[list[Any], dict[str, Any]]:
    """The old mix's ranks play ``batches`` each; their records and rank 0's state."""
    ranks, state = harness_stopped(OLD, dirs, world_size, batches)
    return [record for records in ranks for record in records], state


@pytest.mark.parametrize(("old", "steps"), [(2, 2), (1, 1), (2, 0)], ids=["mid-2", "mid-1", "start-2"])
def test_a_remix_at_a_step_boundary_plays_whole_steps_the_same_on_one_and_two_ranks(
    dirs: dict[str, str], old: int, steps: int
) -> None:
    before, state = stopped(dirs, old, steps * K // old)
    remixed = remix(state, make_dataset(OLD, dirs, World(0, old)), make_dataset(NEW, dirs, World(0, old)))
    played = {}
    for new in (1, 2):
        after = [life(NEW, dirs, World(rank, new), remixed, None)[0] for rank in range(new)]
        assert len({len(records) for records in after}) == 1, "ranks of unequal batch counts"
        played[new] = step_records(after, K // new)  # whole steps: each rank K / new batches a step
        assert sum(map(len, played[new])) == sum(len(keys) for records in after for _, keys, _ in records)
    assert played[1] == played[2] and played[1]
    # the ledger agrees: the re-mixed state's trace of a step names its samples
    ds = make_dataset(NEW, dirs, World(0, 2))
    trace = Trace(ds, remixed)
    epoch = remixed["epoch"]
    for step, samples in enumerate(played[2][:3]):
        traced = sorted(key for record in trace.steps(epoch, step) for key in trace.row(record)["keys"])
        assert traced == sorted(key for key, _ in samples)
    if steps:
        assert {row["step"] for row in remix_report(remixed)} == {steps}  # an optimizer step


def test_a_remix_inside_a_step_is_refused_naming_it(dirs: dict[str, str]) -> None:
    _, inside = stopped(dirs, 2, 3)  # micro-batch 1 of step 1, 2 batches a rank a step
    with pytest.raises(StateError, match="micro-batch 1 of optimizer step 1 of epoch 0: .* a re-mix"):
        remix(inside, make_dataset(OLD, dirs, World(0, 2)), make_dataset(NEW, dirs, World(0, 2)))
