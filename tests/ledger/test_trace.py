"""The data ledger (``shardio.ledger.trace``) and quarantine at resume, against real loaders on real shards.

Trace must agree with what the loader yielded, batch for batch: ranks are explicit ``World`` datasets in
one process, each read through a real 2-worker DataLoader, across an elastic resume and a mix. The
hypothesis properties run on the pure planner side (``Trace`` over in-memory indexes), so they stay fast.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset, memory_index
from torch.utils.data import DataLoader

from shardio import Batching, Decoding, EpochSize, OptionError, Ordering, ShardDataset, World
from shardio.datasets.mixed import MixedDataset
from shardio.ledger.quarantine import quarantine, quarantine_report
from shardio.ledger.trace import Trace

Rows = dict[tuple[int, int, int], list[str]]  # (epoch, step, rank) -> keys


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trace")
    make_uneven_dataset(root, [9, 30, 2, 17, 11], seed=4, duration_range=(0.05, 0.3))
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("trace_mix")
    make_uneven_dataset(root / "big", [20, 14, 9], seed=1, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "tiny", [3], seed=3, duration_range=(0.2, 0.3))
    return {name: str(root / name) for name in ("big", "tiny")}


def make(source: Any, world: World, **options: Any) -> ShardDataset:
    if "batching" not in options:
        options.setdefault("max_duration", 0.8)
    return ShardDataset(source, world=world, seed=5, ordering=Ordering(shuffle_shards=2), **options)


def run(ds: ShardDataset, step0: int = 0, stop: int | None = None) -> tuple[Rows, list[dict[str, Any]]]:
    """Keys per (epoch, step, rank) that a real 2-worker DataLoader yields, and the batches' states."""
    rows, states = {}, []
    for n, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
        if stop is not None and n == stop:
            break
        rows[(batch["epoch"], step0 + batch["batch_index"], ds.ranks().rank)] = list(batch["keys"])
        states.append(ds.state_after(batch))
    return rows, states


def traced(trace: Trace, epoch: int, first: int = 0) -> Rows:
    return {(r.epoch, r.step, r.rank): trace.row(r)["keys"] for r in trace.epoch(epoch) if r.step >= first}


def test_trace_agrees_with_a_multi_worker_multi_rank_run_across_an_elastic_resume(dataset_dir: Path) -> None:
    seen: Rows = {}
    first = {r: run(make(dataset_dir, World(r, 2)), stop=4) for r in range(2)}
    for rows, _ in first.values():
        seen.update(rows)
    state = json.loads(json.dumps(first[0][1][-1]))  # 4 steps consumed under 2 ranks; 3 ranks go on
    for r in range(3):
        ds = make(dataset_dir, World(r, 3))
        ds.load_state_dict(state)
        resumed_state = (
            ds.state_dict()
        )  # the rest of epoch 0 on 3 ranks (once the workers finish it: epoch 1)
        seen.update(run(ds, step0=4)[0])
    trace = Trace(make(dataset_dir, World()), resumed_state)
    assert trace.segments(0)[0][:2] == (2, 0) and trace.segments(0)[1][:2] == (3, 4)
    assert traced(trace, 0) == seen
    one = trace.steps(0, 5, rank=1)
    assert len(one) == 1 and trace.row(one[0])["keys"] == seen[(0, 5, 1)]
    key = seen[(0, 5, 1)][0]
    assert {(f["epoch"], f["step"], f["rank"]) for f in trace.find([key], [0])} == {
        place for place, keys in seen.items() if key in keys
    }
    with pytest.raises(OptionError, match="not in the dataset"):
        trace.find(["no-such-key"], [0])


@pytest.mark.parametrize("stop", [1, 3])
def test_trace_places_samples_workers_consumed_ahead_of_a_state_between_rounds(
    dataset_dir: Path, tmp_path: Path, stop: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks of collated samples from 2 workers each stop between rounds (worker 0 has handed over one
    batch more), three ranks resume. Every key the epoch trained is traced where it was consumed: those the
    workers consumed ahead of the state's position as ``ahead`` batches of the first
    segment (they were missing)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardio import collate
    from shardio.cli import main

    before: Counter[str] = Counter()
    for r in range(2):
        loader = StatefulDataLoader(
            make(dataset_dir, World(r, 2), max_duration=None), batch_size=3, collate_fn=collate, num_workers=2
        )
        for n, batch in enumerate(loader):
            before.update(batch["keys"])
            if n + 1 == stop:
                break
        if r == 0:
            state = loader.state_dict()
    after: Counter[str] = Counter()
    for r in range(3):
        ds = make(dataset_dir, World(r, 3), max_duration=None)
        ds.load_state_dict(state)
        if r == 0:
            saved = ds.state_dict()
        after.update(
            key for batch in DataLoader(ds, batch_size=3, collate_fn=collate) for key in batch["keys"]
        )
    assert set(before) | set(after) == set(ds.index.keys) and not set(before) & set(after)
    trace = Trace(make(dataset_dir, World(), max_duration=None), saved)
    records = list(trace.epoch(0))
    early = {key for record in records if record.ahead for key in trace.row(record)["keys"]}
    assert early and early < set(before)
    assert {key for r in records if r.segment == 0 for key in trace.row(r)["keys"]} == set(before)
    assert {key for r in records if r.segment == 1 for key in trace.row(r)["keys"]} == set(after)
    found = trace.find(list(ds.index.keys), [0])
    assert Counter(f["key"] for f in found if f["segment"] == 0) == before  # each once: unbatched, no padding
    assert {f["key"] for f in found if f.get("ahead")} == early
    first = min(early)
    report = quarantine_report(quarantine(saved, make(dataset_dir, World(), max_duration=None), keys=[first]))
    assert report[0]["already_consumed"]
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--key", first]) == 0
    assert capsys.readouterr().out.strip().endswith("(consumed ahead)")
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--epoch", "0", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(",")[8] == "ahead"
    assert {line.split(",")[5] for line in lines[1:] if line.split(",")[8] == "1"} == early


def test_the_ledger_leaves_a_live_dataset_as_it_was(dataset_dir: Path, sources: dict[str, str]) -> None:
    """Trace, quarantine and remix load the state into a copy: the dataset handed to them (mid-run, or fresh)
    still plays what it would have played. They used to share its progress: it jumped to
    the state's position."""
    from shardio.ledger.remix import remix

    def epoch(ds: ShardDataset, number: int | None = None, workers: int = 0) -> list[list[str]]:
        if number is not None:
            ds.set_epoch(number)
        return [list(batch["keys"]) for batch in DataLoader(ds, batch_size=None, num_workers=workers)]

    live = make(dataset_dir, World())
    for n, batch in enumerate(DataLoader(live, batch_size=None, num_workers=2)):
        if n == 2:
            state = live.state_after(batch)
            Trace(live, state)
            quarantine(state, live, keys=[live.index.keys[0]])
            break
    assert epoch(live, workers=2) == epoch(make(dataset_dir, World()), 1)  # after a break: the next epoch
    fresh = make(dataset_dir, World())
    Trace(fresh, state)
    assert epoch(fresh) == epoch(make(dataset_dir, World()), 0)

    def mix(weights: dict[str, float]) -> MixedDataset:
        return MixedDataset(
            sources,
            weights,
            EpochSize(primary="big"),
            world=World(),
            seed=2,
            ordering=Ordering(shuffle_shards=2),
            batching=Batching(max_duration=0.9),
        )

    old = mix({"big": 0.7, "tiny": 0.3})
    mid = old.state_after({"epoch": 0, "batch_index": 1})
    remix(mid, old, mix({"big": 0.5, "tiny": 0.5}))
    assert epoch(old) == epoch(mix({"big": 0.7, "tiny": 0.3}), 0)


def test_trace_agrees_with_a_mix_and_later_epochs(
    sources: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    def mix(world: World) -> MixedDataset:
        return MixedDataset(
            sources,
            {"big": 0.7, "tiny": 0.3},
            EpochSize(primary="big"),
            world=world,
            seed=2,
            ordering=Ordering(shuffle_shards=2),
            batching=Batching(max_duration=0.9, num_buckets=2),
        )

    seen: Rows = {}
    for r in range(2):
        ds = mix(World(r, 2))
        ds.set_epoch(1)
        seen.update(run(ds)[0])
    trace = Trace(mix(World()), mix(World(0, 2)).state_dict())
    table = {(r.epoch, r.step, r.rank): trace.row(r) for r in trace.epoch(1)}
    assert {place: row["keys"] for place, row in table.items()} == seen
    assert {c for row in table.values() for c in row["corpus"]} == {"big", "tiny"}
    tiny = next(key for row in table.values() for key, c in zip(row["keys"], row["corpus"]) if c == "tiny")
    found = trace.find([tiny], [1])  # the corpora share keys (s000_00000, ...): each is found, named
    assert {(f["step"], f["rank"], f["corpus"]) for f in found} == {
        (step, rank, c)
        for (_, step, rank), row in table.items()
        for key, c in zip(row["keys"], row["corpus"])
        if key == tiny
    }
    assert {f["corpus"] for f in found} == {"big", "tiny"}
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(mix(World(0, 2)).state_dict()))
    capsys.readouterr()
    locations = [f"{name}={location}" for name, location in sources.items()]
    assert (
        main(["trace", *locations, "--state", str(state_path), "--step", "2", "--in-epoch", "1", "--json"])
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == [table[(1, 2, 0)], table[(1, 2, 1)]]
    assert main(["trace", sources["big"], "--state", str(state_path), "--step", "2"]) == 2
    assert "NAME=LOCATION" in capsys.readouterr().err


def test_quarantine_leaves_the_keys_out_and_keeps_everything_else_exactly_once(dataset_dir: Path) -> None:
    world = 2
    rows = {}
    for r in range(world):
        got, states = run(make(dataset_dir, World(r, world)), stop=3)
        rows.update(got)
    state = states[-1]
    trace = Trace(make(dataset_dir, World()), state)
    later = trace.row(trace.steps(0, 6, rank=1)[0])["keys"]
    bad = [later[0], rows[(0, 1, 0)][0]]  # one still ahead, one already consumed
    healed = quarantine(json.loads(json.dumps(state)), make(dataset_dir, World()), keys=bad, carry=True)
    report = quarantine_report(healed)
    order = make(dataset_dir, World()).index.keys.index
    assert [row["key"] for row in report] == sorted(bad, key=order)
    assert {row["key"]: row["already_consumed"] for row in report} == {bad[0]: False, bad[1]: True}
    after, lengths = Counter(), set()
    for r in range(3):  # and the world grows at the same resume
        ds = make(dataset_dir, World(r, 3))
        ds.load_state_dict(healed)
        lengths.add(len(ds))
        got, _ = run(ds)
        after.update(k for keys in got.values() for k in keys)
    consumed = Counter(k for keys in rows.values() for k in keys)
    everything = set(make(dataset_dir, World()).index.keys)
    assert len(lengths) == 1 and bad[0] not in after
    assert set(after) | set(consumed) == everything - {bad[0]}
    assert not set(after) & set(consumed)
    carried = make(dataset_dir, World(0, 1))
    carried.load_state_dict(ds.state_dict())
    carried.set_epoch(1)
    next_epoch = [k for batch in carried for k in batch["keys"]]
    assert set(next_epoch) == everything - set(bad) and len(next_epoch) == len(set(next_epoch))
    assert quarantine_report(carried.state_dict()) == quarantine_report(healed)


def test_quarantine_of_steps_skips_every_ranks_batch_there(dataset_dir: Path) -> None:
    ds = make(dataset_dir, World(0, 2))
    state = ds.state_dict()
    trace = Trace(ds, state)
    skipped = {k for record in trace.steps(0, 2, 4) for k in trace.row(record)["keys"]}
    healed = quarantine(state, ds, steps=(2, 4))
    left = Trace(ds, healed)
    keys = [k for record in left.epoch(0) for k in left.row(record)["keys"]]
    assert not skipped & set(keys) and set(keys) == set(ds.index.keys) - skipped
    with pytest.raises(OptionError):
        quarantine(state, ds)


# -- properties on the planner side: in-memory indexes, no audio ------------------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 25), min_size=1, max_size=6),
    seed=st.integers(0, 50),
    worlds=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    fractions=st.lists(st.floats(0, 1), min_size=2, max_size=2),
    batch=st.sampled_from(
        [
            {"batch_size": 3},
            {"max_duration": 4.0},
            {"max_duration": 5.0, "num_buckets": 2},
            {"max_duration": 5.0, "num_buckets": 2, "sync_buckets": False},
        ]
    ),
    remainder=st.sampled_from(["pad", "drop"]),
    bad=st.integers(0, 10**6),
    mix=st.booleans(),
)
@pytest.mark.slow
def test_trace_follows_elastic_history_and_quarantine_keeps_exactly_once(
    sizes: list[int],
    seed: int,
    worlds: list[int],
    fractions: list[float],
    batch: dict[str, Any],
    remainder: str,
    bad: int,
    mix: bool,
) -> None:
    index = memory_index(sizes, seed)
    small = memory_index([2, 1], seed + 1, prefix="small")

    def build(world: int) -> ShardDataset:
        if mix:  # the small corpus repeats within the epoch: a quarantine drops each occurrence
            return MixedDataset(
                {"main": index, "small": small},
                {"main": 0.7, "small": 0.3},
                EpochSize(primary="main"),
                world=World(0, world),
                seed=seed,
                ordering=Ordering(shuffle_shards=2),
                batching=Batching(remainder=remainder, **batch),
            )
        return ShardDataset(
            index,
            world=World(0, world),
            seed=seed,
            ordering=Ordering(shuffle_shards=2),
            batching=Batching(remainder=remainder, **batch),
        )

    ds = build(worlds[0])
    state = ds.state_dict()
    for number, world in enumerate(worlds):  # the loader's own plans, segment after segment
        ds = build(world)
        ds.load_state_dict(state)
        plan, start = ds.plan(), ds.state_dict()["start"]
        last = number == len(worlds) - 1
        stop = plan.num_batches if last else start + int(fractions[number % 2] * (plan.num_batches - start))
        trace = Trace(ds, ds.state_dict())
        base = trace.segments(0)[-1][1]
        for j in range(start, stop):
            for r in range(world):
                [record] = trace.steps(0, base + j, rank=r)
                assert record.ids.tolist() == plan.batch(r, j).tolist()
        if not last:
            state = {**ds.state_dict(), "start": stop}
    final = ds.state_dict()  # where the last stage started, under worlds[-1]
    left = Trace(ds, final)
    plan = left.plan(0, len(left.segments(0)) - 1)
    remaining = Counter(plan.samples.tolist()) - Counter(plan.consumed_samples(final["start"]).tolist())
    if not remaining:
        return
    victim = sorted(remaining)[bad % len(remaining)]
    healed = quarantine(final, ds, keys=[ds.index.keys[victim]])
    after = Trace(ds, healed)
    plan = after.plan(0, len(after.segments(0)) - 1)
    del remaining[victim]
    assert Counter(plan.samples.tolist()) == remaining  # each occurrence once, the victim never
    assert plan.rank_batches.shape[0] == worlds[-1]  # equal counts for every rank, by the plan's shape
    if len(remaining) > 1:  # a second quarantine later in the same epoch, after one more step
        healed = {**healed, "start": min(1, plan.num_batches)}
        done = Counter(plan.consumed_samples(healed["start"]).tolist())
        second = sorted(remaining - done or remaining)[bad % len(remaining - done or remaining)]
        again = Trace(ds, quarantine(healed, ds, keys=[ds.index.keys[second]]))
        left = again.plan(0, len(again.segments(0)) - 1)
        expected = remaining - done
        expected.pop(second, None)
        assert Counter(left.samples.tolist()) == expected and victim not in expected
        assert [row["key"] for row in quarantine_report(again.state.to_dict())] == [
            ds.index.keys[victim],
            ds.index.keys[second],
        ]


def test_the_cli_traces_a_step_a_key_and_an_epoch_and_writes_a_quarantined_state(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    ds = make(dataset_dir, World(0, 2))
    state_path, out_path = tmp_path / "state.json", tmp_path / "healed.json"
    state_path.write_text(json.dumps(ds.state_dict()))
    trace = Trace(ds, ds.state_dict())
    capsys.readouterr()
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--step", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == [trace.row(r) for r in trace.steps(0, 3)] and [r["rank"] for r in rows] == [0, 1]
    key = rows[1]["keys"][0]
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--key", key, "--json"]) == 0
    assert [json.loads(line)["step"] for line in capsys.readouterr().out.splitlines()] == [3]
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--epoch", "1", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("epoch,step,rank") and len(lines) - 1 >= len(ds.index.keys)
    assert (
        main(
            ["quarantine", str(dataset_dir), "--state", str(state_path), "--key", key, "--out", str(out_path)]
        )
        == 0
    )
    assert key in capsys.readouterr().out
    healed = make(dataset_dir, World(0, 1))
    healed.load_state_dict(json.loads(out_path.read_text()))
    assert key not in {k for batch in healed for k in batch["keys"]}
    for sync in (False, True):  # a bucketed run, with and without step-synchronised buckets
        bucketed = make(
            dataset_dir, World(0, 2), batching=Batching(max_duration=0.8, num_buckets=2, sync_buckets=sync)
        )
        state_path.write_text(json.dumps(bucketed.state_dict()))
        assert main(["trace", str(dataset_dir), "--state", str(state_path), "--epoch", "0", "--json"]) == 0
        table = Trace(bucketed, bucketed.state_dict())
        assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
            table.row(r) for r in table.epoch(0)
        ]
    other = make(dataset_dir, World(0, 2), max_duration=0.5)
    state_path.write_text(json.dumps(other.state_dict()))
    assert main(["trace", str(dataset_dir), "--state", str(state_path), "--step", "999"]) == 2
    assert "none in [999" in capsys.readouterr().err


def test_the_readme_worked_example_nan_trace_quarantine_resume(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from shardio.cli import main

    poisoned = "s002_00001"  # as in docs/guides/ledger.md

    def poison(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        if sample["key"] == poisoned:
            sample["audio"] = sample["audio"] * float("nan")
        return sample

    ds = make(dataset_dir, World(), decoding=Decoding(transform=poison))
    trained, checkpoint, nan_step = [], tmp_path / "ckpt.json", -1
    for step, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
        if not torch.isfinite(batch["audio"]).all():
            nan_step = step
            break
        trained.append(list(batch["keys"]))
        if step % 3 == 2:
            checkpoint.write_text(json.dumps(ds.state_after(batch)))
            kept = len(trained)
    assert nan_step == 14  # as in docs/guides/ledger.md: after the checkpoint at step 11
    capsys.readouterr()
    assert (
        main(["trace", str(dataset_dir), "--state", str(checkpoint), "--step", str(nan_step), "--json"]) == 0
    )
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert poisoned in row["keys"]
    healed = tmp_path / "healed.json"
    assert (
        main(
            [
                "quarantine",
                str(dataset_dir),
                "--state",
                str(checkpoint),
                "--key",
                poisoned,
                "--out",
                str(healed),
            ]
        )
        == 0
    )
    resumed = make(dataset_dir, World(), decoding=Decoding(transform=poison))
    resumed.load_state_dict(json.loads(healed.read_text()))
    planned = len(resumed)  # the resumed epoch's rest (once its workers finished it: the next epoch's)
    after = [
        list(b["keys"])
        for b in DataLoader(resumed, batch_size=None, num_workers=2)
        if torch.isfinite(b["audio"]).all()
    ]
    assert len(after) == planned  # every batch finite
    seen = Counter(k for keys in trained[:kept] + after for k in keys)
    assert set(seen) == set(ds.index.keys) - {poisoned} and max(seen.values()) == 1


def test_the_cli_writes_a_quarantined_state_over_its_input_whole(dataset_dir: Path, tmp_path: Path) -> None:
    """``--out`` may be ``--state`` itself: the new state replaces the file whole (written beside it, then
    renamed), so a run that fails while writing leaves the checkpoint's state as it was."""
    from shardio.cli import main

    ds = make(dataset_dir, World(0, 2))
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(ds.state_dict()))
    before = state_path.stat().st_ino
    key = ds.index.keys[0]
    assert (
        main(
            [
                "quarantine",
                str(dataset_dir),
                "--state",
                str(state_path),
                "--key",
                key,
                "--out",
                str(state_path),
            ]
        )
        == 0
    )
    assert state_path.stat().st_ino != before  # a new file renamed over it, not the old one truncated
    healed = make(dataset_dir, World(0, 1))
    healed.load_state_dict(json.loads(state_path.read_text()))
    assert key not in {k for batch in healed for k in batch["keys"]}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_trace_tells_a_mixs_re_passes_from_padding(
    sources: dict[str, str], dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mix's rows name each sample's corpus pass (a key met twice in an epoch, under two passes) and flag
    no re-pass as a repeat; padding (3 ranks, 5 batches) is flagged, as the batches' ``repeat`` is."""
    from shardio.cli import main

    mix = MixedDataset(
        sources,
        {"big": 0.5, "tiny": 0.5},
        EpochSize(primary="big"),
        seed=2,
        ordering=Ordering(shuffle_shards=2),
        batch_size=4,
    )
    rows = [Trace(mix, mix.state_dict()).row(record) for record in Trace(mix, mix.state_dict()).epoch(0)]
    places = Counter(
        (key, p)
        for row in rows
        for key, c, p in zip(row["keys"], row["corpus"], row["corpus_pass"])
        if c == "tiny"
    )
    assert len({p for _, p in places}) > 1 and max(places.values()) == 1  # re-passes, each occurrence once
    assert not any("repeat" in row for row in rows)
    fixed = Batching(batch_size=16)
    padded = make(dataset_dir, World(0, 3), batching=fixed)  # 69 samples: 5 batches, one round padded
    trace = Trace(padded, padded.state_dict())
    flagged = {(r.step, r.rank): trace.row(r).get("repeat", [False] * len(r.ids)) for r in trace.epoch(0)}
    yielded = {
        (batch["batch_index"], rank): batch["repeat"].tolist()
        for rank in range(3)
        for batch in make(dataset_dir, World(rank, 3), batching=fixed)
    }
    assert flagged == yielded and flagged[(1, 2)] == [True] * 16
    state = tmp_path / "state.json"
    state.write_text(json.dumps(padded.state_dict()))
    capsys.readouterr()
    assert main(["trace", str(dataset_dir), "--state", str(state), "--step", "1", "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(",ahead,repeat,corpus_pass") and lines[-1].endswith(",0,1,")
    assert sum(line.endswith(",0,1,") for line in lines) == 16
