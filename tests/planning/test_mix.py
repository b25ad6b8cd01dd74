"""Multi-corpus mixing: proportions, epoch sizes, passes across epochs, equal ranks,
resume; and MixedDataset."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_checks import assert_rest_consumes_each_once
from sample_shards import make_uneven_dataset

from shardio import Decoding, OptionError, StateError, World
from shardio.datasets.mixed import MixedDataset
from shardio.planning.batches import sample_cost
from shardio.planning.bucketing import bucket_of
from shardio.planning.mix import CorpusColumns, corpus_offsets, mix_quotas, plan_mix
from shardio.planning.mixoptions import EpochSize, Mix
from shardio.planning.plan import Batching, Ordering, Segment

ORDERING = Ordering(shuffle_shards=2)


def corpus(n: int, num_shards: int, low: float, high: float, seed: int) -> CorpusColumns:
    rng = np.random.default_rng(seed)
    return CorpusColumns(
        np.sort(rng.integers(0, num_shards, n)).astype(np.uint32), rng.uniform(low, high, n), num_shards
    )


def three_corpora(seed: int = 0, sizes: tuple[int, int, int] = (600, 80, 7)) -> dict[str, CorpusColumns]:
    """Very different sizes and durations: a big short-utterance corpus, a mid long one, a tiny one."""
    return {
        "aishell": corpus(sizes[0], 12, 1.0, 6.0, seed),
        "libri": corpus(sizes[1], 5, 8.0, 17.0, seed + 1),
        "inhouse": corpus(sizes[2], 1, 2.0, 4.0, seed + 2),
    }


WEIGHTS = {"aishell": 0.5, "libri": 0.3, "inhouse": 0.2}


def corpus_numbers(corpora: dict[str, CorpusColumns], ids: np.ndarray) -> np.ndarray:
    offsets = corpus_offsets([corpora[name].shard_ids.shape[0] for name in sorted(corpora)])
    return np.searchsorted(offsets, ids, side="right") - 1


def batches_of(plan: Any) -> list[np.ndarray]:
    return [plan.samples[plan.offsets[b] : plan.offsets[b + 1]] for b in range(plan.offsets.shape[0] - 1)]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 1000),
    weights=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    hours=st.floats(0.5, 3.0),
    weight_by=st.sampled_from(["duration", "samples"]),
    epoch=st.integers(0, 5),
)
def test_an_epoch_holds_each_corpus_in_proportion(
    seed: int, weights: list[float], hours: float, weight_by: str, epoch: int
) -> None:
    corpora = three_corpora(seed)
    mix = Mix(dict(zip(sorted(corpora), weights)), EpochSize(hours=hours), weight_by=weight_by)
    plan = plan_mix(
        corpora,
        mix,
        seed=seed,
        epoch=epoch,
        world_size=2,
        batching=Batching(max_duration=40.0),
        ordering=ORDERING,
    )
    numbers = corpus_numbers(corpora, plan.samples)
    durations = np.concatenate([corpora[name].durations for name in sorted(corpora)])[plan.samples]
    amount = np.bincount(numbers, weights=durations if weight_by == "duration" else None, minlength=3)
    expected = np.array([mix.weights[name] for name in sorted(corpora)])
    assert np.abs(amount / amount.sum() - expected).max() < (0.04 if weight_by == "duration" else 0.01)
    assert abs(durations.sum() / 3600 - hours) < 0.1 * hours  # the epoch is about `hours` of audio
    for name, stats in plan.report["corpora"].items():
        assert stats["samples"] == mix_quotas(corpora, mix, Batching(max_duration=40.0))[name]


def test_every_pass_of_every_corpus_is_taken_exactly_once_across_epochs() -> None:
    corpora = three_corpora(4)
    mix = Mix(WEIGHTS, EpochSize(primary="libri"))  # aishell spreads over epochs, inhouse repeats in each
    quotas = mix_quotas(corpora, mix)
    assert quotas["libri"] == 80 and quotas["aishell"] < 600 < 4 * quotas["aishell"] and quotas["inhouse"] > 7
    seen: Counter[int] = Counter()
    for epoch in range(4):
        plan = plan_mix(
            corpora,
            mix,
            seed=9,
            epoch=epoch,
            world_size=3,
            batching=Batching(batch_size=4),
            ordering=ORDERING,
        )
        libri = plan.samples[corpus_numbers(corpora, plan.samples) == 2]
        assert sorted(libri.tolist()) == list(range(600 + 7, 600 + 7 + 80))  # the primary: once per epoch
        seen.update(plan.samples.tolist())
    offsets = corpus_offsets([600, 7, 80])  # aishell, inhouse, libri
    for c, name in enumerate(sorted(corpora)):
        taken, size = 4 * quotas[name], corpora[name].shard_ids.shape[0]
        counts = np.array([seen[i] for i in range(offsets[c], offsets[c + 1])])
        assert counts.sum() == taken and set(counts.tolist()) <= {taken // size, taken // size + 1}, name


@st.composite
def mix_batchings(draw: st.DrawFn) -> Batching:
    buckets = draw(st.sampled_from([None, 1, 3]))
    if draw(st.booleans()):
        return Batching(
            batch_size=draw(st.integers(1, 6)),
            num_buckets=buckets,
            remainder=draw(st.sampled_from(["pad", "drop"])),
        )
    return Batching(
        max_duration=draw(st.sampled_from([20.0, 45.0])),
        num_buckets=buckets,
        quadratic_duration=draw(st.sampled_from([None, 30.0])),
        min_duration=1.5,
        remainder=draw(st.sampled_from(["pad", "drop"])),
    )


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 500),
    batching=mix_batchings(),
    single=st.booleans(),
    first=st.integers(1, 4),
    second=st.integers(1, 4),
    fraction=st.floats(0, 1),
    size=st.sampled_from([EpochSize(primary="aishell"), EpochSize(hours=0.6), EpochSize(batches=37)]),
)
def test_mix_plans_keep_limits_equal_ranks_and_exactly_once_on_an_elastic_resume(
    seed: int, batching: Batching, single: bool, first: int, second: int, fraction: float, size: EpochSize
) -> None:
    corpora = three_corpora(seed, sizes=(150, 40, 5))
    mix = Mix(WEIGHTS, size, single_corpus_batches=single)
    options: dict[str, Any] = dict(seed=seed, epoch=1, batching=batching, ordering=ORDERING)
    full = plan_mix(corpora, mix, world_size=first, **options)
    assert full.rank_batches.shape == (first, full.num_batches)
    if size.batches is not None:
        assert full.offsets.shape[0] - 1 == size.batches  # exactly that many global batches
        per_rank = -(-size.batches // first) if batching.remainder == "pad" else size.batches // first
        assert full.num_batches == per_rank
    durations = np.concatenate([corpora[name].durations for name in sorted(corpora)])
    edges = np.array(full.report.get("bucket_edges", []))
    for batch in batches_of(full):
        if batching.max_duration is not None:
            cost = sample_cost(durations[batch], batching.quadratic_duration).max()
            assert len(batch) * cost <= batching.max_duration * (1 + 1e-9)
            assert durations[batch].min() >= 1.5
        else:
            assert len(batch) <= batching.batch_size  # type: ignore[operator]
        if batching.bucketed:
            assert len(set(bucket_of(durations[batch], edges).tolist())) == 1
        if single:
            assert len(set(corpus_numbers(corpora, batch).tolist())) == 1
    consumed = int(fraction * full.num_batches)
    rest = plan_mix(corpora, mix, world_size=second, history=[Segment(first, consumed)], **options)
    assert rest.rank_batches.shape == (second, rest.num_batches)
    assert_rest_consumes_each_once(full, rest, consumed)


def test_the_plan_depends_on_seed_and_epoch_only() -> None:
    corpora, mix = three_corpora(1), Mix(WEIGHTS, EpochSize(primary="aishell"))

    def plan(seed: int, epoch: int) -> list[int]:
        batching = Batching(max_duration=30.0, num_buckets=3)
        return plan_mix(
            corpora, mix, seed=seed, epoch=epoch, world_size=2, batching=batching
        ).samples.tolist()

    assert plan(1, 2) == plan(1, 2) != plan(1, 3)
    assert plan(2, 2) != plan(1, 2)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: EpochSize(), "exactly one"),
        (lambda: EpochSize(primary="a", hours=1.0), "exactly one"),
        (lambda: EpochSize(batches=0), "batches"),
        (lambda: Mix({"a": 1.0}, EpochSize(primary="b")), "primary"),
        (lambda: Mix({"a": 1.0, "b": 0.0}, EpochSize(hours=1.0)), "weights"),
        (lambda: Mix({"a": 1.0}, EpochSize(hours=1.0), weight_by="bytes"), "weight_by"),
        (
            lambda: plan_mix(
                three_corpora(), Mix({"aishell": 1.0}, EpochSize(hours=1.0)), seed=0, epoch=0, world_size=1
            ),
            "weights name",
        ),
        (
            lambda: plan_mix(
                three_corpora(),
                Mix(WEIGHTS, EpochSize(hours=1.0)),
                seed=0,
                epoch=0,
                world_size=1,
                batching=Batching(batch_size=2, min_duration=7.0),
            ),
            "no sample",
        ),
        # a planned epoch of 10**15 hours allocated until a MemoryError (a saved state's mix can say so)
        (lambda: mix_quotas(three_corpora(), Mix(WEIGHTS, EpochSize(hours=1e15))), "smaller epoch_size"),
        (
            lambda: mix_quotas(
                three_corpora(), Mix(WEIGHTS, EpochSize(batches=10**12)), Batching(batch_size=4)
            ),
            "smaller epoch_size",
        ),
    ],
)
def test_bad_mix_options_are_option_errors(make: Any, words: str) -> None:
    with pytest.raises(OptionError, match=words):
        make()


# -- MixedDataset on real shards -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    make_uneven_dataset(root / "big", [20, 14, 9, 6], seed=1, duration_range=(0.1, 0.3))
    make_uneven_dataset(root / "mid", [4, 3], seed=2, duration_range=(0.5, 0.9))
    make_uneven_dataset(root / "tiny", [2], seed=3, duration_range=(0.2, 0.4))
    return {name: str(root / name) for name in ("big", "mid", "tiny")}


def mixed(sources: dict[str, str], world: World = World(), **options: Any) -> MixedDataset:
    options.setdefault("weights", {"big": 0.5, "mid": 0.3, "tiny": 0.2})
    return MixedDataset(
        sources,
        options.pop("weights"),
        EpochSize(primary="big"),
        world=world,
        seed=3,
        ordering=Ordering(shuffle_shards=2),
        batching=Batching(max_duration=2.0, num_buckets=2),
        **options,
    )


def identity(batches: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(corpus, key) for batch in batches for corpus, key in zip(batch["corpus"], batch["keys"])]


def test_mixed_batches_name_their_corpus_and_follow_the_plan(sources: dict[str, str]) -> None:
    dataset = mixed(sources)
    length, plan = len(dataset), dataset.plan()  # of the next iteration (after it: of the one after)
    batches = list(dataset)
    assert len(batches) == length == plan.num_batches
    planned = [plan.batch(0, j).tolist() for j in range(len(batches))]
    assert [[(dataset.index.corpus(i), dataset.index.keys[i]) for i in ids] for ids in planned] == [
        list(zip(b["corpus"], b["keys"])) for b in batches
    ]
    rates = {name: set() for name in sources}
    for batch in batches:
        for corpus, length in zip(batch["corpus"], batch["lengths"].tolist()):
            rates[corpus].add(length)
    assert max(rates["big"]) <= 0.3 * 8000 < min(rates["mid"])  # the audio is the named corpus's
    assert Counter(c for c, _ in identity(batches))["big"] == 49  # the primary, once


def test_mixed_dataset_resumes_exactly_and_elastically(sources: dict[str, str]) -> None:
    runs = [list(mixed(sources, World(r, 2))) for r in range(2)]
    state = mixed(sources, World(0, 2)).state_after(runs[0][2])  # 3 batches per rank consumed
    for r in range(2):  # same world: exactly the batches an uninterrupted run would have produced
        resumed = mixed(sources, World(r, 2))
        resumed.load_state_dict(state)
        assert identity(runs[r][:3]) + identity(list(resumed)) == identity(runs[r])
    yielded, lengths = [], set()
    for r in range(3):  # three ranks now: equal batch counts, and every occurrence left exactly once
        resumed = mixed(sources, World(r, 3))
        resumed.load_state_dict(state)
        lengths.add(len(resumed))
        plan = resumed.plan()  # the resumed epoch's (once iterated, the next epoch's)
        yielded += identity(list(resumed))
    index = resumed.index
    named = lambda ids: [(index.corpus(i), index.keys[i]) for i in ids.tolist()]  # noqa: E731
    left = named(plan.samples)  # the rest of the epoch, batched (before padding the last round)
    assert len(lengths) == 1 and set(yielded) == set(left) and len(yielded) >= len(left)
    consumed = sum((identity(run[:3]) for run in runs), [])
    assert Counter(consumed) + Counter(left) == Counter(named(mixed(sources, World(0, 2)).plan().samples))


def test_a_mixs_re_passes_are_real_samples_not_repeats(
    sources: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """One rank pads nothing: a sample of the tiny corpus met again in the epoch (its next pass) is trained
    on, so ``repeat`` stays False (a loss masked by it keeps every sample), and the world-change line counts
    only padding."""
    batches = list(mixed(sources))
    recurring = Counter(identity(batches))
    assert max(recurring.values()) > 1  # the tiny corpus repeats within the epoch ...
    assert not any(bool(batch["repeat"].any()) for batch in batches)  # ... and none of it is padding
    state = mixed(sources, World(0, 2)).state_after(list(mixed(sources, World(0, 2)))[1])
    resumed = mixed(sources, World(0, 1))
    with caplog.at_level("INFO", logger="shardio"):
        resumed.load_state_dict(state)
    assert "0 samples repeated on rank 0 to even the ranks (padding)" in caplog.text
    assert not any(bool(batch["repeat"].any()) for batch in resumed)


def test_a_state_from_another_mix_is_refused(sources: dict[str, str]) -> None:
    state = mixed(sources).state_dict()
    other = mixed(sources, weights={"big": 0.4, "mid": 0.4, "tiny": 0.2})
    with pytest.raises(StateError, match="mix"):
        other.load_state_dict(state)
    with pytest.raises(OptionError, match="batch_size and batching were both given"):
        MixedDataset(
            sources,
            {"big": 1, "mid": 1, "tiny": 1},
            EpochSize(hours=1),
            batching=Batching(batch_size=2),
            batch_size=3,
        )


def test_batching_keywords_reach_the_mix(sources: dict[str, str]) -> None:
    with pytest.warns(DeprecationWarning, match=r"MixedDataset\(quadratic_duration=\.\.\.\) is deprecated"):
        by_keywords = MixedDataset(
            sources,
            {"big": 0.5, "mid": 0.3, "tiny": 0.2},
            EpochSize(primary="big"),
            seed=3,
            max_duration=2.0,
            num_buckets=2,
            quadratic_duration=30.0,
        )
    assert by_keywords.batching == Batching(max_duration=2.0, num_buckets=2, quadratic_duration=30.0)
    explicit = MixedDataset(
        sources,
        {"big": 0.5, "mid": 0.3, "tiny": 0.2},
        EpochSize(primary="big"),
        seed=3,
        batching=Batching(max_duration=2.0, num_buckets=2, quadratic_duration=30.0),
    )
    assert by_keywords.plan().rank_batches.tolist() == explicit.plan().rank_batches.tolist()


def test_a_transform_sees_the_corpus(sources: dict[str, str]) -> None:
    def tag(sample: dict[str, Any], rng: Any) -> dict[str, Any]:
        sample["tagged"] = sample["corpus"]
        return sample

    batches = list(mixed(sources, decoding=Decoding(transform=tag)))
    assert all(batch["tagged"] == batch["corpus"] for batch in batches)
