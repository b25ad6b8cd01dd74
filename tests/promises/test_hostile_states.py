"""A loader state from an untrusted file: every hostile field is a StateError naming it, raised before any
planning, without allocating beyond what the state's bytes justify, without hanging, and
with a short message."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hostile import run_limited
from test_state_validation import data, valid  # noqa: F401  (fixtures: a small dataset, a valid state of it)

from shardio import ShardDataset, StateError, quarantine_report
from shardio.checks.states import MAX_COUNT, MAX_DEPTH, MAX_WORLD_SIZE
from shardio.errors import OptionError, ShardioError, shown
from shardio.planning.options import MAX_BUCKETS, Batching
from shardio.state import LoaderState

pytestmark = pytest.mark.timeout(240)


def load(data: str, state: Any) -> None:
    ShardDataset(data, batch_size=2, seed=1).load_state_dict(state)


def refused(data: str, state: Any, field: str) -> StateError:
    with pytest.raises(StateError, match=rf"field {field}(?![\w\[])") as caught:
        load(data, state)
    assert len(str(caught.value)) < 1000, str(caught.value)[:300]
    return caught.value


def nested(depth: int, leaf: Any = 0, *, as_list: bool = False) -> Any:
    for _ in range(depth):
        leaf = [leaf] if as_list else {"a": leaf}
    return leaf


# -- 1. integers beyond what the control block holds -------------------------------------------------------


@pytest.mark.parametrize("field", ["epoch", "start", "yielded"])
@pytest.mark.parametrize("value", [2**63, 10**100, MAX_COUNT + 1])
def test_an_integer_beyond_the_control_block_is_refused(
    data: str, valid: dict[str, Any], field: str, value: int
) -> None:
    refused(data, {**valid, field: value}, field)


def test_the_largest_epoch_loads(data: str, valid: dict[str, Any]) -> None:
    ds = ShardDataset(data, batch_size=2, seed=1)
    ds.load_state_dict({**valid, "epoch": MAX_COUNT})
    assert ds.epoch == MAX_COUNT
    assert len(list(ds)) == 4  # 6 batches per rank, 2 consumed


def test_a_consumed_count_beyond_the_control_block_is_refused(data: str, valid: dict[str, Any]) -> None:
    refused(data, {**valid, "history": [[2, 2**63]]}, r"history\[0\]")


def test_more_workers_than_the_block_has_slots_for_is_refused(data: str, valid: dict[str, Any]) -> None:
    refused(data, {**valid, "num_workers": 10**9, "worker": 0}, "num_workers")


def test_a_huge_snapshot_step_count_is_refused(data: str, valid: dict[str, Any]) -> None:
    with pytest.raises(StateError, match="_steps_since_snapshot"):
        load(data, {"_snapshot": {"dataset": valid}, "_steps_since_snapshot": 2**63})


def test_the_trace_command_refuses_a_huge_epoch(
    data: str, valid: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardio.cli import main

    path = tmp_path / "state.json"
    path.write_text(json.dumps({**valid, "epoch": 2**63}))
    assert main(["trace", data, "--state", str(path), "--step", "0"]) == 2
    assert "field epoch" in capsys.readouterr().err


# -- 2. world sizes: bounded before any planning -------------------------------------------------------------

_LOAD_LIMITED = """
import json, shardio
from shardio.errors import ShardioError
state = json.loads({state!r})
try:
    shardio.ShardDataset({data!r}, batch_size=2, seed=1).load_state_dict(state)
    print("loaded")
except ShardioError as exc:
    print(type(exc).__name__, str(exc)[:200])
"""


@pytest.mark.parametrize(
    "change,field",
    [
        ({"world_size": 10**9}, "world_size"),
        ({"world_size": 2**40}, "world_size"),
        ({"history": [[10**12, 1]]}, r"history\[0\]"),
        ({"history": [[10**9, 0]]}, r"history\[0\]"),
    ],
)
def test_a_huge_world_is_refused_before_planning(
    data: str, valid: dict[str, Any], change: dict[str, Any], field: str
) -> None:
    code = _LOAD_LIMITED.format(state=json.dumps({**valid, **change}), data=data)
    result = run_limited(
        textwrap.dedent(code), headroom_mb=512, timeout=120, preload="torch, shardio.datasets.dataset"
    )
    assert result.stdout.startswith("StateError"), result.stdout + result.stderr[-2000:]
    started = time.monotonic()
    refused(data, {**valid, **change}, field)
    assert time.monotonic() - started < 2


def test_the_largest_world_loads(data: str, valid: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(StateError, match="field history"):  # a segment beyond its (one-batch) plan
        load(data, {**valid, "world_size": MAX_WORLD_SIZE, "history": [[MAX_WORLD_SIZE, 2]]})
    load(data, {**valid, "world_size": MAX_WORLD_SIZE, "start": 0})
    assert time.monotonic() - started < 20


# -- 3. extra and options: bounded shapes
# ---------------------------------------------------------------------


@pytest.mark.parametrize("field", ["extra", "options"])
@pytest.mark.parametrize("as_list", [False, True])
def test_deeply_nested_extra_or_options_is_refused(
    data: str, valid: dict[str, Any], field: str, as_list: bool
) -> None:
    refused(data, {**valid, field: {"x": nested(50_000, as_list=as_list)}}, field)
    refused(data, {**valid, field: {"x": nested(MAX_DEPTH + 1, as_list=as_list)}}, field)


def test_a_self_holding_or_exponentially_shared_extra_is_refused(data: str, valid: dict[str, Any]) -> None:
    looped: dict[str, Any] = {}
    looped["again"] = looped
    refused(data, {**valid, "extra": looped}, "extra")
    shared: list[Any] = [0]
    for _ in range(MAX_DEPTH - 2):
        shared = [shared] * 64  # 64**14 leaves from a few kB of objects
    # each shared list is checked once (its count of values remembered): refused at once, not after walking
    # 2**22 of them (5 s alone, 39 s on a loaded machine); a walk of every path would never end
    refused(data, {**valid, "extra": {"x": shared}}, "extra")


@pytest.mark.parametrize("field", ["extra", "options"])
@pytest.mark.parametrize(
    "value",
    [{1, 2}, object(), 10**5000, {1: "key not a string"}, b"bytes"],
    ids=["set", "object", "huge-int", "int-key", "bytes"],
)
def test_extra_or_options_holding_no_json_value_is_refused(
    data: str, valid: dict[str, Any], field: str, value: Any
) -> None:
    refused(data, {**valid, field: {"x": value}}, field)


def test_a_state_with_a_quarantine_and_a_nested_extra_still_loads(data: str, valid: dict[str, Any]) -> None:
    extra = {
        "quarantine": [
            {"epoch": 0, "segment": 1, "ids": [0, 3], "keys": ["a", "b"], "steps": [1], "carry": False}
        ],
        "user": nested(MAX_DEPTH - 3, as_list=True),
    }
    state = LoaderState.from_dict({**valid, "extra": extra})
    assert state.extra == extra


_ENTRY = {"epoch": 0, "segment": 1, "ids": [0, 3], "keys": ["a", "b"], "steps": [1], "carry": False}


@pytest.mark.parametrize(
    "change",
    [
        {"keys": ["a"]},
        {"keys": None},
        {"ids": ["0", 3]},
        {"ids": 5},
        {"corpora": ["x"]},
        {"epoch": "0"},
        {"carry": 1},
        {"consumed": [[0]]},
        {"consumed": "0"},
        {"keys": [1, 2]},
    ],
    ids=[
        "short-keys",
        "no-keys",
        "text-id",
        "ids-not-list",
        "short-corpora",
        "text-epoch",
        "carry-not-bool",
        "unhashable-consumed",
        "consumed-not-list",
        "int-keys",
    ],
)
def test_a_tampered_quarantine_entry_is_a_state_error_in_its_report(
    valid: dict[str, Any], change: dict[str, Any]
) -> None:
    assert [row["key"] for row in quarantine_report({**valid, "extra": {"quarantine": [_ENTRY]}})] == [
        "a",
        "b",
    ]
    tampered = {key: value for key, value in {**_ENTRY, **change}.items() if value is not None}
    with pytest.raises(StateError, match="quarantine entry 0"):
        quarantine_report({**valid, "extra": {"quarantine": [tampered]}})
    with pytest.raises(StateError, match="quarantine entry 1 must be an object"):
        quarantine_report({**valid, "extra": {"quarantine": [_ENTRY, ["not", "an", "entry"]]}})


# -- 4. short messages -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"index": "x" * 10**7},
        {"options": {**{}, "batch_size": "y" * 10**7}},
        {"seed": 10**4000},
        {"index": "\x1b[31m\u202e" + "z" * 10**6},
        {"version": "v" * 10**7},
        {"history": [[1, "h" * 10**7]]},
        {"epoch": -(10**5000)},
    ],
)
def test_a_huge_value_is_shortened_in_the_message(
    data: str, valid: dict[str, Any], change: dict[str, Any]
) -> None:
    with pytest.raises(StateError) as caught:
        load(data, {**valid, **change})
    message = str(caught.value)
    assert len(message) < 1000 and "\x1b" not in message and "\u202e" not in message, message[:300]


def test_shown_escapes_and_cuts() -> None:
    assert shown("ab") == "'ab'"
    assert len(shown("x" * 10**6)) <= 110
    assert "\x1b" not in shown(["\x1b[2J"]) and "\\x1b" in shown(["\x1b[2J"])
    assert "bits" in shown(10**5000)
    assert shown(nested(10**5)).startswith("{")


# -- 5. a long history is refused first
# --------------------------------------------------------------------------


def test_a_long_history_is_refused_before_planning(data: str, valid: dict[str, Any]) -> None:
    started = time.monotonic()
    refused(data, {**valid, "history": [[1, 0]] * 100_000}, "history")
    assert time.monotonic() - started < 1


def test_a_resume_beyond_the_history_kept_is_refused_before_planning(
    data: str, valid: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardio.planning.planner import Planner

    def no_planning(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("planned")

    monkeypatch.setattr(Planner, "plan", no_planning)
    refused(data, {**valid, "world_size": 2, "history": [[1, 0]] * 32}, "history")


def test_set_epoch_beyond_the_control_block_is_an_option_error(data: str) -> None:
    with pytest.raises(OptionError, match="epoch"):
        ShardDataset(data, batch_size=2, seed=1).set_epoch(2**63)


# -- 6. the ledger: options rebuilt from a state, and the state file
# ------------------------------------------


def trace(data: str, state: dict[str, Any] | str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from shardio.cli import main

    path = tmp_path / "state.json"
    path.write_text(state if isinstance(state, str) else json.dumps(state))
    capsys.readouterr()
    assert main(["trace", data, "--state", str(path), "--step", "0"]) == 2
    return capsys.readouterr().err


def with_options(valid: dict[str, Any], **options: Any) -> dict[str, Any]:
    return {**valid, "options": {**valid["options"], **options}}


@pytest.mark.parametrize(
    "options,name",
    [
        ({"batch_size": None, "max_duration": 10.0, "num_buckets": 10**9}, "num_buckets"),
        ({"batch_size": None, "max_duration": 10.0, "duration_bins": list(range(1, 3_000_000))}, "options"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"batch_size": "3"}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": None, "max_duration": float("inf")}, "max_duration"),
        ({"batch_size": None, "max_duration": "10"}, "max_duration"),
        ({"shuffle": "yes"}, "shuffle"),
        ({"shuffle_shards": 0}, "shuffle_shards"),
        ({"shuffle_shards": 1.5}, "shuffle_shards"),
        ({"remainder": ["pad"]}, "remainder"),
        ({"max_duration": 3.0}, "max_duration"),
        ({"evil": 1}, "evil"),
    ],
)
def test_the_trace_command_refuses_bad_options(
    data: str,
    valid: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: dict[str, Any],
    name: str,
) -> None:
    started = time.monotonic()
    err = trace(data, with_options(valid, **options), tmp_path, capsys)
    assert name in err and "Traceback" not in err and len(err) < 1000, err[-2000:]
    assert time.monotonic() - started < 10


def test_the_trace_command_refuses_huge_bucketing_within_a_memory_limit(
    data: str, valid: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(with_options(valid, batch_size=None, max_duration=10.0, num_buckets=10**9)))
    code = (
        f"from shardio.cli import main\nimport sys\nsys.exit(main(['trace', {data!r}, '--state', "
        f"{str(path)!r}, '--step', '0']))"
    )
    result = run_limited(
        code, headroom_mb=512, timeout=120, preload="torch, shardio.datasets.dataset, shardio.cli"
    )
    assert result.returncode == 2 and "num_buckets" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        "{not json",
        '{"epoch": 1' + "0" * 5000 + "}",
        "\xff\xfe",
    ],
)
def test_the_trace_command_refuses_an_unreadable_state_file(
    data: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    err = trace(data, text, tmp_path, capsys)
    assert "state.json" in err and "Traceback" not in err and len(err) < 1000, err[-2000:]


def test_batching_bounds_the_bucket_count() -> None:
    Batching(max_duration=10.0, num_buckets=MAX_BUCKETS)
    Batching(max_duration=10.0, duration_bins=tuple(range(1, MAX_BUCKETS)))
    with pytest.raises(OptionError, match="num_buckets"):
        Batching(max_duration=10.0, num_buckets=MAX_BUCKETS + 1)
    with pytest.raises(OptionError, match="duration_bins"):
        Batching(max_duration=10.0, duration_bins=tuple(range(1, MAX_BUCKETS + 1)))
    with pytest.raises(OptionError, match="max_duration"):
        Batching(max_duration=float("inf"))


def test_every_hostile_case_is_a_shardio_error(data: str, valid: dict[str, Any]) -> None:
    cases = [
        {**valid, "epoch": 2**63},
        {**valid, "extra": {"x": nested(50_000)}},
        {**valid, "history": [[2, -1]]},
        {**valid, "options": nested(50_000)},
        {"a": nested(200_000)},
        nested(200_000, as_list=True),
    ]
    for case in cases:
        with pytest.raises(ShardioError):
            load(data, case)
