"""check-resume's comparison on made-up logs: what a restarted run trained on (each killed part cut at the
state the next loaded), and the first difference named by kind and cause."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from shardio.cli.resumecompare import compare_runs
from shardio.runtime.yieldlog import BatchRecord, LoadRecord

_T = iter(range(1, 10**9))


def batches(
    steps: Sequence[tuple[int, int]], *, rank: int = 0, world: int = 1, it: str = "a"
) -> list[BatchRecord]:
    """Batches at (epoch, step); the digest names the pair, so equal positions are equal batches."""
    return [
        BatchRecord(
            "s",
            rank,
            world,
            e,
            j,
            None,
            f"{it}{e}",
            2,
            f"d{e}.{j}",
            next(_T),
            (f"k{e}.{j}",) * 1,
            (f"k{e}.{j}",),
        )  # fmt: skip
        for e, j in steps
    ]


def load(epoch: int, position: int, *, after_iter: bool = False, rank: int = 0) -> LoadRecord:
    return LoadRecord("s", rank, 1, epoch, position, 1, after_iter, next(_T))


EPOCHS = [(e, j) for e in range(3) for j in range(4)]


def test_a_resume_from_the_last_checkpoint_is_exact() -> None:
    # killed after batch 6 (epoch 1 step 2), the checkpoint stood after batch 5 (epoch 1 step 1)
    parts = [batches(EPOCHS[:7]), [load(1, 2), *batches(EPOCHS[6:], it="b")]]
    verdict = compare_runs(batches(EPOCHS), parts)
    assert verdict.exact, verdict.lines
    assert verdict.lines == ["exact: 12 batches over 1 rank(s) trained as in the straight run"]


def test_several_restarts_and_an_epoch_boundary_state() -> None:
    parts = [
        batches(EPOCHS[:5]),
        [load(0, 4), *batches(EPOCHS[4:9], it="b")],
        [load(2, 0), *batches(EPOCHS[8:], it="c")],
    ]
    assert compare_runs(batches(EPOCHS), parts).exact


@pytest.mark.parametrize(
    ("restart", "kind", "says"),
    [
        (batches(EPOCHS[4:], it="b"), "state never loaded", "loaded no loader state"),
        (
            [load(1, 2, after_iter=True), *batches(EPOCHS[4:], it="b")],
            "loaded after the first iter()",
            "before the loop",
        ),
        ([load(1, 2), *batches(EPOCHS[7:], it="b")], "skipped", "never trained"),
        (
            [load(1, 2), *batches([(1, 3)], it="b"), *batches(EPOCHS[6:7] + EPOCHS[8:], it="c")],
            "another order",
            "comes later",
        ),
        ([load(1, 2), *batches([(1, 0), *EPOCHS[7:]], it="b")], "repeated", "trained already"),
        ([load(1, 2), *batches([(0, 9), *EPOCHS[7:]], it="b")], "another epoch", "set_epoch"),
        ([load(1, 2), *batches(EPOCHS[6:10], it="b")], "skipped", "ended after 10 batches"),
        ([load(1, 2), *batches(EPOCHS[6:] + [(3, 0)], it="b")], "repeated", "1 batches more"),
        ([load(2, 3), *batches(EPOCHS[11:], it="b")], "an older state", "not one the killed run reached"),
    ],
    ids=["never-loaded", "after-iter", "skipped", "order", "repeated", "epoch", "short", "long", "unplaced"],
)
def test_the_first_difference_is_named(restart: list[BatchRecord | LoadRecord], kind: str, says: str) -> None:
    verdict = compare_runs(batches(EPOCHS), [batches(EPOCHS[:8]), restart])
    assert not verdict.exact
    assert verdict.kind == kind, verdict.lines
    assert says in "\n".join(verdict.lines)
    assert verdict.page is not None and verdict.page.startswith("docs/guides/")


def test_a_lightning_restart_that_loaded_no_state_points_at_the_lightning_page() -> None:
    """Lightning saves no state for a plain DataLoader: its restart begins epoch 0 again, and the report says
    where the ShardioCallback is (the records say Lightning ran them)."""
    restart = [dataclasses.replace(b, trainer="lightning") for b in batches(EPOCHS[:6], it="b")]
    verdict = compare_runs(batches(EPOCHS), [batches(EPOCHS[:8]), restart])
    assert verdict.kind == "state never loaded", verdict.lines
    assert verdict.page == "docs/trainers/lightning.md#without-the-callback"
    assert "with every batch the killed run yielded" in verdict.lines[1]
    assert "ShardioCallback" in "\n".join(verdict.lines)


def test_ranks_are_compared_each_and_a_first_part_that_differs_is_not_a_resume_problem() -> None:
    straight = batches(EPOCHS) + batches(EPOCHS, rank=1, it="r")
    wrong = batches(EPOCHS[:8]) + batches([(0, 1), (0, 0), *EPOCHS[2:8]], rank=1, it="r")
    verdict = compare_runs(straight, [wrong, [load(1, 4), *batches(EPOCHS[8:], it="b")]])
    assert verdict.kind == "not reproducible" and "rank 1" in verdict.lines[1]


def named(epoch: int, step: int, key: str, *, rank: int = 0, world: int = 1, it: str = "a") -> BatchRecord:
    return BatchRecord("s", rank, world, epoch, step, None, f"{it}{epoch}", 1, key, next(_T), (key,), (key,))


def test_across_world_sizes_each_epochs_keys_are_trained_once() -> None:
    keys = [f"k{i}" for i in range(8)]  # epoch 0: rank 0 trains k0 k2 k4 k6, rank 1 k1 k3 k5 k7
    straight = [named(0, j, keys[2 * j + r], rank=r, world=2) for r in (0, 1) for j in range(4)]
    killed = [named(0, j, keys[2 * j + r], rank=r, world=2, it="k") for r in (0, 1) for j in range(2)]
    # the state: after position 1 of the world of 2 (k0 and k1 trained); the rest of the epoch on one rank
    loaded = LoadRecord("s", 0, 1, 0, 1, 2, False, next(_T))
    rest = [named(0, j, key, it="b") for j, key in enumerate(keys[2:])]
    assert compare_runs(straight, [killed, [loaded, *rest]], exactly_once=True).exact
    verdict = compare_runs(straight, [killed, [loaded, *rest[1:]]], exactly_once=True)
    assert verdict.kind == "skipped" and "1 samples never trained" in verdict.lines[1], verdict.lines
    verdict = compare_runs(straight, [killed, [loaded, named(0, 0, "k0", it="b"), *rest]], exactly_once=True)
    assert verdict.kind == "repeated"
