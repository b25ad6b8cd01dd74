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
from sample_shards import make_uneven_dataset
from test_trace import memory_index
from torch.utils.data import DataLoader

from shardio import Batching, EpochSize, OptionError, Ordering, ShardDataset, StateError, World
from shardio.cli import main
from shardio.datasets.mixed import MixedDataset
from shardio.ledger.quarantine import quarantine
from shardio.ledger.remix import remix
from shardio.ledger.trace import Trace


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ledger_hardening")
    make_uneven_dataset(root / "one", [9, 30, 2, 17, 11], seed=4, duration_range=(0.05, 0.3))
    make_uneven_dataset(root / "big", [20, 14, 9], seed=1, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "tiny", [3], seed=3, duration_range=(0.2, 0.3))
    return root


def make(data: Path, world: World = World(), **options: Any) -> ShardDataset:
    if "batching" not in options:
        options.setdefault("max_duration", 0.8)
    return ShardDataset(data / "one", world=world, seed=5, ordering=Ordering(shuffle_shards=2), **options)


def mix(data: Path, weights: dict[str, float], world: World = World()) -> MixedDataset:
    return MixedDataset(
        {n: str(data / n) for n in weights},
        weights,
        EpochSize(primary="big"),
        world=world,
        seed=5,
        max_duration=0.8,
    )


def consume(
    build: Callable[[World], ShardDataset],
    world_size: int,
    state: dict[str, Any] | None = None,
    stop: int | None = None,
    workers: int = 2,
) -> tuple[list[str], dict[str, Any] | None]:
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
    for call in (
        lambda: trace.steps(-1, 0),
        lambda: trace.epoch(-1),
        lambda: trace.find(["s000_00000"], [-1]),
        lambda: trace.segments(2**63),
        lambda: trace.plan(0, -1),
        lambda: trace.steps(0, 1, rank=True),
        lambda: trace.steps(0, 1.5),
        lambda: trace.find("s000_00000", [0]),
    ):  # type: ignore[arg-type]
        with pytest.raises(OptionError):
            call()


def test_the_trace_cli_refuses_bad_epochs_and_options_its_question_does_not_take(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(make(data, World(0, 2)).state_dict()))
    base = ["trace", str(data / "one"), "--state", str(state)]
    for extra, says in (
        (["--step", "3", "--in-epoch", "-1"], "epoch must be"),
        (["--epoch", "-1", "--csv"], "epoch must be"),
        (["--step", "0", "--in-epoch", str(2**63)], "epoch must be"),
        (["--key", "s000_00000", "--epochs", "0"], "--epochs must be at least 1"),
        (["--key", "s000_00000", "--epochs", "-3"], "--epochs must be at least 1"),
        (["--epoch", "0", "--stop", "3"], "--stop"),
        (["--epoch", "0", "--rank", "1"], "--rank"),
        (["--key", "s000_00000", "--csv"], "--csv"),
        (["--step", "1", "--epochs", "2"], "--epochs"),
        (["--step", "1", "--csv", "--json"], "choose one"),
    ):
        code, out, err = cli(base + extra, capsys)
        assert (code, out) == (2, "") and says in err and len(err.strip().splitlines()) == 1, (extra, err)
    code, out, _ = cli(base + ["--key", "s000_00000", "--epochs", "2"], capsys)
    assert code == 0 and [line.split(" epoch ")[1].split()[0] for line in out.splitlines()] == ["0", "1"]


def test_find_scans_no_batch_table_per_key_and_rows_read_only_their_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    options=st.sampled_from(
        [
            {},
            {"num_buckets": 2},
            {"batching": Batching(max_duration=0.8, num_buckets=2, sync_buckets=True)},
            {"batch_size": 3, "max_duration": None},
        ]
    ),
    first=st.integers(1, 3),
    second=st.integers(0, 2),
    after=st.integers(1, 3),
    workers=st.sampled_from([0, 2]),
    picks=st.lists(st.integers(0, 68), min_size=1, max_size=6),
    carry=st.booleans(),
)
@pytest.mark.slow
def test_quarantine_of_a_real_elastic_state_leaves_out_exactly_the_keys(
    data: Path,
    options: dict[str, Any],
    first: int,
    second: int,
    after: int,
    workers: int,
    picks: list[int],
    carry: bool,
) -> None:
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


@pytest.mark.parametrize(
    "field,value,says",
    [
        ("weights", {"big": True, "tiny": 1.0}, "options.mix.weights ({'big': True, 'tiny': 1.0})"),
        ("weights", {"big": -1.0, "tiny": 1.0}, "options.mix.weights ({'big': -1.0, 'tiny': 1.0})"),
        ("weight_by", "seconds", "options.mix.weight_by ('seconds')"),
        ("single_corpus_batches", 1, "options.mix.single_corpus_batches (1)"),
        ("epoch_size", {"primary": "zz"}, "options.mix.epoch_size ({'primary': 'zz'})"),
        (
            "min_duration",
            5.0,
            "state field options: the dataset refuses this saved option (corpus 'big' has no",
        ),
    ],
)
def test_a_saved_option_the_dataset_refuses_is_a_state_error_naming_the_field(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, says: str
) -> None:
    """The options a state records rebuild its dataset for trace and quarantine (open_for_state); one the
    (stricter) option checks refuse was an OptionError, an error about the caller's arguments. It is a
    StateError naming the state's field and value now, the OptionError's text its reason."""
    from shardio.ledger.rebuild import open_for_state

    state = json.loads(json.dumps(mix(data, {"big": 2.0, "tiny": 1.0}, World(0, 2)).state_dict()))
    (state["options"] if field == "min_duration" else state["options"]["mix"])[field] = value
    path, out = tmp_path / "state.json", tmp_path / "out.json"
    path.write_text(json.dumps(state))
    locations = [f"big={data / 'big'}", f"tiny={data / 'tiny'}"]
    with pytest.raises(StateError, match="state field") as caught:
        open_for_state(locations, state)
    assert says in str(caught.value) and isinstance(caught.value.__cause__, OptionError), caught.value
    assert str(caught.value.__cause__) in str(caught.value)
    for command in (
        ["trace", *locations, "--state", str(path), "--step", "0"],
        ["quarantine", *locations, "--state", str(path), "--key", "s000_00000", "--out", str(out)],
        ["remix", *locations, "--state", str(path), "--weight", "big=1", "--out", str(out)],
    ):
        code, stdout, err = cli(command, capsys)
        assert (code, stdout) == (2, "") and says in err and len(err.strip().splitlines()) == 1, (
            command,
            err,
        )
    assert not out.exists()


def test_a_state_whose_corpora_field_is_not_a_mix_is_a_state_error(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``options.corpora`` of a mix's state, tampered (a number, a list): a TypeError traceback from
    ``shardio remix`` and ``trace`` before; a StateError naming the field now."""
    state = json.loads(json.dumps(mix(data, {"big": 2.0, "tiny": 1.0}, World(0, 2)).state_dict()))
    locations = [f"big={data / 'big'}", f"tiny={data / 'tiny'}"]
    for corpora in (5, ["big", "tiny"], {"big": 1}):
        path = tmp_path / "state.json"
        path.write_text(json.dumps({**state, "options": {**state["options"], "corpora": corpora}}))
        for command in (
            ["trace", *locations, "--state", str(path), "--step", "0"],
            [
                "remix",
                *locations,
                "--state",
                str(path),
                "--weight",
                "big=1",
                "--out",
                str(tmp_path / "out.json"),
            ],
        ):
            code, stdout, err = cli(command, capsys)
            assert (code, stdout) == (2, "") and "state field options.corpora" in err, (command, err)


# -- remix -------------------------------------------------------------------------------------------


def test_remix_refuses_a_dataset_that_is_not_a_mix_and_a_tampered_stream_record(data: Path) -> None:
    old = {"big": 2.0, "tiny": 1.0}
    _, state = consume(lambda w: mix(data, old, w), 2, stop=2, workers=0)
    assert state is not None
    with pytest.raises(OptionError, match="new is a ShardDataset"):
        remix(state, mix(data, old), make(data))  # type: ignore[arg-type]
    healed = remix(state, mix(data, old), mix(data, {"big": 1.0}))
    assert (
        healed["extra"]["remix"]["tail"]["positions"]["big"] and healed["extra"]["remix"]["pending"]["tiny"]
    )

    def tampered(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        copy = json.loads(json.dumps(healed))
        change(copy["extra"]["remix"])
        return copy

    for change in (
        lambda e: e["tail"]["positions"].__setitem__("big", [[0, 5], [3, 6]]),  # played twice
        lambda e: e["pending"].__setitem__("tiny", [[0, 2], [0, 2]]),
        lambda e: e["tail"]["positions"].__setitem__("big", [[0, 10**12]]),  # 8 TB of positions
        lambda e: e["pending"].__setitem__("tiny", [[5, 10**12]]),
    ):
        with pytest.raises(StateError, match="extra.remix"):
            mix(data, {"big": 1.0}, World(0, 2)).load_state_dict(tampered(change))


def test_the_remix_cli_refuses_ambiguous_corpora_and_weights(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, state = consume(lambda w: mix(data, {"big": 2.0, "tiny": 1.0}, w), 2, stop=2, workers=0)
    mixed, plain = tmp_path / "mix.json", tmp_path / "plain.json"
    mixed.write_text(json.dumps(state))
    plain.write_text(json.dumps(make(data).state_dict()))
    big, tiny, out = f"big={data / 'big'}", f"tiny={data / 'tiny'}", str(tmp_path / "new.json")
    for args, says in (
        ([big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "big=2"], "more than once"),
        ([str(data / "one"), big, tiny, "--state", str(mixed), "--weight", "big=1"], "NAME=LOCATION"),
        ([big, f"big={data / 'tiny'}", tiny, "--state", str(mixed), "--weight", "big=1"], "more than once"),
        ([big, tiny, "--state", str(plain), "--weight", "big=1"], "state of a mix"),
        ([big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "tiny=0"], "positive"),
    ):
        code, stdout, err = cli(["remix", *args, "--out", out], capsys)
        assert (code, stdout) == (2, "") and says in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not Path(out).exists()
    code, stdout, _ = cli(
        ["remix", big, tiny, "--state", str(mixed), "--weight", "big=1", "--weight", "tiny=2", "--out", out],
        capsys,
    )
    assert code == 0 and set(json.loads(Path(out).read_text())["extra"]["remix"]["cursors"]) == {
        "big",
        "tiny",
    }


# -- bounds on what a mix's state and the ledger's options make shardio plan --------------------------


def healed_mix(data: Path, weights: dict[str, float]) -> dict[str, Any]:
    """A real mid-epoch re-mix of a 2-rank mix of big and tiny (2 batches in) into ``weights``."""
    _, state = consume(lambda w: mix(data, {"big": 2.0, "tiny": 1.0}, w), 2, stop=2, workers=0)
    assert state is not None
    return remix(state, mix(data, {"big": 2.0, "tiny": 1.0}), mix(data, weights))


def test_a_mix_state_cannot_size_an_allocation_by_its_cursors_and_ranges(data: Path) -> None:
    """A tampered ``extra["remix"]``: a cursor raised past what the mix could have drawn (``since`` epochs of
    the largest quota), with a range up to it, was loaded and expanded (``[[0, 10**12]]`` under a cursor of
    10**12: 8 TB, a MemoryError; a cursor near 2**63 wrapped the positions silently; ``Infinity`` an
    OverflowError); a tail of the rest of the epoch larger than any epoch of a mix was planned. Now each is a
    StateError before anything is allocated."""
    healed = healed_mix(data, {"big": 1.0})
    assert healed["extra"]["remix"]["since"] == 1

    def tampered(change: Callable[[dict[str, Any]], Any], epoch: int | None = None) -> dict[str, Any]:
        copy = json.loads(json.dumps(healed))
        change(copy["extra"]["remix"])
        if epoch is not None:
            copy["epoch"] = epoch
        return copy

    def cursor(name: str, value: Any) -> Callable[[dict[str, Any]], Any]:
        return lambda e: e["cursors"].__setitem__(name, value)

    cases = [
        (
            tampered(
                lambda e: (cursor("tiny", 10**12 + 5)(e), e["pending"].__setitem__("tiny", [[0, 10**12]]))
            ),
            "cursors.tiny must be an integer from 0 to 1073741824",
        ),
        (
            tampered(
                lambda e: (
                    cursor("big", 10**12 + 5)(e),
                    e["tail"]["positions"].__setitem__("big", [[0, 10**12]]),
                )
            ),
            "cursors.big",
        ),
        (tampered(lambda e: (e.pop("tail"), cursor("big", 2**63 - 100)(e)), epoch=1), "cursors.big"),
        (tampered(cursor("big", float("inf"))), "not inf"),
        (tampered(cursor("big", 4.5)), "not 4.5"),
        (tampered(lambda e: e.__setitem__("since", True)), "since must be an integer"),
        (tampered(lambda e: e["tail"].__setitem__("epoch", 1e300)), "tail.epoch"),
        # since 3 allows cursors up to 3 * 2**30: a tail (or pending set) beyond one epoch of a mix is not
        (
            tampered(
                lambda e: (
                    e.__setitem__("since", 3),
                    cursor("big", 2**31)(e),
                    e["tail"]["positions"].__setitem__("big", [[0, 2**30 + 5]]),
                )
            ),
            "more than one epoch of a mix draws",
        ),
        (
            tampered(
                lambda e: (
                    e.__setitem__("since", 3),
                    cursor("tiny", 2**31)(e),
                    e["pending"].__setitem__("tiny", [[0, 2**30 + 1]]),
                )
            ),
            "more than one epoch",
        ),
    ]
    for state, says in cases:
        with pytest.raises(StateError, match="extra.remix") as caught:
            mix(data, {"big": 1.0}, World(0, 2)).load_state_dict(state)
        assert says in str(caught.value), (says, caught.value)


def test_a_mix_state_at_an_epoch_beyond_int64_positions_is_a_typed_error(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Epoch 2**62 - 1 of a mix plays stream positions beyond int64: an OverflowError (a traceback from
    ``shardio trace``) before, a StateError on load and an OptionError in the ledger now."""
    ds = mix(data, {"big": 2.0, "tiny": 1.0}, World(0, 2))
    state = {**ds.state_dict(), "epoch": 2**62 - 1}
    with pytest.raises(StateError, match="beyond the int64 positions"):
        mix(data, {"big": 2.0, "tiny": 1.0}, World(0, 2)).load_state_dict(state)
    with pytest.raises(OptionError, match="beyond the int64 positions"):
        list(Trace(ds, ds.state_dict()).epoch(2**62 - 1))
    path = tmp_path / "state.json"
    path.write_text(json.dumps(ds.state_dict()))
    code, out, err = cli(
        [
            "trace",
            f"big={data / 'big'}",
            f"tiny={data / 'tiny'}",
            "--state",
            str(path),
            "--epoch",
            str(2**62 - 1),
        ],
        capsys,
    )
    assert (code, out) == (2, "") and "int64" in err and len(err.strip().splitlines()) == 1, err


def test_a_pending_range_costs_what_an_epoch_takes_of_it_not_its_length(data: Path) -> None:
    """A corpus's pending positions (a dropped corpus's, replayed when it returns) were expanded into an array
    every time a state was parsed and every epoch planned: ``[[100, 10**8 + 100]]`` allocated 800 MB per plan
    (and 10**9 under a cursor allowed by ``since``, 8 GB). They stay ranges now: an epoch takes its quota of
    them, in order, with memory of the quota."""
    import tracemalloc

    healed = healed_mix(data, {"big": 1.0, "tiny": 1.0})  # tiny kept: its epoch-1 slice comes from pending
    extra = healed["extra"]["remix"]
    extra["cursors"]["tiny"] = 10**8 + 200
    extra["pending"] = {"tiny": [[150, 10**8 + 150]]}
    tracemalloc.start()
    try:
        ds = mix(data, {"big": 1.0, "tiny": 1.0}, World(0, 2))
        ds.load_state_dict(healed)
        trace = Trace(ds, healed)
        records = list(trace.epoch(1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, peak  # 800 MB before
    played = [trace.dataset.index.corpus(i) for r in records for i in r.ids.tolist()]
    assert "tiny" in played  # tiny plays its pending positions in epoch 1
    quota = trace.plan(1, 0).report["corpora"]["tiny"]["quota"]
    from shardio.planning.mixstreams import Streams
    from shardio.planning.streams import Stream

    stream = Streams.of(healed["extra"]).streams["tiny"]
    assert stream.held == 10**8 and stream.take(0, quota).tolist() == list(range(150, 150 + quota))
    assert Stream(7, np.array([[0, 3], [5, 6]])).take(2, 4).tolist() == [2, 5, 7, 8]


def test_a_remix_tail_stays_ranges_and_is_bounded_by_the_mix_that_plays_it(data: Path) -> None:
    """The tail (the rest of an epoch re-mixed mid-way) was expanded into an array whenever a state was read,
    bounded only by 2**30 positions: ``[[0, 10**8]]`` (a few bytes) cost 800 MB on every load, even long after
    its epoch, and planned 10**8 occurrences in it (10**9: 8 GB before planning). It stays ranges now: a later
    epoch's load costs nothing, and the tail's own epoch refuses a tail beyond MAX_TAIL_EPOCHS epochs of the
    mix loading it (a StateError naming the field and the numbers) before a position is expanded."""
    import tracemalloc

    from shardio.ledger.remix import remix_report
    from shardio.planning.mix import MAX_TAIL_EPOCHS
    from shardio.planning.mixstreams import Streams

    healed = healed_mix(data, {"big": 1.0})
    extra = healed["extra"]["remix"]
    assert (healed["epoch"], extra["since"], extra["tail"]["epoch"]) == (0, 1, 0)
    extra["cursors"]["big"] = 10**8 + 5
    extra["tail"]["positions"]["big"] = [[0, 10**8]]
    later = {**json.loads(json.dumps(healed)), "epoch": 1}  # the tail's epoch is over: it is never planned
    tracemalloc.start()
    try:
        with pytest.raises(StateError, match="extra.remix.tail holds 100000000 stream positions") as caught:
            mix(data, {"big": 1.0}, World(0, 2)).load_state_dict(healed)
        peak_refused = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        mix(data, {"big": 1.0}, World(0, 2)).load_state_dict(later)
        tail = Streams.of(later["extra"]).tail
        assert remix_report(later)
        peak_later = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{MAX_TAIL_EPOCHS} epochs" in str(caught.value)
    assert peak_refused < 50 * 2**20 and peak_later < 50 * 2**20, (peak_refused, peak_later)  # 800 MB+ before
    assert tail is not None and tail[1]["big"].tolist() == [[0, 10**8]]
    assert Streams.of(later["extra"]).to_extra()["tail"] == later["extra"]["remix"]["tail"]


def test_remix_refuses_to_write_a_tail_the_new_mix_would_refuse(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every state remix writes loads: a rest of the epoch beyond MAX_TAIL_EPOCHS epochs of the new mix is an
    OptionError at the re-mix (re-mix at the epoch's end), not a state the loader refuses later."""
    import shardio.planning.mix as planning_mix

    _, state = consume(lambda w: mix(data, {"big": 2.0, "tiny": 1.0}, w), 2, stop=2, workers=0)
    assert state is not None
    monkeypatch.setattr(planning_mix, "MAX_TAIL_EPOCHS", 0)  # the bound tail_limit applies
    with pytest.raises(OptionError, match="re-mix at the end of epoch 0"):
        remix(state, mix(data, {"big": 2.0, "tiny": 1.0}), mix(data, {"big": 1.0}))


def test_trace_find_searches_a_bounded_number_of_epochs_and_holds_one_epoch_of_plans(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trace --key K --epochs 100000000`` planned every epoch, one after the other (hours), and kept every
    plan (memory growing with N). Now N is at most MAX_FIND_EPOCHS (refused before any plan), and a search
    holds one epoch's plans at a time."""
    from shardio.ledger.trace import MAX_FIND_EPOCHS

    ds = make(data, World(0, 2))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(ds.state_dict()))
    plans: list[int] = []
    from shardio.planning.planner import Planner

    planner = Planner.plan

    def counted(self: Planner, *args: Any) -> Any:
        plans.append(1)
        if len(plans) > 3 * MAX_FIND_EPOCHS:
            raise RuntimeError("planned past any bound")
        return planner(self, *args)

    monkeypatch.setattr(Planner, "plan", counted)
    base = ["trace", str(data / "one"), "--state", str(state), "--key", "s000_00000"]
    code, out, err = cli(base + ["--epochs", "100000000"], capsys)
    assert (code, out) == (2, "") and f"at most {MAX_FIND_EPOCHS}" in err, err
    assert plans == []
    trace = Trace(ds, ds.state_dict())
    plans.clear()
    for epochs in (range(10**8), iter(range(10**8)), [0, 2**62]):
        with pytest.raises(OptionError):
            trace.find(["s000_00000"], epochs)
    assert plans == []
    found = trace.find(["s000_00000"], range(30))
    assert sorted({row["epoch"] for row in found}) == list(range(30))  # (a padded epoch may hold it twice)
    assert len(trace._segments.planned()) <= 2  # the state's epoch (kept) and the last one searched, not 30
    code, out, _ = cli(base + ["--epochs", str(MAX_FIND_EPOCHS)], capsys)
    assert code == 0 and {line.split(" epoch ")[1].split()[0] for line in out.splitlines()} == {
        str(epoch) for epoch in range(MAX_FIND_EPOCHS)
    }


def test_remix_report_refuses_malformed_events(data: Path) -> None:
    from shardio.ledger.remix import remix_report

    healed = healed_mix(data, {"big": 1.0})
    assert remix_report(healed)
    for events in ([1], [{"corpora": {"big": 3}}], [{"epoch": 0}]):
        copy = json.loads(json.dumps(healed))
        copy["extra"]["remix"]["events"] = events
        with pytest.raises(StateError, match="extra.remix.events"):
            remix_report(copy)


def test_many_quarantine_entries_cost_the_planner_one_pass_per_segment(data: Path) -> None:
    """Each ``exclude`` pair costs the planner a pass over the epoch (a mask of its samples; in a mix an
    ``np.isin`` over its occurrences); a state's ``extra`` may hold some 500k one-id quarantine entries, which
    were one pair each (500k passes over a 10M-sample epoch: hours). They are merged per segment now."""
    from shardio.planning.exclusions import exclusions

    ds = make(data, World(0, 2))
    keys = list(ds.index.keys)
    entries = [
        {"epoch": 0, "segment": 0, "ids": [i % 5], "keys": [keys[i % 5]], "steps": None, "carry": True}
        for i in range(20000)
    ]
    state = {**ds.state_dict(), "epoch": 1, "extra": {"quarantine": entries}}
    pairs = exclusions(state["extra"], 1)
    assert len(pairs) == 1 and pairs[0][1].tolist() == [0, 1, 2, 3, 4]
    loaded = make(data, World(0, 2))
    loaded.load_state_dict(state)
    planned = Trace(loaded, state).plan(1, 0)
    assert not set(planned.samples.tolist()) & {0, 1, 2, 3, 4} and planned.samples.shape[0] >= len(keys) - 5
