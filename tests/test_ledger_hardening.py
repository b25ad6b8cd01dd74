"""The data ledger against bad input and at scale: typed errors (never a traceback, a silent answer or a huge
allocation), quarantine's exactly-once on real loader states, and trace/find linear in the epoch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from sample_shards import make_uneven_dataset
from shardio import EpochSize, OptionError, ShardDataset, StateError, World
from shardio.cli import main
from shardio.ledger.quarantine import quarantine
from shardio.ledger.remix import remix
from shardio.ledger.trace import Trace
from shardio.mixed import MixedDataset
from test_trace import memory_index


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ledger_hardening")
    make_uneven_dataset(root / "one", [9, 30, 2, 17, 11], seed=4, duration_range=(0.05, 0.3))
    make_uneven_dataset(root / "big", [20, 14, 9], seed=1, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "tiny", [3], seed=3, duration_range=(0.2, 0.3))
    return root


def make(data: Path, world: World = World(), **options: Any) -> ShardDataset:
    options.setdefault("max_duration", 0.8)
    return ShardDataset(data / "one", world=world, seed=5, shuffle_shards=2, **options)


def mix(data: Path, weights: dict[str, float], world: World = World()) -> MixedDataset:
    return MixedDataset({n: str(data / n) for n in weights}, weights, EpochSize(primary="big"), world=world,
                        seed=5, max_duration=0.8)


def consume(build: Callable[[World], ShardDataset], world_size: int, state: dict[str, Any] | None = None,
            stop: int | None = None, workers: int = 2) -> tuple[list[str], dict[str, Any] | None]:
    """The keys every rank's real DataLoader yields in the epoch (``stop`` batches each, or to its end), and
    rank 0's state after its last one."""
    keys: list[str] = []
    saved = None
    for rank in range(world_size):
        ds = build(World(rank, world_size))
        if state is not None:
            ds.load_state_dict(state)
        epoch = None
        for n, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=workers)):
            epoch = batch["epoch"] if epoch is None else epoch
            if batch["epoch"] != epoch:
                break
            keys.extend(batch["keys"])
            if rank == 0:
                saved = json.loads(json.dumps(ds.state_after(batch)))
            if stop is not None and n + 1 == stop:
                break
    return keys, saved


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# -- trace -------------------------------------------------------------------------------------------


def test_trace_refuses_epochs_segments_steps_and_ranks_it_cannot_trace(data: Path) -> None:
    ds = make(data, World(0, 2))
    trace = Trace(ds, ds.state_dict())
    for call in (lambda: trace.steps(-1, 0), lambda: trace.epoch(-1), lambda: trace.find(["s000_00000"], [-1]),
                 lambda: trace.segments(2**63), lambda: trace.plan(0, -1), lambda: trace.steps(0, 1, rank=True),
                 lambda: trace.steps(0, 1.5), lambda: trace.find("s000_00000", [0])):  # type: ignore[arg-type]
        with pytest.raises(OptionError):
            call()


def test_the_trace_cli_refuses_bad_epochs_and_options_its_question_does_not_take(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(make(data, World(0, 2)).state_dict()))
    base = ["trace", str(data / "one"), "--state", str(state)]
    for extra, says in ((["--step", "3", "--in-epoch", "-1"], "epoch must be"),
                        (["--epoch", "-1", "--csv"], "epoch must be"),
                        (["--step", "0", "--in-epoch", str(2**63)], "epoch must be"),
                        (["--key", "s000_00000", "--epochs", "0"], "--epochs must be at least 1"),
                        (["--key", "s000_00000", "--epochs", "-3"], "--epochs must be at least 1"),
                        (["--epoch", "0", "--stop", "3"], "--stop"), (["--epoch", "0", "--rank", "1"], "--rank"),
                        (["--key", "s000_00000", "--csv"], "--csv"), (["--step", "1", "--epochs", "2"], "--epochs"),
                        (["--step", "1", "--csv", "--json"], "choose one")):
        code, out, err = cli(base + extra, capsys)
        assert (code, out) == (2, "") and says in err and len(err.strip().splitlines()) == 1, (extra, err)
    code, out, _ = cli(base + ["--key", "s000_00000", "--epochs", "2"], capsys)
    assert code == 0 and [line.split(" epoch ")[1].split()[0] for line in out.splitlines()] == ["0", "1"]


def test_find_scans_no_batch_table_per_key_and_rows_read_only_their_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find`` over every key looks each position's batch up in one sorted copy of the dealt batches: it
    compared each position with the whole table (``np.argwhere`` a key: 64k samples took 11.3 s, now 0.33 s);
    ``row`` reads its samples' durations, not the whole derived column."""
    ds = ShardDataset(memory_index([400] * 10, 1), world=World(0, 2), seed=1, batch_size=1)
    trace, keys = Trace(ds, ds.state_dict()), list(ds.index.keys)
    expected = trace.find(keys, [0])
    scans: list[int] = []
    argwhere = np.argwhere
    monkeypatch.setattr(np, "argwhere", lambda *args, **kwargs: scans.append(1) or argwhere(*args, **kwargs))
    assert trace.find(keys, [0]) == expected and len(expected) == 4000
    assert scans == []
    monkeypatch.undo()
    ds = ShardDataset(memory_index([30, 20], 2), world=World(0, 2), seed=1, batch_size=3)
    trace = Trace(ds, ds.state_dict())
    expected = [[round(float(ds.index.durations[i]), 4) for i in r.ids.tolist()] for r in trace.epoch(0)]
    monkeypatch.setattr(type(ds.index), "durations", property(lambda index: pytest.fail("the whole column")))
    assert [trace.row(r)["durations"] for r in trace.epoch(0)] == expected


# -- quarantine --------------------------------------------------------------------------------------


def test_quarantine_refuses_what_it_cannot_leave_out(data: Path) -> None:
    _, state = consume(lambda w: make(data, w), 2, stop=3, workers=0)
    assert state is not None
    ds = make(data)
    for kwargs in ({"keys": "s000_00001"}, {"steps": (1.5, 3)}, {"steps": (1, 2, 3)}, {"steps": (True, 3)}):
        with pytest.raises(OptionError):
            quarantine(state, ds, **kwargs)
    crowded = {**state, "history": [[2, 0]] * 32}
    make(data, World(0, 2)).load_state_dict(crowded)  # loads: 32 segments are the most a state keeps
    with pytest.raises(StateError, match="32 history segments"):  # a 33rd would write a state nothing loads
        quarantine(crowded, ds, keys=["s000_00001"])
    healed = quarantine(state, ds, steps=(np.int64(0), np.int64(2)))  # type: ignore[arg-type]
    assert json.loads(json.dumps(healed))["extra"]["quarantine"][0]["steps"] == [0, 2]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(options=st.sampled_from([{}, {"num_buckets": 2}, {"num_buckets": 2, "sync_buckets": True},
                                {"batch_size": 3, "max_duration": None}]),
       first=st.integers(1, 3), second=st.integers(0, 2), after=st.integers(1, 3),
       workers=st.sampled_from([0, 2]), picks=st.lists(st.integers(0, 68), min_size=1, max_size=6),
       carry=st.booleans())
def test_quarantine_of_a_real_elastic_state_leaves_out_exactly_the_keys(
        data: Path, options: dict[str, Any], first: int, second: int, after: int, workers: int,
        picks: list[int], carry: bool) -> None:
    """2 ranks, then 3 (elastic), then a quarantine of keys (consumed or not), resumed on 1 to 3 ranks: the
    rest of the epoch holds every key not consumed before and not quarantined, and nothing else."""
    def build(world: World) -> ShardDataset:
        return make(data, world, **options)

    before, state = consume(build, 2, stop=first, workers=workers)
    if second:
        more, state = consume(build, 3, state, stop=second, workers=workers)
        before += more
    assert state is not None
    keys = list(make(data).index.keys)
    bad = sorted({keys[i] for i in picks})
    rest, _ = consume(build, after, quarantine(state, build(World()), keys=bad, carry=carry), workers=workers)
    assert set(rest) == set(keys) - set(before) - set(bad)
    assert not set(rest) & set(before)


# -- remix -------------------------------------------------------------------------------------------


def test_remix_refuses_a_dataset_that_is_not_a_mix_and_a_tampered_stream_record(data: Path) -> None:
    old = {"big": 2.0, "tiny": 1.0}
    _, state = consume(lambda w: mix(data, old, w), 2, stop=2, workers=0)
    assert state is not None
    with pytest.raises(OptionError, match="new is a ShardDataset"):
        remix(state, mix(data, old), make(data))  # type: ignore[arg-type]
    healed = remix(state, mix(data, old), mix(data, {"big": 1.0}))
    assert healed["extra"]["remix"]["tail"]["positions"]["big"] and healed["extra"]["remix"]["pending"]["tiny"]

    def tampered(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        copy = json.loads(json.dumps(healed))
        change(copy["extra"]["remix"])
        return copy

    for change in (lambda e: e["tail"]["positions"].__setitem__("big", [[0, 5], [3, 6]]),  # played twice
                   lambda e: e["pending"].__setitem__("tiny", [[0, 2], [0, 2]]),
                   lambda e: e["tail"]["positions"].__setitem__("big", [[0, 10**12]]),  # 8 TB of positions
                   lambda e: e["pending"].__setitem__("tiny", [[5, 10**12]])):
        with pytest.raises(StateError, match="extra.remix"):
            mix(data, {"big": 1.0}, World(0, 2)).load_state_dict(tampered(change))


def test_the_remix_cli_refuses_ambiguous_corpora_and_weights(data: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, state = consume(lambda w: mix(data, {"big": 2.0, "tiny": 1.0}, w), 2, stop=2, workers=0)
    mixed, plain = tmp_path / "mix.json", tmp_path / "plain.json"
    mixed.write_text(json.dumps(state))
    plain.write_text(json.dumps(make(data).state_dict()))
    big, tiny, out = f"big={data / 'big'}", f"tiny={data / 'tiny'}", str(tmp_path / "new.json")
    for args, says in (([big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "big=2"],
                        "more than once"),
                       ([str(data / "one"), big, tiny, "--state", str(mixed), "--weight", "big=1"], "NAME=LOCATION"),
                       ([big, f"big={data / 'tiny'}", tiny, "--state", str(mixed), "--weight", "big=1"],
                        "more than once"),
                       ([big, tiny, "--state", str(plain), "--weight", "big=1"], "state of a mix"),
                       ([big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "tiny=0"], "positive")):
        code, stdout, err = cli(["remix", *args, "--out", out], capsys)
        assert (code, stdout) == (2, "") and says in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not Path(out).exists()
    code, stdout, _ = cli(["remix", big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "tiny=2",
                           "--out", out], capsys)
    assert code == 0 and set(json.loads(Path(out).read_text())["extra"]["remix"]["cursors"]) == {"big", "tiny"}
