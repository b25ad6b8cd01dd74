"""Step-synchronised batches (``sync_buckets``): every step's batches are of one bucket and of nearly equal
cost, with every sample once, equal batch counts, determinism, elastic exactly-once, mixes and resume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import OptionError, ShardDataset, StateError, World
from shardio.planning.batches import sample_cost
from shardio.planning.bucketing import bucket_edges, bucket_of
from shardio.planning.mix import CorpusColumns, plan_mix
from shardio.planning.mixoptions import EpochSize, Mix
from shardio.planning.plan import Batching, EpochPlan, Ordering, Segment, options_of, plan_epoch
from shardio.planning.rounds import underfull
from shardio.synth import duration_sample

Corpus = tuple[np.ndarray, np.ndarray, int]


@st.composite
def corpora(draw: st.DrawFn) -> Corpus:
    n = draw(st.integers(1, 400))
    num_shards = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    durations = np.round(rng.uniform(0.2, draw(st.sampled_from([3.0, 20.0, 35.0])), n), 3)
    return np.sort(rng.integers(0, num_shards, n)).astype(np.uint32), durations, num_shards


@st.composite
def synchronised(draw: st.DrawFn) -> Batching:
    fixed = draw(st.booleans())
    return Batching(
        batch_size=draw(st.integers(1, 7)) if fixed else None,
        max_duration=None if fixed else draw(st.sampled_from([40.0, 90.0])),
        max_batch_size=None if fixed else draw(st.sampled_from([None, 6])),
        remainder=draw(st.sampled_from(["pad", "drop"])),
        num_buckets=draw(st.one_of(st.none(), st.integers(1, 6))),
        sync_buckets=True,
        quadratic_duration=None if fixed else draw(st.sampled_from([None, 15.0])),
        max_sample_duration=draw(st.sampled_from([None, 30.0])),
    )


def plan_of(corpus: Corpus, world_size: int, batching: Batching, **options: Any) -> EpochPlan:
    shard_ids, durations, num_shards = corpus
    options.setdefault("seed", 3)
    options.setdefault("epoch", 1)
    return plan_epoch(
        shard_ids,
        durations,
        num_shards,
        world_size=world_size,
        batching=batching,
        ordering=Ordering(shuffle_shards=2),
        **options,
    )


def step_costs(plan: EpochPlan, durations: np.ndarray, quadratic: float | None) -> np.ndarray:
    """``[world_size, steps]``: each rank's batch cost (count x the longest sample's cost) at each step."""
    costs = np.zeros(plan.rank_batches.shape)
    for rank in range(plan.world_size):
        for j in range(plan.num_batches):
            batch = plan.batch(rank, j)
            costs[rank, j] = len(batch) * sample_cost(durations[batch], quadratic).max()
    return costs


def step_efficiency(costs: np.ndarray) -> float:
    return float((costs.mean(axis=0) / costs.max(axis=0)).mean())


@settings(max_examples=50, deadline=None)
@given(corpus=corpora(), batching=synchronised(), world_size=st.integers(1, 6), epoch=st.integers(0, 2))
def test_synchronised_plans_keep_every_sample_once_equal_ranks_and_one_bucket_per_step(
    corpus: Corpus, batching: Batching, world_size: int, epoch: int
) -> None:
    shard_ids, durations, _ = corpus
    plan = plan_of(corpus, world_size, batching, epoch=epoch)
    again = plan_of(corpus, world_size, batching, epoch=epoch)
    assert batching.synchronised and plan.report == again.report
    for name in ("samples", "offsets", "rank_batches"):
        assert np.array_equal(getattr(plan, name), getattr(again, name)), "the plan is not deterministic"
    eligible = batching.eligible(durations)
    assert sorted(plan.samples.tolist()) == np.flatnonzero(eligible).tolist()  # formed: each eligible once
    assert plan.rank_batches.shape == (world_size, plan.num_batches)
    dealt = np.concatenate(
        [plan.batch(r, j) for r in range(world_size) for j in range(plan.num_batches)]
        or [np.zeros(0, np.int64)]
    )
    sizes = np.diff(plan.offsets)
    assert dealt.shape[0] == plan.samples.shape[0] - plan.dropped + plan.padded  # the reported remainder
    if batching.remainder == "drop":
        assert len(set(dealt.tolist())) == dealt.shape[0]  # no sample twice
    else:
        assert set(dealt.tolist()) == set(plan.samples.tolist())
        assert plan.padded <= (world_size - 1) * sizes.max(initial=0)
    buckets = bucket_of(durations, bucket_edges(durations, batching))
    step_buckets = [
        {int(buckets[plan.batch(r, j)[0]]) for r in range(world_size)} for j in range(plan.num_batches)
    ]
    for r in range(world_size):
        for j in range(plan.num_batches):
            assert len(set(buckets[plan.batch(r, j)].tolist())) == 1, "a batch mixes buckets"
    # Only the pooled leftover rounds (fewer than world_size per bucket) and a padded last round mix buckets.
    mixed = sum(len(found) > 1 for found in step_buckets)
    assert mixed <= len(set(buckets[plan.samples].tolist())) + (batching.remainder == "pad")


def balanced_steps(corpus: Corpus, world_size: int, batching: Batching) -> tuple[int, int]:
    """A full batch (one more of its longest sample would not fit) costs within (limit - longest, limit]:
    so in a step of full batches of one bucket, max - min cost < the step's most costly sample. Returns
    (such steps, steps)."""
    shard_ids, durations, _ = corpus
    plan = plan_of(corpus, world_size, batching)
    buckets = bucket_of(durations, bucket_edges(durations, batching))
    costs = step_costs(plan, durations, batching.quadratic_duration)
    found = 0
    for j in range(plan.num_batches):
        batches = [plan.batch(r, j) for r in range(world_size)]
        full = not any(underfull(durations[b], np.array([0, len(b)]), batching)[0] for b in batches)
        if full and len({int(buckets[b[0]]) for b in batches}) == 1:
            most = max(float(sample_cost(durations[b], batching.quadratic_duration).max()) for b in batches)
            assert costs[:, j].max() - costs[:, j].min() < most
            found += 1
    return found, plan.num_batches


@settings(max_examples=40, deadline=None)
@given(corpus=corpora(), world_size=st.integers(2, 6), quadratic=st.sampled_from([None, 15.0]))
def test_full_batches_of_a_step_differ_by_less_than_one_sample(
    corpus: Corpus, world_size: int, quadratic: float | None
) -> None:
    balanced_steps(
        corpus,
        world_size,
        Batching(max_duration=60.0, num_buckets=4, quadratic_duration=quadratic, remainder="drop"),
    )


@pytest.mark.parametrize("quadratic", [None, 15.0])
def test_most_steps_are_full_batches_of_one_bucket(quadratic: float | None) -> None:
    corpus = (np.arange(20_000) // 500).astype(np.uint32), duration_sample(20_000, seed=3), 40
    found, steps = balanced_steps(
        corpus,
        8,
        Batching(max_duration=300.0, num_buckets=10, quadratic_duration=quadratic, remainder="drop"),
    )
    assert found >= 0.85 * steps


@pytest.mark.parametrize("world_size", [8, 64])
@pytest.mark.parametrize("quadratic", [None, 15.0])
def test_step_efficiency_on_librispeech_like_durations(world_size: int, quadratic: float | None) -> None:
    durations = duration_sample(60_000, seed=2)
    shard_ids = (np.arange(60_000) // 1000).astype(np.uint32)
    efficiency, padding = {}, {}
    for sync in (False, True):
        batching = Batching(
            max_duration=600.0, num_buckets=30, quadratic_duration=quadratic, sync_buckets=sync
        )
        plan = plan_epoch(shard_ids, durations, 60, seed=0, epoch=0, world_size=world_size, batching=batching)
        costs = step_costs(plan, durations, quadratic)
        efficiency[sync] = step_efficiency(costs[:, :-1])  # the last step is padded
        assert plan.report["step_efficiency"] == pytest.approx(
            step_efficiency(costs), abs=1e-6
        )  # over all steps
        padding[sync] = plan.report["padding_ratio"]
    assert efficiency[True] >= 0.98 > efficiency[False]
    assert padding[True] <= padding[False] + 0.002


@pytest.mark.parametrize("world_size", [8, 64])
def test_without_buckets_sync_buckets_balances_cost_alone(world_size: int) -> None:
    durations = duration_sample(60_000, seed=2)
    shard_ids = (np.arange(60_000) // 1000).astype(np.uint32)
    efficiency = {}
    for sync in (None, True):
        plan = plan_epoch(
            shard_ids,
            durations,
            60,
            seed=0,
            epoch=0,
            world_size=world_size,
            batching=Batching(max_duration=600.0, sync_buckets=sync),
        )
        efficiency[sync] = step_efficiency(step_costs(plan, durations, None)[:, :-1])
    assert efficiency[True] >= 0.98 > efficiency[None]


def test_a_named_batch_cost_balances_steps_and_is_recorded() -> None:
    durations = duration_sample(20_000, seed=4)
    shard_ids = (np.arange(20_000) // 500).astype(np.uint32)

    def samples(durations: np.ndarray) -> float:  # e.g. a per-utterance overhead dominates
        return float(durations.shape[0])

    batching = Batching(max_duration=300.0, num_buckets=10, batch_cost=samples, batch_cost_name="samples-v1")
    plan = plan_epoch(shard_ids, durations, 40, seed=0, epoch=0, world_size=8, batching=batching)
    counts = np.array(
        [[len(plan.batch(r, j)) for j in range(plan.num_batches)] for r in range(8)], dtype=float
    )
    assert step_efficiency(counts[:, :-1]) >= 0.98
    options = options_of(batching, Ordering())
    assert options["batch_cost"] == "samples-v1" and options["sync_buckets"] is True
    assert json.loads(json.dumps(options)) == options
    assert "batch_cost" not in options_of(Batching(max_duration=300.0), Ordering())
    for plain in (
        Batching(max_duration=300.0),
        Batching(max_duration=300.0, num_buckets=10, sync_buckets=False),
    ):
        assert "sync_buckets" not in options_of(plain, Ordering())  # states from before sync_buckets load
    broken = Batching(
        max_duration=300.0, num_buckets=10, batch_cost=lambda d: float("nan"), batch_cost_name="nan"
    )
    with pytest.raises(OptionError, match="'nan' returned nan"):
        plan_epoch(shard_ids, durations, 40, seed=0, epoch=0, world_size=8, batching=broken)


@pytest.mark.parametrize(
    "returned, shown",
    [
        ("1.5", r"a str \('1.5'\)"),
        (None, r"a NoneType \(None\)"),
        (True, r"a bool \(True\)"),
        ([1.0], "a list"),
    ],
)
def test_a_batch_cost_that_returns_no_number_is_an_option_error_naming_it(
    returned: object, shown: str
) -> None:
    """A string (even one float() takes), None, a bool or a list from ``batch_cost``: an OptionError naming
    ``batch_cost`` and the type (main 2e2a2c2: a bare ValueError/TypeError, or "1.5" taken as 1.5)."""
    durations = duration_sample(2_000, seed=5)
    shard_ids = (np.arange(2_000) // 100).astype(np.uint32)
    broken = Batching(
        max_duration=60.0, num_buckets=4, batch_cost=lambda d: returned, batch_cost_name="broken-v1"
    )
    with pytest.raises(OptionError, match=rf"batch_cost 'broken-v1' returned {shown}"):
        plan_epoch(shard_ids, durations, 40, seed=0, epoch=0, world_size=2, batching=broken)
    for fine in (np.float32(2.0), np.int64(3), np.array(4.0), 5):
        good = Batching(
            max_duration=60.0, num_buckets=4, batch_cost=lambda d, f=fine: f, batch_cost_name="fine"
        )
        plan_epoch(shard_ids, durations, 40, seed=0, epoch=0, world_size=2, batching=good)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(batch_size=4, num_buckets=3, sync_buckets="yes"), "sync_buckets"),
        (dict(max_duration=9.0, num_buckets=3, batch_cost=len), "together"),
        (dict(max_duration=9.0, num_buckets=3, batch_cost_name="x"), "together"),
        (dict(max_duration=9.0, num_buckets=3, batch_cost=3, batch_cost_name="x"), "function"),
        (dict(max_duration=9.0, num_buckets=3, batch_cost=len, batch_cost_name=""), "non-empty"),
        (
            dict(max_duration=9.0, num_buckets=3, sync_buckets=False, batch_cost=len, batch_cost_name="n"),
            "sync",
        ),
        (dict(max_duration=9.0, batch_cost=len, batch_cost_name="n"), "sync_buckets on"),
    ],
)
def test_bad_sync_options_are_option_errors(options: dict[str, Any], words: str) -> None:
    with pytest.raises(OptionError, match=words):
        Batching(**options)


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    corpus=corpora(),
    batching=synchronised(),
    sizes=st.lists(st.integers(1, 6), min_size=2, max_size=4),
)
def test_elastic_segments_consume_every_sample_once(
    data: st.DataObject, corpus: Corpus, batching: Batching, sizes: list[int]
) -> None:
    batching = Batching(**{**vars(batching), "remainder": "drop"})
    history: tuple[Segment, ...] = ()
    seen: Counter[int] = Counter()
    for world_size in sizes[:-1]:
        plan = plan_of(corpus, world_size, batching, history=history)
        consumed = data.draw(st.integers(0, plan.num_batches))
        seen += Counter(plan.consumed_samples(consumed).tolist())
        history += (Segment(world_size, consumed),)
    final = plan_of(corpus, sizes[-1], batching, history=history)
    seen += Counter(final.samples.tolist())
    assert seen == Counter(np.flatnonzero(batching.eligible(corpus[1])).tolist())


def test_mixed_plans_synchronise_steps_and_stay_exactly_once() -> None:
    rng = np.random.default_rng(0)
    corpora = {
        name: CorpusColumns(np.sort(rng.integers(0, 20, n)).astype(np.uint32), rng.uniform(lo, hi, n), 20)
        for name, n, lo, hi in (("short", 6000, 1.0, 6.0), ("long", 3000, 8.0, 20.0))
    }
    mix = Mix({"short": 1.0, "long": 1.0}, EpochSize(primary="long"))
    options: dict[str, Any] = dict(seed=1, epoch=0, ordering=Ordering(shuffle_shards=4))
    plans = {
        sync: plan_mix(
            corpora,
            mix,
            world_size=8,
            **options,
            batching=Batching(max_duration=200.0, num_buckets=8, sync_buckets=sync, remainder="drop"),
        )
        for sync in (False, True)
    }
    durations = np.concatenate([corpora["long"].durations, corpora["short"].durations])  # name order
    ids = {sync: plan.samples for sync, plan in plans.items()}
    for quadratic in (None, 15.0):  # padded batches of one bucket also balance a quadratic cost
        efficiency = {
            sync: step_efficiency(step_costs(plan, durations, quadratic)) for sync, plan in plans.items()
        }
        assert efficiency[True] >= 0.98 > efficiency[False]
    assert Counter(ids[True].tolist()) == Counter(ids[False].tolist())  # the same occurrences
    batching = Batching(max_duration=200.0, num_buckets=8, remainder="drop")
    before = plan_mix(corpora, mix, world_size=8, batching=batching, **options)
    after = plan_mix(corpora, mix, world_size=3, batching=batching, history=[Segment(8, 7)], **options)
    assert before.num_batches > 7
    seen = Counter(before.consumed_samples(7).tolist()) + Counter(after.samples.tolist())
    assert seen == Counter(before.samples.tolist())


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rounds")
    make_uneven_dataset(directory, [30, 12, 25, 18], seed=5, duration_range=(0.1, 1.2))
    return directory


def test_a_synchronised_dataset_resumes_exactly_and_refuses_a_changed_cost(dataset_dir: Path) -> None:
    def make(**batching: Any) -> ShardDataset:
        return ShardDataset(
            dataset_dir,
            batching=Batching(max_duration=2.5, num_buckets=3, **batching),
            seed=4,
            ordering=Ordering(shuffle_shards=2),
            world=World(rank=1, world_size=2),
        )

    whole = [list(batch["keys"]) for batch in make()]
    assert make().batching.synchronised and len(whole) >= 6
    first = make()
    taken, state = [], None
    for batch in first:
        taken.append(list(batch["keys"]))
        state = first.state_after(batch)
        if len(taken) == 4:
            break
    assert state is not None
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert taken + [list(batch["keys"]) for batch in resumed] == whole
    named = make(batch_cost=len, batch_cost_name="count")
    with pytest.raises(StateError, match="batch_cost"):
        named.load_state_dict(state)
    unsynchronised = make(sync_buckets=False).state_dict()  # as saved before sync_buckets existed
    with pytest.raises(StateError, match="sync_buckets"):
        make().load_state_dict(unsynchronised)
    renamed = make(batch_cost=len, batch_cost_name="count-v2")
    with pytest.raises(StateError, match="batch_cost"):
        renamed.load_state_dict(named.state_dict())
