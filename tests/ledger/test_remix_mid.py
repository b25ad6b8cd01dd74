"""Re-mix in the middle of an epoch (``shardio.remix``): every corpus's passes stay exact across it.

The property plays a mix's epochs up to a stop point (same world, or after an elastic change 3 -> 2), re-mixes
there (new weights, a corpus added, one dropped and later re-added), plays on under any world, and checks
that the samples consumed, concatenated, are exactly each corpus's stream of passes from its start to where
its stream stands at the end: no sample of a pass seen twice, none skipped. ``SHARDIO_REMIX_EXAMPLES=N`` draws
more examples.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset

from shardio import Batching, EpochSize, Ordering, StateError, World
from shardio.datasets.mixed import MixedDataset
from shardio.ledger.remix import remix, remix_report
from shardio.planning.plan import EpochPlan, Segment
from shardio.planning.streams import stream_samples
from shardio.state import LoaderState
from shardio.world import Context

EXAMPLES = int(os.environ.get("SHARDIO_REMIX_EXAMPLES", "40"))
SEED = 5


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("remix_mid")
    make_uneven_dataset(root / "a", [9, 4, 12, 7, 3, 8], seed=1, duration_range=(0.1, 0.3))
    make_uneven_dataset(root / "b", [5, 6, 2, 4], seed=2, duration_range=(0.2, 0.6))
    make_uneven_dataset(root / "c", [3, 4], seed=3, duration_range=(0.1, 0.4))
    return {name: str(root / name) for name in "abc"}


def mixed(
    sources: dict[str, str], weights: dict[str, float], world: int, buckets: int | None, single: bool = False
) -> MixedDataset:
    """A mix of ``weights``' corpora; ``single``: one corpus per batch, an epoch of one pass over ``a``."""
    size = EpochSize(primary="a") if single else EpochSize(hours=0.012)
    return MixedDataset(
        {n: sources[n] for n in weights},
        weights,
        size,
        world=World(0, world),
        seed=SEED,
        ordering=Ordering(shuffle_shards=2),
        batching=Batching(max_duration=1.2, num_buckets=buckets),
        single_corpus_batches=single,
    )


class Ledger:
    """What the runs consumed, per corpus: a multiset of local sample ids."""

    def __init__(self) -> None:
        self.seen: dict[str, Counter[int]] = {}

    def add(self, ds: MixedDataset, ids: np.ndarray) -> None:
        for i in ids.tolist():
            name = ds.index.corpus(i)
            local = i - int(ds.index.offsets[ds.index.names.index(name)])
            self.seen.setdefault(name, Counter())[local] += 1


def planned(ds: MixedDataset, epoch: int, history: tuple[Segment, ...]) -> EpochPlan:
    """``ds``'s plan of ``epoch`` after ``history``, in its world, with the surgery of the state it loaded."""
    return ds.planner.plan(epoch, ds.ranks().world_size, history, ds.surgery)


def play(
    ds: MixedDataset, ledger: Ledger, epoch: int, history: tuple[Segment, ...] = (), upto: int | None = None
) -> int:
    """Consume ``epoch``'s current segment (after ``history``) up to batch ``upto`` (default: its end) in
    ``ds``'s world; return the segment's batches per rank."""
    plan = planned(ds, epoch, history)
    ledger.add(ds, plan.consumed_samples(plan.num_batches if upto is None else upto))
    assert plan.rank_batches.shape == (ds.ranks().world_size, plan.num_batches)
    return plan.num_batches


def state_at(ds: MixedDataset, epoch: int, history: tuple[Segment, ...], position: int) -> dict[str, Any]:
    return LoaderState(
        epoch=epoch,
        seed=ds.seed,
        index=ds.index.fingerprint,
        options=ds.options,
        world_size=ds.ranks().world_size,
        history=history,
        start=position,
        extra=ds.surgery.to_extra(),
    ).to_dict()


def resumed(
    sources: dict[str, str],
    weights: dict[str, float],
    world: int,
    shape: tuple[int | None, bool],
    state: dict[str, Any],
) -> MixedDataset:
    ds = mixed(sources, weights, world, *shape)
    ds.load_state_dict(json.loads(json.dumps(state)))
    return ds


def expected(ds: MixedDataset, name: str, cursor: int, pending: list[list[int]]) -> Counter[int]:
    """The local ids of corpus ``name``'s stream positions ``[0, cursor)`` except ``pending``."""
    columns = ds.index.columns_of()[name]
    keep = ds.batching.eligible(np.asarray(columns.durations, dtype=np.float64))
    held = set(p for a, b in pending for p in range(a, b))
    positions = np.array([p for p in range(cursor) if p not in held], dtype=np.int64)
    return Counter(stream_samples(columns, keep, ds.ordering, ds.seed, name, positions)[0].tolist())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    change=st.sampled_from(["weights", "add", "drop"]),
    epoch=st.integers(0, 1),
    elastic=st.booleans(),
    world=st.integers(1, 3),
    again=st.booleans(),
    shape=st.tuples(st.sampled_from([None, 2]), st.booleans()),
    weights=st.lists(st.floats(0.2, 1.0), min_size=3, max_size=3),
)
@pytest.mark.slow
def test_mid_epoch_remix_keeps_every_corpus_pass_exact(
    sources: dict[str, str],
    data: st.DataObject,
    change: str,
    epoch: int,
    elastic: bool,
    world: int,
    shape: tuple[int | None, bool],
    again: bool,
    weights: list[float],
) -> None:
    old_weights = {"a": weights[0], "b": weights[1]}
    new_weights = {
        "weights": {"a": weights[1], "b": weights[2]},
        "add": {**old_weights, "c": weights[2]},
        "drop": {"a": weights[2]},
    }[change]
    ledger = Ledger()
    old = mixed(sources, old_weights, 3 if elastic else 2, *shape)
    for e in range(epoch):
        play(old, ledger, e)
    history: tuple[Segment, ...] = ()
    if elastic:  # 3 ranks consume some batches, then 2
        first = planned(old, epoch, ()).num_batches
        k1 = data.draw(st.integers(0, first), label="k1")
        play(old, ledger, epoch, upto=k1)
        history = (Segment(3, k1),)
        old = mixed(sources, old_weights, 2, *shape)
    position = data.draw(st.integers(0, planned(old, epoch, history).num_batches), label="position")
    play(old, ledger, epoch, history, upto=position)
    saved = state_at(old, epoch, history, position)

    state = remix(saved, old, mixed(sources, new_weights, 1, *shape))
    assert state == remix(saved, old, mixed(sources, new_weights, 1, *shape))  # deterministic
    assert len(json.dumps(state)) < 8000  # small: ranges, not ids
    new, weights_now = resumed(sources, new_weights, world, shape, state), new_weights
    now = state["epoch"]
    if now == epoch and again:  # a second re-mix inside the rest of the epoch, to all three corpora
        tail = new._progress.live(Context()).history
        k = data.draw(st.integers(0, planned(new, epoch, tail).num_batches), label="k")
        play(new, ledger, epoch, tail, upto=k)
        third = {"a": weights[2], "b": weights[0], "c": weights[1]}
        state = remix(state_at(new, epoch, tail, k), new, mixed(sources, third, 1, *shape))
        new, weights_now, now = resumed(sources, third, world, shape, state), third, state["epoch"]
    if now == epoch:  # the rest of the epoch (whatever world loads it), then one epoch of the new mix
        play(new, ledger, epoch, new._progress.live(Context()).history)
        now += 1
    play(new, ledger, now)
    last = now
    if "b" not in weights_now:  # b comes back: first its pending positions, then on after its slice
        new = resumed(
            sources,
            old_weights,
            world,
            shape,
            remix(
                state_at(new, last, (), planned(new, last, ()).num_batches),
                new,
                mixed(sources, old_weights, 1, *shape),
            ),
        )
        last += 1
        play(new, ledger, last)
    for _ in range(12):  # on until every stream's pending positions (a dropped corpus's) are replayed
        final = remix(state_at(new, last, (), planned(new, last, ()).num_batches), new, new)
        if not final["extra"]["remix"].get("pending"):
            break
        last += 1
        play(new, ledger, last)
    end, rows = final["extra"]["remix"], remix_report(final)
    event(f"re-mixed at {rows[0]['at']}, {sum(1 for r in rows if r['at'] == 'mid-epoch') // 2} mid-epoch")
    assert {row["status"] for row in rows} <= {"kept", "added", "dropped"} and rows[0]["epoch"] == epoch
    assert not end.get("pending")
    for name, seen in ledger.seen.items():
        assert seen == expected(new, name, end["cursors"][name], []), name


def test_stateful_dataloader_with_workers_resumes_a_mid_epoch_remix(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Through the resume harness: a StatefulDataLoader with 2 workers stops mid-epoch, the state is re-mixed
    (new weights), a fresh job with 2 workers plays the rest of the epoch and the next: it yields exactly
    the re-mixed plan (keys and augmentation draws), and the epoch's samples are the old plan's, each once."""
    from resume_harness import Case, life, make_dataset, record, write_corpora

    dirs = write_corpora(tmp_path_factory.mktemp("remix_corpora"))
    old_case = Case(mixed=True, loader="stateful", workers=2, epochs=2)
    new_case = Case(
        mixed=True,
        loader="stateful",
        workers=2,
        epochs=2,
        ds_load=True,
        weights=(("main", 0.4), ("extra", 0.6)),
    )
    before, saved = life(old_case, dirs, None, None, 5)
    assert saved is not None and len(before) == 5
    state = remix(saved, make_dataset(old_case, dirs), make_dataset(new_case, dirs))
    assert state["epoch"] == 0 and state["extra"]["remix"]["tail"]["epoch"] == 0
    after, _ = life(new_case, dirs, None, json.loads(json.dumps(state)), None)

    alone = make_dataset(new_case, dirs)  # the re-mixed state played in this process
    alone.load_state_dict(state)
    planned = []
    for epoch in (0, 1):
        alone.set_epoch(epoch)
        planned += [record(batch) for batch in alone]
    assert after == planned
    straight = make_dataset(old_case, dirs)  # one rank: no padding, the epoch's samples are the old plan's
    straight.set_epoch(0)
    old_epoch = Counter(key for _, keys, _ in (record(b) for b in straight) for key in keys)
    played = Counter(key for epoch, keys, _ in before + after if epoch == 0 for key in keys)
    assert played == old_epoch


def test_trace_and_quarantine_follow_the_rest_of_a_remixed_epoch(sources: dict[str, str]) -> None:
    from shardio import Trace, quarantine

    old = mixed(sources, {"a": 0.5, "b": 0.5}, 2, None)
    saved = state_at(old, 0, (), 3)
    state = remix(saved, old, mixed(sources, {"a": 0.3, "b": 0.7}, 1, None))
    new = resumed(sources, {"a": 0.3, "b": 0.7}, 2, (None, False), state)
    plan = planned(new, 0, ())
    trace = Trace(new, state)
    assert [r.ids.tolist() for r in trace.steps(0, 0, 2)] == [
        plan.batch(r, j).tolist() for j in (0, 1) for r in (0, 1)
    ]
    left_out = plan.batch(1, 2)  # quarantined before it is played: the rest of the epoch goes on without it
    ahead = state_at(new, 0, (), 1)
    cut = quarantine(ahead, new, keys=[new.index.keys[i] for i in left_out.tolist()])
    gone = set(cut["extra"]["quarantine"][0]["ids"])  # a key both corpora hold: left out of each
    assert gone >= set(left_out.tolist())
    healed = resumed(sources, {"a": 0.3, "b": 0.7}, 2, (None, False), cut)
    rest = planned(healed, 0, healed._progress.live(Context()).history)
    played = Counter(plan.consumed_samples(1).tolist()) + Counter(
        rest.consumed_samples(rest.num_batches).tolist()
    )
    assert not gone & set(rest.samples.tolist())
    assert set(played) == set(plan.samples.tolist()) - (gone - set(plan.consumed_samples(1).tolist()))


def test_a_malformed_or_foreign_remix_record_is_a_state_error(
    sources: dict[str, str], tmp_path: Path
) -> None:
    old = mixed(sources, {"a": 0.5, "b": 0.5}, 2, None)
    state = remix(state_at(old, 0, (), 2), old, mixed(sources, {"a": 0.5}, 1, None))
    for broken, match in ((["x"], "stream range"), ([[5, 3]], "stream range"), ([[-1, 2]], "stream range")):
        bad = json.loads(json.dumps(state))
        bad["extra"]["remix"]["tail"]["positions"]["a"] = broken
        with pytest.raises(StateError, match=match):
            mixed(sources, {"a": 0.5}, 2, None).load_state_dict(bad)
    foreign = json.loads(json.dumps(state))
    foreign["extra"]["remix"]["tail"]["positions"]["zz"] = [[0, 2]]
    with pytest.raises(StateError, match="zz"):
        mixed(sources, {"a": 0.5}, 2, None).load_state_dict(foreign)
    make_uneven_dataset(tmp_path / "b2", [5, 4], seed=9)
    at_end = state_at(resumed(sources, {"a": 0.5}, 2, (None, False), state), 0, (), 0)
    with pytest.raises(
        StateError, match="another index"
    ):  # b comes back re-packed: its pending cannot continue
        remix(
            at_end,
            mixed(sources, {"a": 0.5}, 2, None),
            mixed({**sources, "b": str(tmp_path / "b2")}, {"a": 0.5, "b": 0.5}, 1, None),
        )


def test_the_cli_remixes_a_saved_state_mid_epoch(
    sources: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    old = mixed(sources, {"a": 0.5, "b": 0.5}, 2, None)
    saved = state_at(old, 0, (), 2)
    (tmp_path / "state.json").write_text(json.dumps(saved))
    args = [
        "remix",
        *(f"{n}={sources[n]}" for n in "abc"),
        "--state",
        str(tmp_path / "state.json"),
        "--weight",
        "a=0.4",
        "--weight",
        "c=0.6",
        "--out",
        str(tmp_path / "new.json"),
    ]
    assert main(args) == 0
    written = json.loads((tmp_path / "new.json").read_text())
    assert written == remix(saved, old, mixed(sources, {"a": 0.4, "c": 0.6}, 1, None))
    out = capsys.readouterr().out
    assert "mid-epoch" in out and "b\tdropped" in out and "pending" in out and "c\tadded" in out
    assert main([*args[:-6], "--weight", "a=1", "--weight", "d=1", "--out", str(tmp_path / "x.json")]) == 2
