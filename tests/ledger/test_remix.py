"""Re-mix at resume (``shardio.remix``): new weights, corpora added and dropped, every pass kept whole."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import Batching, EpochSize, Mix, Ordering, StateError, World
from shardio.datasets.mixed import MixedDataset
from shardio.ledger.quarantine import quarantine, quarantine_report
from shardio.ledger.remix import remix
from shardio.planning.mix import CorpusColumns, mix_quotas, plan_mix


def whole_passes(counts: Counter[int], size: int, total: int) -> bool:
    """Whether ``total`` stream positions over ``size`` samples were taken as whole passes in turn: every
    sample ``total // size`` or one more times, ``total`` in all."""
    full = total // size
    return sum(counts.values()) == total and all(counts.get(i, 0) in (full, full + 1) for i in range(size))


def corpus(n: int, num_shards: int, seed: int) -> CorpusColumns:
    rng = np.random.default_rng(seed)
    shard_ids = np.sort(rng.integers(0, num_shards, n)).astype(np.uint32)
    return CorpusColumns(shard_ids, rng.uniform(1, 5, n), num_shards)


@settings(max_examples=60, deadline=None)
@given(
    old=st.lists(st.floats(0.1, 1), min_size=2, max_size=2),
    new=st.lists(st.floats(0.1, 1), min_size=2, max_size=2),
    at=st.integers(1, 3),
    after=st.integers(1, 3),
    seed=st.integers(0, 20),
    world=st.integers(1, 3),
)
def test_pass_accounting_continues_across_a_remix(
    old: list[float], new: list[float], at: int, after: int, seed: int, world: int
) -> None:
    corpora = {"a": corpus(40, 5, seed), "b": corpus(9, 2, seed + 1)}
    batching = Batching(max_duration=12.0)
    mixes = [Mix(dict(zip("ab", weights)), EpochSize(hours=0.05)) for weights in (old, new)]
    quotas = [mix_quotas(corpora, m, batching, seed=seed) for m in mixes]
    cursors = {name: at * quotas[0][name] for name in corpora}
    seen: dict[str, Counter[int]] = {name: Counter() for name in corpora}
    offsets = {"a": 0, "b": 40}
    for epoch in range(at + after):
        mix, extra = (mixes[0], {}) if epoch < at else (mixes[1], {"cursors": cursors, "since": at})
        plan = plan_mix(corpora, mix, seed=seed, epoch=epoch, world_size=world, batching=batching, **extra)
        for i in plan.samples.tolist():
            name = "a" if i < 40 else "b"
            seen[name][i - offsets[name]] += 1
    for name in corpora:
        total = at * quotas[0][name] + after * quotas[1][name]
        assert whole_passes(seen[name], len(corpora[name].durations), total)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("remix")
    make_uneven_dataset(root / "big", [20, 14, 9], seed=1, duration_range=(0.1, 0.3))
    make_uneven_dataset(root / "mid", [4, 3], seed=2, duration_range=(0.5, 0.9))
    make_uneven_dataset(root / "tiny", [2], seed=3, duration_range=(0.2, 0.4))
    return {name: str(root / name) for name in ("big", "mid", "tiny")}


def mixed(sources: dict[str, str], weights: dict[str, float], world: World = World(0, 2)) -> MixedDataset:
    return MixedDataset(
        {n: sources[n] for n in weights},
        weights,
        EpochSize(hours=0.006),
        world=world,
        seed=3,
        ordering=Ordering(shuffle_shards=2),
        batching=Batching(max_duration=2.0),
    )


def taken(ds: MixedDataset, epoch: int) -> Counter[tuple[str, str]]:
    ds.set_epoch(epoch)
    return Counter((ds.index.corpus(i), ds.index.keys[i]) for i in ds.plan().samples.tolist())


def test_remix_changes_weights_adds_and_drops_corpora_and_keeps_every_pass(sources: dict[str, str]) -> None:
    old = mixed(sources, {"big": 0.5, "mid": 0.5})
    new = mixed(sources, {"big": 0.3, "tiny": 0.7})
    seen = taken(old, 0) + taken(old, 1)
    old.set_epoch(2)
    at_two = old.state_dict()
    with pytest.raises(StateError, match="mix"):
        new.load_state_dict(at_two)  # only through the explicit path
    state = json.loads(json.dumps(remix(at_two, old, new)))
    resumed = mixed(sources, {"big": 0.3, "tiny": 0.7})
    resumed.load_state_dict(state)
    assert resumed.epoch == 2
    seen += taken(resumed, 2) + taken(resumed, 3)
    for name, size in (("big", 43), ("tiny", 2)):
        keys = sorted(key for c, key in seen if c == name)
        counts = Counter({keys.index(key): n for (c, key), n in seen.items() if c == name})
        assert len(keys) == size and whole_passes(counts, size, sum(counts.values()))
    batches = list(resumed)  # real shards, read: the new mix yields its planned batches
    assert len(batches) == len(resumed) and {c for b in batches for c in b["corpus"]} <= {"big", "tiny"}
    after_last = resumed.state_after(batches[-1])  # the end of epoch 3: the next re-mix plays from epoch 4
    back = mixed(sources, {"big": 0.5, "mid": 0.5})
    again = remix(after_last, resumed, back)
    assert again["epoch"] == 4 and again["extra"]["remix"]["cursors"]["tiny"] > 0  # kept while dropped


def test_a_carried_quarantine_moves_to_the_new_mix(sources: dict[str, str]) -> None:
    old = mixed(sources, {"big": 0.5, "tiny": 0.5})
    healed = quarantine(old.state_dict(), old, keys=["s000_00001"], carry=True)  # in big and in tiny
    assert [old.index.corpus(i) for i in healed["extra"]["quarantine"][0]["ids"]] == ["big", "tiny"]
    assert [(r["key"], r["corpus"]) for r in quarantine_report(healed)] == [
        ("s000_00001", "big"),
        ("s000_00001", "tiny"),
    ]
    played = mixed(sources, {"big": 0.5, "tiny": 0.5})
    played.load_state_dict(healed)
    last = played.state_after(list(played)[-1])  # the epoch played to its end, without them
    new = mixed(sources, {"big": 0.4, "mid": 0.3, "tiny": 0.3})  # mid comes first of tiny: tiny's ids move
    moved = remix(last, played, new)
    ids = moved["extra"]["quarantine"][0]["ids"]
    assert [new.index.corpus(i) for i in ids] == ["big", "tiny"]
    assert [new.index.keys[i] for i in ids] == ["s000_00001"] * 2
    resumed = mixed(sources, {"big": 0.4, "mid": 0.3, "tiny": 0.3})
    resumed.load_state_dict(moved)
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        samples = set(resumed.plan().samples.tolist())
        assert not samples & set(ids)
        assert any(new.index.corpus(i) == "mid" and new.index.keys[i] == "s000_00001" for i in samples)


def test_remix_of_a_changed_corpus_is_refused(sources: dict[str, str], tmp_path: Path) -> None:
    old = mixed(sources, {"big": 0.5, "mid": 0.5})
    make_uneven_dataset(tmp_path / "mid2", [5], seed=9)
    other = mixed({**sources, "mid": str(tmp_path / "mid2")}, {"big": 0.5, "mid": 0.5})
    old.set_epoch(1)
    with pytest.raises(StateError, match="another index"):
        remix(old.state_dict(), old, other)
