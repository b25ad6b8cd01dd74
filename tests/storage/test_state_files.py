"""A ``--state`` file is untrusted data (issue 41): the ledger's commands read a regular file only (a FIFO is
not waited on, a device not read), bounded in size, nesting and values before it is parsed; a state is a
dict, and a list at the top is refused alike by the commands and by ``load_state_dict``."""

from __future__ import annotations

import json
import os
import stat
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hostile import run_limited
from test_state_validation import data, valid  # noqa: F401  (fixtures: a small dataset, a valid state of it)

from shardio import ShardDataset, StateError
from shardio.cli import main
from shardio.storage.statefiles import (
    MAX_STATE_FILE_BYTES,
    MAX_STATE_FILE_DEPTH,
    MAX_STATE_FILE_VALUES,
    load_state_file,
)

pytestmark = pytest.mark.timeout(120)

COMMANDS = [["trace", "--step", "0"], ["quarantine", "--key", "x", "--out", "{out}"]]


def run_cli(
    command: list[str], data: str, state: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    args = [part.format(out=tmp_path / "out.json") for part in command]
    capsys.readouterr()
    code = main([args[0], data, "--state", state, *args[1:]])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS, ids=["trace", "quarantine"])
def test_a_fifo_state_is_refused_without_waiting(
    data: str, tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    code, err = run_cli(command, data, str(fifo), tmp_path, capsys)  # blocked forever before
    assert code == 2 and "a FIFO, not a regular file" in err, err
    assert time.monotonic() - started < 10


def test_a_device_state_is_not_read(data: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["trace", "--step", "0"], data, "/dev/zero", tmp_path, capsys)  # read: MemoryError
    assert code == 2 and "a character device, not a regular file" in err, err


def test_a_directory_state_is_refused(data: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a directory is read as an Accelerate checkpoint (ledger/checkpoints): one holding no
    # shardio state is refused
    code, err = run_cli(["trace", "--step", "0"], data, str(tmp_path), tmp_path, capsys)
    assert code == 2 and "holding no shardio states" in err, err


@pytest.mark.parametrize(
    "command",
    COMMANDS + [["remix", "--weight", "a=1", "--out", "{out}"]],
    ids=["trace", "quarantine", "remix"],
)
def test_a_list_of_states_is_a_state_error_in_every_command(
    data: str, valid: dict[str, Any], tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([valid]))
    code, err = run_cli(command, data, str(path), tmp_path, capsys)  # a ValueError traceback (exit 1) before
    assert code == 2 and "a saved state is a dict" in err and "not a list" in err, err


@pytest.mark.parametrize("container", [[], "state", 3, None], ids=["list", "str", "int", "none"])
def test_load_state_dict_refuses_what_the_commands_refuse(
    data: str, valid: dict[str, Any], container: Any
) -> None:
    ds = ShardDataset(data, batch_size=2, seed=1)
    with pytest.raises(StateError, match="a saved state is a dict"):
        ds.load_state_dict([valid])  # loaded before: one rule for both
    if container is not None:
        with pytest.raises(StateError, match="a saved state is a dict"):
            ds.load_state_dict(container)
    ds.load_state_dict({"checkpoint": {"loaders": [valid]}})  # a list inside a checkpoint dict is searched


def test_a_state_file_beyond_the_size_bound_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as sparse:
        sparse.truncate(MAX_STATE_FILE_BYTES + 1)
    started = time.monotonic()
    with pytest.raises(StateError, match=f"more than the {MAX_STATE_FILE_BYTES}"):
        load_state_file(str(path))
    assert time.monotonic() - started < 1  # refused from its size, before a byte is read


@pytest.mark.parametrize(
    "text,match",
    [
        ("[" * (MAX_STATE_FILE_DEPTH + 1) + "]" * (MAX_STATE_FILE_DEPTH + 1), "nested more than"),
        ('{"a":' * 100_000 + "0" + "}" * 100_000, "nested more than"),
        ("[" + "[]," * MAX_STATE_FILE_VALUES + "[]]", "JSON values"),
        ('{"format": "shardio-state"', "cannot read a JSON loader state"),
        ("\xff\xfe", "cannot read a JSON loader state"),
    ],
)
def test_nesting_and_values_are_bounded_before_parsing(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(StateError, match=match):
        load_state_file(str(path))


def test_strings_do_not_count_as_nesting(tmp_path: Path, valid: dict[str, Any]) -> None:
    brackets = "[{" * MAX_STATE_FILE_DEPTH + '\\"\\\\' + "]}" * MAX_STATE_FILE_DEPTH
    state = {**valid, "extra": {"note": brackets, "other": ['"[[[', "\\"]}}
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert load_state_file(str(path)) == state


_READ_LIMITED = """
from shardio.cli import main
print("exit", main(["trace", {data!r}, "--state", {state!r}, "--step", "0"]))
"""


@pytest.mark.parametrize("kind", ["zero", "big", "wide"])
def test_hostile_state_files_cost_bounded_memory(data: str, tmp_path: Path, kind: str) -> None:
    """/dev/zero, a 200 MB file and a file of millions of empty lists, each under a 600 MiB address-space
    limit: before, the first two ended in a MemoryError at about 3.8 GB."""
    path = "/dev/zero"
    if kind == "big":
        path = str(tmp_path / "big.json")
        Path(path).write_bytes(b"[" * 200 * 2**20)
    elif kind == "wide":
        path = str(tmp_path / "wide.json")
        Path(path).write_bytes(b"[" + b"[]," * (MAX_STATE_FILE_VALUES // 2 + 1) + b"[]]")
    code = _READ_LIMITED.format(data=data, state=path)
    result = run_limited(textwrap.dedent(code), headroom_mb=600, timeout=100, preload="shardio.cli")
    assert "exit 2" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "MemoryError" not in result.stderr


def test_a_valid_state_file_reads_as_before(
    data: str, valid: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(valid))
    link = tmp_path / "link.json"
    link.symlink_to(path)
    for name in (path, link):
        code, err = run_cli(["trace", "--step", "0"], data, str(name), tmp_path, capsys)
        assert code == 0, err
    assert stat.S_ISREG(os.stat(link).st_mode)
