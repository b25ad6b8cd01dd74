"""Planned repeats are flagged, so that a metric summed over ranks counts every sample exactly once.

The planner's invariants (hypothesis) over ``remainder="pad"``/``"drop"``, any world size, duration batches,
bucketing, elastic segments and fixed-length epochs (``limit``); then the batches a real ShardDataset yields;
then ``tools/eval_example.py`` under ``torchrun`` on 3 gloo ranks against one process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from process_groups import free_port
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Batching, ShardDataset, World
from shardio.planning.mix import CorpusColumns, plan_mix
from shardio.planning.mixoptions import EpochSize, Mix
from shardio.planning.plan import EpochPlan, Segment, plan_epoch, plan_segments
from shardio.planning.repeats import Repeats

EXAMPLE = Path(__file__).resolve().parents[2] / "tools" / "eval_example.py"


def counted(plan: EpochPlan) -> tuple[Counter[int], list[int]]:
    """The samples not flagged (with their counts), and every sample occurrence in round order."""
    repeats = Repeats(plan)
    kept: Counter[int] = Counter()
    occurrences = []
    for j in range(plan.num_batches):
        for rank in range(plan.world_size):
            ids, flags = plan.batch(rank, j), repeats.flags(rank, j)
            assert flags.shape == ids.shape and flags.dtype == bool
            kept.update(ids[~flags].tolist())
            occurrences += ids.tolist()
    return kept, occurrences


def check_exactly_once(plan: EpochPlan) -> None:
    kept, occurrences = counted(plan)
    assert set(kept) == set(occurrences)  # every sample some rank trains on is counted ...
    assert max(kept.values(), default=1) == 1  # ... once
    if plan.padded == 0 and len(occurrences) == len(set(occurrences)):
        assert len(kept) == len(occurrences)  # nothing repeated, nothing flagged


plans = st.fixed_dictionaries(
    {
        "n": st.integers(1, 120),
        "shards": st.integers(1, 9),
        "world": st.integers(1, 7),
        "seed": st.integers(0, 3),
        "remainder": st.sampled_from(["pad", "drop"]),
        "size": st.one_of(st.integers(1, 9), st.none()),
        "buckets": st.sampled_from([None, 3]),
    }
)


@settings(max_examples=150, deadline=None)
@given(plans)
def test_every_planned_sample_counts_once(case: dict) -> None:
    rng = np.random.default_rng(case["seed"])
    shard_ids = rng.integers(0, case["shards"], case["n"])
    durations = rng.uniform(0.2, 3.0, case["n"])
    options = {"batch_size": case["size"]} if case["size"] else {"max_duration": 6.0}
    batching = Batching(remainder=case["remainder"], num_buckets=case["buckets"], **options)
    plan = plan_epoch(
        shard_ids,
        durations,
        case["shards"],
        seed=case["seed"],
        epoch=1,
        world_size=case["world"],
        batching=batching,
    )
    check_exactly_once(plan)
    if case["remainder"] == "drop":
        assert counted(plan)[0].total() == len(counted(plan)[1])  # dropping leaves nothing to flag
    # after an elastic change: the rest of the epoch, planned for another world
    if plan.num_batches > 1:
        rest = plan_epoch(
            shard_ids,
            durations,
            case["shards"],
            seed=case["seed"],
            epoch=1,
            world_size=3,
            batching=batching,
            history=[Segment(case["world"], plan.num_batches // 2)],
        )
        check_exactly_once(rest)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 30), st.integers(1, 6))
def test_fixed_length_epochs_flag_repeated_batches(n: int, size: int, limit: int, world: int) -> None:
    """A ``limit`` longer than the data repeats whole batches under new batch numbers: still counted once."""
    durations = np.linspace(0.5, 1.5, n)
    plan = plan_segments(
        np.arange(n),
        durations,
        seed=0,
        epoch=0,
        world_size=world,
        batching=Batching(batch_size=size),
        limit=limit,
    )
    check_exactly_once(plan)


def test_padding_is_flagged_when_batches_run_short() -> None:
    """One batch for three ranks: ranks 1 and 2 get it again, flagged; rank 0's counts."""
    plan = plan_epoch(
        np.zeros(2, np.int64), np.ones(2), 1, seed=0, epoch=0, world_size=3, batching=Batching(batch_size=4)
    )
    repeats = Repeats(plan)
    flags = [repeats.flags(rank, 0).tolist() for rank in range(3)]
    assert flags == [[False, False], [True, True], [True, True]]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 50),
    world=st.integers(1, 5),
    remainder=st.sampled_from(["pad", "drop"]),
    tiny=st.integers(1, 9),
    epoch=st.integers(0, 3),
)
def test_a_mixs_re_passes_are_not_repeats(
    seed: int, world: int, remainder: str, tiny: int, epoch: int
) -> None:
    """A corpus that repeats within a mix's epoch recurs under its next pass: trained on again, so not a
    repeat. Only padding is flagged: every (sample, pass) of the plan counts exactly once, and on one rank
    (or with ``remainder="drop"``) nothing is flagged at all. ``passes`` numbers each corpus's stream pass."""
    rng = np.random.default_rng(seed)
    corpora = {
        "big": CorpusColumns(np.sort(rng.integers(0, 6, 90)).astype(np.uint32), rng.uniform(1, 3, 90), 6),
        "tiny": CorpusColumns(np.zeros(tiny, np.uint32), rng.uniform(1, 3, tiny), 1),
    }
    plan = plan_mix(
        corpora,
        Mix({"big": 0.6, "tiny": 0.4}, EpochSize(primary="big")),
        seed=seed,
        epoch=epoch,
        world_size=world,
        batching=Batching(batch_size=4, remainder=remainder),
    )
    assert plan.passes is not None and plan.passes.shape == plan.samples.shape
    tiny_ids = plan.samples >= 90
    # tiny re-passes within the epoch
    assert Counter(plan.samples[tiny_ids].tolist()).most_common(1)[0][1] > 1
    # each corpus's passes: big is the primary (pass = epoch); tiny's passes hold each of its samples once
    assert set(plan.passes[~tiny_ids].tolist()) == {epoch}
    for p in set(plan.passes[tiny_ids].tolist()):
        in_pass = plan.samples[tiny_ids & (plan.passes == p)]
        assert len(set(in_pass.tolist())) == in_pass.shape[0]
    repeats = Repeats(plan)
    counted: Counter[tuple[int, int]] = Counter()
    occurrences = set()
    for j in range(plan.num_batches):
        for rank in range(world):
            b = plan.rank_batches[rank, j]
            ids, passes = (
                plan.samples[plan.offsets[b] : plan.offsets[b + 1]],
                plan.passes[plan.offsets[b] : plan.offsets[b + 1]],
            )
            flags = repeats.flags(rank, j)
            occurrences |= set(zip(ids.tolist(), passes.tolist()))
            counted.update(zip(ids[~flags].tolist(), passes[~flags].tolist()))
            if world == 1 or remainder == "drop":
                assert not flags.any()
    assert set(counted) == occurrences and max(counted.values()) == 1


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repeats") / "data"
    make_uneven_dataset(root, (6, 3, 8, 2), seed=2)  # 19 samples: 5 batches of 4, dealt to 3 ranks as 2 each
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_carry_the_flags(data: Path, workers: int) -> None:
    kept: Counter[str] = Counter()
    seen = 0
    for rank in range(3):
        dataset = ShardDataset(data, batch_size=4, seed=1, world=World(rank, 3))
        for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
            assert batch["repeat"].dtype == torch.bool and batch["repeat"].shape == (len(batch["keys"]),)
            kept.update(key for key, repeat in zip(batch["keys"], batch["repeat"].tolist()) if not repeat)
            seen += len(batch["keys"])
    assert len(kept) == 19 and set(kept.values()) == {1} and seen > 19


def test_unbatched_samples_carry_a_flag(data: Path) -> None:
    kept = [
        sample["key"]
        for rank in range(4)
        for sample in ShardDataset(data, world=World(rank, 4))
        if not sample["repeat"]
    ]
    assert sorted(kept) == sorted(set(kept)) and len(kept) == 19


def _example(data: Path, out: Path, ranks: int, *extra: str) -> dict[str, int]:
    command = [sys.executable, str(EXAMPLE), str(data), "--out", str(out), *extra]
    if ranks > 1:
        command[1:2] = [
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(EXAMPLE),
        ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE.parents[1]), *sys.path]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_example_totals_over_three_ranks_equal_one_process(data: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("eval_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    single = example.evaluate(str(data), batch_size=4, workers=0)
    assert single["utterances"] == 19 and single["errors"] > 0
    assert _example(data, tmp_path / "three.json", 3, "--workers", "1") == single


def test_flags_follow_the_samples_a_batch_keeps_when_some_are_skipped(tmp_path: Path) -> None:
    from test_read_errors import mixed_bad_dataset

    index, reasons = mixed_bad_dataset(tmp_path / "bad")  # 12 samples, 7 of them unreadable
    kept: Counter[str] = Counter()
    for rank in range(3):  # 4 batches of 3 dealt to 3 ranks: 2 repeated
        for batch in ShardDataset(index.root, batch_size=3, on_error="skip", world=World(rank, 3)):
            assert batch["repeat"].shape == (len(batch["keys"]),)
            kept.update(key for key, repeat in zip(batch["keys"], batch["repeat"].tolist()) if not repeat)
    assert set(kept) == set(index.keys) - set(reasons) and set(kept.values()) == {1}
