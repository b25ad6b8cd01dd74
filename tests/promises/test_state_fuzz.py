"""Fuzzing saved states (issue 41), as ``test_fuzz`` fuzzes shards and indexes: a state file's bytes damaged,
or one of its fields (of a plain state, a quarantined one, a re-mixed mix's) replaced by any JSON value or
dropped, then read and used as the ledger's commands use it (read, rebuild the dataset, trace, quarantine,
report) and loaded. Each case ends in a ShardioError or a working answer, never another exception, within a
time limit; and a batch of damaged files is read under an address-space limit."""

from __future__ import annotations

import copy
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hostile import run_limited
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_shards import make_uneven_dataset
from test_fuzz import JSON_VALUES, MUTATION, mutate, paths, replace_at

from shardio import EpochSize, ShardDataset
from shardio.datasets.mixed import MixedDataset
from shardio.errors import ShardioError
from shardio.ledger.quarantine import quarantine, quarantine_report
from shardio.ledger.rebuild import open_for_state, read_state
from shardio.ledger.remix import remix, remix_report
from shardio.ledger.trace import Trace

pytestmark = pytest.mark.timeout(600)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CASE_SECONDS = 30
"""The most one case may take (they take well under a second): a hang or a runaway plan fails here."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Valid states to damage, by name: each with the locations its dataset is rebuilt from."""
    root = tmp_path_factory.mktemp("statefuzz")
    make_uneven_dataset(root / "one", [4, 6, 2], seed=2, duration_range=(0.05, 0.2))
    make_uneven_dataset(root / "b", [5, 4], seed=3, duration_range=(0.05, 0.2))
    one = ShardDataset(root / "one", batch_size=2, seed=1)
    plain = one.state_after({"epoch": 0, "batch_index": 1})
    healed = quarantine(plain, one, keys=[one.index.keys[3]], carry=True)
    sources = {"one": str(root / "one"), "b": str(root / "b")}
    old = MixedDataset(sources, {"one": 0.3, "b": 1}, EpochSize(primary="b"), seed=5, batch_size=2)
    new = MixedDataset(sources, {"one": 1, "b": 0.7}, EpochSize(primary="b"), seed=5, batch_size=2)
    first = old.state_after({"epoch": 0, "batch_index": 0})
    mixed = quarantine(first, old, keys=[old.index.keys[2]], carry=True)
    remixed = remix(mixed, old, new)
    mix_at = [f"{name}={location}" for name, location in sources.items()]
    states = {
        "plain": ([str(root / "one")], plain),
        "quarantined": ([str(root / "one")], healed),
        "remixed": (mix_at, remixed),
    }
    return json.loads(json.dumps(states))


def use(locations: list[str], state: Any) -> None:
    """What the ledger's commands do with a state, and a load; a ShardioError ends it."""
    started = time.monotonic()
    try:
        quarantine_report(state)
        remix_report(state)
        ds = open_for_state(locations, state)
        trace = Trace(ds, state)
        for record in trace.steps(trace.state.epoch, 0, 2):
            trace.row(record)
        quarantine(state, ds, keys=[ds.index.keys[0]])
        ds.load_state_dict(state)
    except ShardioError:
        pass
    assert time.monotonic() - started < CASE_SECONDS


@FUZZ
@given(data=st.data(), drop=st.booleans())
def test_damaged_state_fields(
    bases: dict[str, tuple[list[str], dict[str, Any]]], data: st.DataObject, drop: bool
) -> None:
    locations, base = bases[data.draw(st.sampled_from(sorted(bases)), label="base")]
    state = copy.deepcopy(base)
    path = data.draw(st.sampled_from(paths(state)[1:]), label="path")
    value = data.draw(JSON_VALUES, label="value")
    use(locations, json.loads(json.dumps(replace_at(state, path, value, drop), allow_nan=True)))


@FUZZ
@given(
    name=st.sampled_from(["plain", "quarantined", "remixed"]),
    mutations=st.lists(MUTATION, min_size=1, max_size=3),
)
def test_damaged_state_bytes(
    bases: dict[str, tuple[list[str], dict[str, Any]]],
    tmp_path: Path,
    name: str,
    mutations: list[tuple[str, int, Any]],
) -> None:
    locations, base = bases[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(mutate(json.dumps(base).encode(), mutations))
    try:
        state = read_state(str(path))
    except ShardioError:
        return
    use(locations, state)


_READ_ALL = """
import glob
from shardio.errors import ShardioError
from shardio.ledger.rebuild import open_for_state, read_state
kinds = set()
for path in sorted(glob.glob({pattern!r})):
    try:
        open_for_state({locations!r}, read_state(path))
        kinds.add("read")
    except ShardioError as exc:
        kinds.add(type(exc).__name__)
print(sorted(kinds))
"""


def test_damaged_state_files_are_read_in_bounded_memory(
    bases: dict[str, tuple[list[str], dict[str, Any]]], tmp_path: Path
) -> None:
    """Damaged files and hostile ones (deep, wide, long, a list at the top), read with 600 MiB of room."""
    locations, base = bases["remixed"]
    text = json.dumps(base).encode()
    hostile = [
        b"[" * 10**6,
        b"[" + b"[]," * 10**7 + b"[]]",
        b'"' + b"x" * 10**8 + b'"',
        b"[" + text + b"]",
        text.replace(b'"extra": {', b'"extra": {"deep": ' + b"[" * 5000 + b"]" * 5000 + b", "),
    ]
    flipped = [mutate(text, [("flip", 97 * i, 1 + i % 255)]) for i in range(40)]
    for number, damaged in enumerate(hostile + flipped):
        (tmp_path / f"{number:03d}.json").write_bytes(damaged)
    code = _READ_ALL.format(pattern=str(tmp_path / "*.json"), locations=locations)
    result = run_limited(
        textwrap.dedent(code), headroom_mb=600, timeout=300, preload="shardio.ledger.rebuild"
    )
    assert result.returncode == 0 and result.stdout.startswith("["), result.stdout + result.stderr[-2000:]
    assert "StateError" in result.stdout
