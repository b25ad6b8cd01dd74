"""Property tests of the pure planner (shardio.planning.plan): coverage, equal batch
counts, limits, determinism.

Corpora are synthetic index columns: shards of very different sizes (single-sample shards, fewer shards
than ranks x workers, several thousand samples so that duration batching spans several blocks) and
durations of 0.1-35 s. Batching is fixed-size or by ``max_duration`` (with ``max_batch_size``, quadratic
cost, duration filters and buckets). Every example plans in milliseconds; ``max_examples`` keeps it fast.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shardio.errors import OptionError
from shardio.planning.batches import BLOCK, batch_offsets
from shardio.planning.order import epoch_order, rng
from shardio.planning.plan import Batching, EpochPlan, Ordering, Segment, plan_epoch, worker_batches
from shardio.planning.rounds import deal

TOLERANCE = 1 + 1e-9
"""The planner's documented slack on ``max_duration`` (float rounding of count x longest)."""

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Corpus:
    """Index columns as the planner sees them."""

    shard_ids: np.ndarray
    durations: np.ndarray
    num_shards: int

    @property
    def size(self) -> int:
        """Number of samples."""
        return int(self.shard_ids.shape[0])


@st.composite
def corpora(draw: st.DrawFn, max_shards: int = 24) -> Corpus:
    """Shards of 1 to 400 samples (a third of them tiny), durations 0.1-35 s (some rounded, so ties occur)."""
    sizes = draw(
        st.lists(
            st.one_of(st.just(1), st.integers(1, 6), st.integers(1, 300), st.integers(100, 400)),
            min_size=1,
            max_size=max_shards,
        )
    )
    generator = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shard_ids = np.repeat(np.arange(len(sizes), dtype=np.uint32), sizes)
    durations = generator.uniform(0.1, 35.0, shard_ids.shape[0])
    if draw(st.booleans()):
        durations = np.round(durations, 1)
    return Corpus(shard_ids, durations, len(sizes))


def big_corpus() -> Corpus:
    """Several greedy blocks' worth of samples (hypothesis draws corpora this large only now and then)."""
    generator = np.random.default_rng(3)
    shard_ids = np.repeat(np.arange(30, dtype=np.uint32), generator.integers(1, 400, 30))
    return Corpus(shard_ids, generator.uniform(0.1, 35.0, shard_ids.shape[0]), 30)


REMAINDERS = st.sampled_from(["pad", "drop"])


@st.composite
def batchings(draw: st.DrawFn, bucketed: bool = True) -> Batching:
    """Fixed-size or duration batching, with or without duration filters, quadratic cost and buckets."""
    low = draw(st.one_of(st.none(), st.floats(0.0, 5.0)))
    high = draw(st.one_of(st.none(), st.floats(max(low or 0.0, 5.0), 40.0)))
    buckets = draw(st.one_of(st.none(), st.integers(1, 4))) if bucketed else None
    remainder = draw(REMAINDERS)
    if draw(st.booleans()):
        return Batching(
            batch_size=draw(st.integers(1, 40)),
            remainder=remainder,
            min_duration=low,
            max_sample_duration=high,
            num_buckets=buckets,
        )
    return Batching(
        max_duration=draw(st.floats(10.0, 300.0)),
        max_batch_size=draw(st.one_of(st.none(), st.integers(1, 24))),
        quadratic_duration=draw(st.one_of(st.none(), st.floats(5.0, 100.0))),
        remainder=remainder,
        min_duration=low,
        max_sample_duration=high,
        num_buckets=buckets,
    )


orderings = st.builds(Ordering, shuffle=st.booleans(), shuffle_shards=st.integers(1, 8))
worlds = st.integers(1, 8)
seeds = st.integers(0, 2**63 - 1)
epochs = st.integers(0, 10_000)


def plan_for(
    corpus: Corpus,
    world_size: int,
    batching: Batching,
    ordering: Ordering | None = None,
    *,
    seed: int = 0,
    epoch: int = 0,
    history: tuple[Segment, ...] = (),
) -> EpochPlan:
    """``plan_epoch`` over a synthetic corpus (default ordering when ``ordering`` is None)."""
    return plan_epoch(
        corpus.shard_ids,
        corpus.durations,
        corpus.num_shards,
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        batching=batching,
        ordering=ordering or Ordering(),
        history=history,
    )


def rank_samples(plan: EpochPlan, rank: int, batches: int | None = None) -> list[np.ndarray]:
    """The first ``batches`` (default: all) batches of ``rank``, through the public accessor."""
    return [plan.batch(rank, j) for j in range(plan.num_batches if batches is None else batches)]


def appearances(plan: EpochPlan, size: int, batches: int | None = None) -> np.ndarray:
    """How often each sample id occurs in the first ``batches`` batches of all ranks."""
    taken = [b for r in range(plan.world_size) for b in rank_samples(plan, r, batches)]
    return np.bincount(np.concatenate([np.zeros(0, np.int64), *taken]), minlength=size)


def cost(durations: np.ndarray, batching: Batching) -> np.ndarray:
    """A sample's cost toward ``max_duration``: its duration, plus ``d**2 / quadratic_duration`` if given."""
    quadratic = batching.quadratic_duration
    return durations if quadratic is None else durations + durations**2 / quadratic


def excluded_by(corpus: Corpus, batching: Batching) -> np.ndarray:
    """Samples outside the duration filters or alone above ``max_duration``: the planner leaves these out."""
    d = corpus.durations
    out = np.zeros(corpus.size, dtype=bool)
    if batching.min_duration is not None:
        out |= d < batching.min_duration
    if batching.max_sample_duration is not None:
        out |= d > batching.max_sample_duration
    if batching.max_duration is not None:
        out |= cost(d, batching) > batching.max_duration * TOLERANCE
    return out


# -- coverage and equal counts -------------------------------------------------------------------


@FAST
@given(
    corpus=corpora(), world_size=worlds, batching=batchings(), ordering=orderings, seed=seeds, epoch=epochs
)
@example(
    corpus=big_corpus(),
    world_size=7,
    batching=Batching(max_duration=45.0, remainder="drop"),
    ordering=Ordering(),
    seed=5,
    epoch=1,
)
def test_each_sample_once_except_the_reported_remainder(
    corpus: Corpus, world_size: int, batching: Batching, ordering: Ordering, seed: int, epoch: int
) -> None:
    plan = plan_for(corpus, world_size, batching, ordering, seed=seed, epoch=epoch)
    counts = appearances(plan, corpus.size)
    excluded = excluded_by(corpus, batching)
    assert plan.excluded == int(excluded.sum())
    assert not counts[excluded].any(), "a filtered-out or too long sample was planned"
    eligible = counts[~excluded]
    global_batches = plan.offsets.shape[0] - 1
    assert plan.rank_batches.shape == (world_size, plan.num_batches)
    if batching.remainder == "drop":
        assert plan.padded == 0 and eligible.max(initial=0) <= 1
        assert int((eligible == 0).sum()) == plan.dropped
        assert plan.num_batches == global_batches // world_size
    else:
        assert plan.dropped == 0 and eligible.min(initial=1) >= 1
        assert int((eligible - 1).sum()) == plan.padded
        assert plan.num_batches == -(-global_batches // world_size)
        assert plan.padded < world_size * max(1, int(np.diff(plan.offsets).max(initial=1)))
    for rank in range(world_size):
        assert all(batch.size > 0 for batch in rank_samples(plan, rank)), f"rank {rank} got an empty batch"
    expected = {
        "samples": corpus.size,
        "planned": int(plan.samples.shape[0]),
        "batches_per_rank": plan.num_batches,
        "excluded": plan.excluded,
        "dropped": plan.dropped,
        "padded": plan.padded,
    }
    assert {name: plan.report.get(name) for name in expected} == expected


def test_fewer_shards_and_batches_than_ranks_times_workers() -> None:
    corpus = Corpus(np.zeros(3, np.uint32), np.array([1.0, 2.0, 3.0]), 1)
    padded = plan_for(corpus, 8, Batching(batch_size=1, remainder="pad"))
    assert padded.num_batches == 1 and padded.padded == 5
    assert np.bincount([int(padded.batch(r, 0)[0]) for r in range(8)], minlength=3).min() >= 1
    assert [list(worker_batches(padded.num_batches, 0, w, 4)) for w in range(4)] == [[0], [], [], []]
    dropped = plan_for(corpus, 8, Batching(batch_size=1, remainder="drop"))
    assert dropped.num_batches == 0 and dropped.dropped == 3 and dropped.report["planned"] == 3


# -- batch limits --------------------------------------------------------------------------------


@FAST
@given(corpus=corpora(), world_size=worlds, batching=batchings(), seed=seeds)
@example(corpus=big_corpus(), world_size=3, batching=Batching(max_duration=60.0), seed=1)
@example(corpus=big_corpus(), world_size=8, batching=Batching(max_duration=200.0, max_batch_size=9), seed=2)
def test_batches_respect_their_limits_and_fill_greedily(
    corpus: Corpus, world_size: int, batching: Batching, seed: int
) -> None:
    plan = plan_for(corpus, world_size, batching, seed=seed)
    sizes = np.diff(plan.offsets)
    assert plan.offsets[0] == 0 and plan.offsets[-1] == plan.samples.shape[0] and (sizes > 0).all()
    greedy = batching.num_buckets is None  # buckets end batches early and shuffle the batch order
    if batching.batch_size is not None:
        assert (sizes <= batching.batch_size).all()
        if greedy:
            assert (sizes[:-1] == batching.batch_size).all()
        return
    assert batching.max_duration is not None
    cap = batching.max_batch_size or BLOCK
    limit = batching.max_duration * TOLERANCE
    costs = cost(corpus.durations, batching)[plan.samples]
    for b, (start, end) in enumerate(zip(plan.offsets[:-1].tolist(), plan.offsets[1:].tolist())):
        longest = costs[start:end].max()
        assert (end - start) * longest <= limit, f"batch {b}: {end - start} x {longest} s"
        assert end - start <= cap
        if greedy and end < costs.shape[0] and end % BLOCK != 0:  # the next sample would not have fitted
            grown = max(longest, costs[end])
            assert (end - start + 1) * grown > limit or end - start + 1 > cap, f"batch {b} stopped early"


@FAST
@given(
    durations=st.lists(st.floats(0.1, 35.0), min_size=0, max_size=60),
    max_duration=st.floats(0.05, 120.0),
    max_batch_size=st.one_of(st.none(), st.integers(1, 8)),
)
def test_duration_batches_match_a_plain_greedy_loop(
    durations: list[float], max_duration: float, max_batch_size: int | None
) -> None:
    """The vectorised greedy pass over one block equals the obvious loop (oversized samples stand alone)."""
    expected, count, longest = [0], 0, 0.0
    for i, duration in enumerate(durations):
        grown = max(longest, duration)
        if count and (grown * (count + 1) > max_duration * TOLERANCE or count == (max_batch_size or BLOCK)):
            expected.append(i)
            count, grown = 0, duration
        count, longest = count + 1, grown
    expected = expected + [len(durations)] if durations else [0]
    got = batch_offsets(
        np.array(durations, dtype=np.float64),
        Batching(max_duration=max_duration, max_batch_size=max_batch_size),
    )
    assert got.tolist() == expected


# -- order and determinism -----------------------------------------------------------------------


@FAST
@given(corpus=corpora(), ordering=orderings, seed=seeds, epoch=epochs)
def test_order_is_a_permutation_read_in_windows_of_shards(
    corpus: Corpus, ordering: Ordering, seed: int, epoch: int
) -> None:
    order = epoch_order(corpus.shard_ids, corpus.num_shards, seed=seed, epoch=epoch, ordering=ordering)
    assert np.array_equal(np.sort(order), np.arange(corpus.size))
    shards = corpus.shard_ids[order]
    if not ordering.shuffle:
        assert (np.diff(shards.astype(np.int64)) >= 0).all()
        return
    # Shards in order of first appearance, cut into windows of shuffle_shards: each window's samples
    # must be one contiguous stretch of the order, so a reader only ever has that many shards open.
    first_seen = shards[np.sort(np.unique(shards, return_index=True)[1])]
    position = 0
    for w in range(0, first_seen.shape[0], ordering.shuffle_shards):
        window = first_seen[w : w + ordering.shuffle_shards]
        length = int(np.isin(corpus.shard_ids, window).sum())
        assert np.isin(shards[position : position + length], window).all(), f"window {w} is interleaved"
        position += length
    assert position == corpus.size


@SLOW
@given(
    corpus=corpora(), world_size=worlds, batching=batchings(), ordering=orderings, seed=seeds, epoch=epochs
)
def test_same_inputs_same_plan_and_epochs_differ(
    corpus: Corpus, world_size: int, batching: Batching, ordering: Ordering, seed: int, epoch: int
) -> None:
    first = plan_for(corpus, world_size, batching, ordering, seed=seed, epoch=epoch)
    again = plan_for(corpus, world_size, batching, ordering, seed=seed, epoch=epoch)
    for name in ("samples", "offsets", "rank_batches"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert first.report == again.report
    if ordering.shuffle and corpus.size >= 20:  # identical orders by chance: at most 1 in 20!/...
        order = epoch_order(corpus.shard_ids, corpus.num_shards, seed=seed, epoch=epoch, ordering=ordering)
        other = epoch_order(
            corpus.shard_ids, corpus.num_shards, seed=seed, epoch=epoch + 1, ordering=ordering
        )
        assert not np.array_equal(order, other)


def test_rng_is_seeded_by_the_tuple_not_a_sum() -> None:
    assert not np.array_equal(rng(1, 2).integers(0, 2**62, 8), rng(2, 1).integers(0, 2**62, 8))
    assert not np.array_equal(rng(5, 0, 1).integers(0, 2**62, 8), rng(5, 0, 2).integers(0, 2**62, 8))
    corpus = Corpus(np.repeat(np.arange(10, dtype=np.uint32), 30), np.full(300, 2.0), 10)
    orders = {
        (seed, epoch): epoch_order(corpus.shard_ids, 10, seed=seed, epoch=epoch).tobytes()
        for seed, epoch in [(1, 2), (2, 1), (0, 3), (3, 0)]
    }
    assert len(set(orders.values())) == 4, "plans with equal seed + epoch coincide"


GOLDEN_PLAN_SHA256 = "f522ce17c262ac9797f7d1b9eac5b0cfc43dc997dd86b17b3f831f0b16169d91"


def test_plan_is_stable_across_processes_and_versions() -> None:
    """A fixed plan's exact content: ranks on other machines (or a resume after an upgrade) must agree.

    If this fails after a deliberate change to the planner, every saved state of an unfinished epoch
    resumes onto a different order: record the new digest only if that is intended.
    """
    generator = np.random.default_rng(7)
    shard_ids = np.repeat(np.arange(40, dtype=np.uint32), generator.integers(1, 400, 40))
    durations = np.round(generator.uniform(0.1, 35.0, shard_ids.shape[0]), 2)
    digest = hashlib.sha256()
    for batching in (
        Batching(batch_size=7),
        Batching(max_duration=90.0, max_batch_size=12, remainder="drop"),
    ):
        plan = plan_epoch(
            shard_ids,
            durations,
            40,
            seed=11,
            epoch=3,
            world_size=3,
            batching=batching,
            ordering=Ordering(shuffle_shards=4),
            history=(Segment(5, 9),),
        )
        for array in (plan.samples, plan.offsets, plan.rank_batches):
            digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    assert digest.hexdigest() == GOLDEN_PLAN_SHA256


# -- workers -------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.data(), num_batches=st.integers(0, 300), num_workers=st.integers(1, 16))
def test_worker_batches_split_a_rank_exactly_once_in_plan_order(
    data: st.DataObject, num_batches: int, num_workers: int
) -> None:
    start = data.draw(st.integers(0, num_batches))
    shares = [list(worker_batches(num_batches, start, w, num_workers)) for w in range(num_workers)]
    assert sorted(j for share in shares for j in share) == list(range(start, num_batches))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    # The DataLoader takes one batch from each worker in turn, from worker 0: that is plan order.
    turns = [shares[k % num_workers][k // num_workers] for k in range(num_batches - start)]
    assert turns == list(range(start, num_batches))


# -- elastic resume ------------------------------------------------------------------------------


@SLOW
@given(
    data=st.data(),
    corpus=corpora(max_shards=12),
    batching=batchings(),
    ordering=orderings,
    seed=seeds,
    epoch=epochs,
    sizes=st.lists(worlds, min_size=1, max_size=4),
)
def test_elastic_history_consumes_every_sample_once(
    data: st.DataObject,
    corpus: Corpus,
    batching: Batching,
    ordering: Ordering,
    seed: int,
    epoch: int,
    sizes: list[int],
) -> None:
    """Segments consume some batches under one world size each; the last segment plans the rest.

    All samples consumed in the finished segments plus all samples of the last segment's plan are every
    eligible sample exactly once, except the last plan's reported remainder (and, with ``pad``, the repeats
    that a finished segment consumed only if it ran to its very end).
    """
    excluded = excluded_by(corpus, batching)
    order = epoch_order(corpus.shard_ids, corpus.num_shards, seed=seed, epoch=epoch, ordering=ordering)
    history: tuple[Segment, ...] = ()
    counts = np.zeros(corpus.size, dtype=np.int64)
    repeats = 0
    for world_size in sizes[:-1]:
        plan = plan_for(corpus, world_size, batching, ordering, seed=seed, epoch=epoch, history=history)
        consumed = data.draw(st.integers(0, plan.num_batches), label=f"consumed of {plan.num_batches}")
        taken = appearances(plan, corpus.size, consumed)
        assert not (counts.astype(bool) & taken.astype(bool)).any(), "a consumed sample was planned again"
        segment_repeats = int(taken.sum() - (taken > 0).sum())
        assert segment_repeats == 0 or consumed == plan.num_batches, "repeats before the last round"
        repeats += segment_repeats
        counts += taken
        history += (Segment(world_size, consumed),)
    final = plan_for(corpus, sizes[-1], batching, ordering, seed=seed, epoch=epoch, history=history)
    rest = appearances(final, corpus.size)
    assert not (counts.astype(bool) & rest.astype(bool)).any(), "a consumed sample was planned again"
    counts += rest
    assert final.excluded == int(excluded.sum()) and not counts[excluded].any()
    eligible = counts[~excluded]
    if batching.remainder == "drop":
        assert repeats == 0 and eligible.max(initial=0) <= 1
        assert int((eligible == 0).sum()) == final.dropped
    else:
        assert eligible.min(initial=1) >= 1
        assert int((eligible - 1).sum()) == repeats + final.padded
    if batching.num_buckets is None:  # the rest keeps the epoch order (buckets re-sort within windows)
        rank_in_order = np.empty(corpus.size, np.int64)
        rank_in_order[order] = np.arange(corpus.size)
        assert (np.diff(rank_in_order[final.samples]) > 0).all()


def test_a_segment_cannot_consume_more_than_it_planned() -> None:
    corpus = Corpus(np.zeros(10, np.uint32), np.ones(10), 1)
    with pytest.raises(OptionError, match="consumed 6 batches"):
        plan_for(corpus, 2, Batching(batch_size=1), history=(Segment(2, 6),))


def test_deal_gives_round_robin_rounds() -> None:
    ranks, left_out = deal(7, 3, "pad")
    assert ranks.tolist() == [[0, 3, 6], [1, 4, 0], [2, 5, 1]] and left_out.size == 0
    ranks, left_out = deal(7, 3, "drop")
    assert ranks.tolist() == [[0, 3], [1, 4], [2, 5]] and left_out.tolist() == [6]
