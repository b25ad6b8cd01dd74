"""Fuzzing node plan files: whatever is in a plan's place (changed bytes, a FIFO, a link, a directory, another
user's file, a file writable by others), a process gets its rank's true share, by reading it or by planning in
memory, or a ShardioError; never another exception, never a hang (each case under a time limit), and never an
allocation beyond what the files' sizes justify."""

from __future__ import annotations

import os
import shutil
import signal
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz import FUZZ, MUTATION, mutate

from shardio.errors import ShardioError
from shardio.planning.plan import Batching, EpochPlan, plan_epoch
from shardio.planning.rankplan import RankPlan, rank_plan
from shardio.runtime import planfiles

pytestmark = pytest.mark.timeout(300)

NAME = "0123456789ab-e000003-0123456789abcdef0123456789abcdef"
WORLD_SIZE = 3
FILES = ["ids.npy", "starts.npy", "offsets.npy", "repeats.npy", "digests"]
SPECIALS = ["fifo", "link", "directory", "another user's", "writable by others", "missing", "huge header"]
CASE_S = 10  # the time limit of one case
PEAK_BYTES = 1 << 20  # the plan files are ~2 KB: reading them allocates little beyond


def the_plan() -> EpochPlan:
    """An epoch for 3 ranks over uneven shards whose last batches are padded (so repeats.npy is written)."""
    generator = np.random.default_rng(3)
    shard_ids = np.repeat(np.arange(7), generator.integers(1, 30, 7))
    durations = generator.uniform(1, 20, len(shard_ids))
    plan = plan_epoch(
        shard_ids, durations, 7, seed=11, epoch=3, world_size=WORLD_SIZE, batching=Batching(batch_size=5)
    )
    assert any(rank_plan(plan, rank).repeats is not None for rank in range(WORLD_SIZE))
    return plan


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cache directory (set for the module), the plan, and its files as written."""
    cache = tmp_path_factory.mktemp("plan-fuzz")
    plan = the_plan()
    samples = len(plan.samples) + 1
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("SHARDIO_CACHE_DIR", str(cache))
        written = planfiles.save(NAME, plan, samples)
        assert written is not None
        files = {name: (Path(written) / name).read_bytes() for name in os.listdir(written)}
        yield {"plan": plan, "samples": samples, "files": files, "directory": Path(written)}


def restore(pristine: dict[str, Any]) -> Path:
    directory: Path = pristine["directory"]
    directory.parent.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(directory.parent, 0, 0)
    if directory.is_dir() and not directory.is_symlink():
        shutil.rmtree(directory)
    elif os.path.lexists(directory):  # a FIFO, a link, a file (rmtree would open a FIFO and block)
        directory.unlink()
    directory.mkdir()
    for name, data in pristine["files"].items():
        (directory / name).write_bytes(data)
    return directory


def special(path: Path, kind: str) -> None:
    """Put ``kind`` in ``path``'s place."""
    if kind == "writable by others":
        path.chmod(0o666)
        return
    if kind == "another user's":
        if os.geteuid() == 0:
            os.chown(path, 54321, 54321)
        return
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge header":  # a header that claims 2**40 ids, on a small file
        header = b"{'descr': '<i8', 'fortran_order': False, 'shape': (1099511627776,), }"
        path.write_bytes(
            b"\x93NUMPY\x01\x00" + (118).to_bytes(2, "little") + header.ljust(117) + b"\n" + bytes(64)
        )


class Hung(BaseException):
    """A case past its time limit (not an OSError, which the code under test may take for a damaged file)."""


def same(got: RankPlan, expected: RankPlan) -> bool:
    return (
        np.array_equal(got.ids, expected.ids)
        and np.array_equal(got.offsets, expected.offsets)
        and all(
            np.array_equal(got.repeat_flags(j), expected.repeat_flags(j)) for j in range(expected.num_batches)
        )
    )


def obtained_within_limits(pristine: dict[str, Any], rank: int) -> RankPlan | ShardioError:
    """Rank ``rank``'s share (or the ShardioError) within :data:`CASE_S` and :data:`PEAK_BYTES`."""

    def late(*_: Any) -> None:
        raise Hung(f"obtaining a plan took over {CASE_S} s")

    previous = signal.signal(signal.SIGALRM, late)
    outer, begun = signal.alarm(CASE_S), time.monotonic()  # pytest-timeout's alarm, re-armed after
    tracemalloc.start()
    try:
        return planfiles.obtain(NAME, rank, pristine["samples"], lambda: pristine["plan"])
    except ShardioError as exc:
        return exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.alarm(max(1, outer - int(time.monotonic() - begun)))
        assert peak < PEAK_BYTES, peak


@FUZZ
@given(
    target=st.sampled_from([*FILES, "the plan's directory", "the plans directory"]),
    change=st.one_of(st.lists(MUTATION, min_size=1, max_size=3), st.sampled_from(SPECIALS)),
    rank=st.integers(0, WORLD_SIZE - 1),
)
def test_damaged_plan_files(pristine: dict[str, Any], target: str, change: Any, rank: int) -> None:
    directory = restore(pristine)
    path = {"the plan's directory": directory, "the plans directory": directory.parent}.get(target)
    if path is None:
        path = directory / target
        if isinstance(change, list):
            path.write_bytes(mutate(pristine["files"].get(target, b""), change))
    if isinstance(change, str):
        if target == "the plans directory" and change not in ("writable by others", "another user's"):
            change = "writable by others"  # replacing the cache's plans directory is one of these to a reader
        special(path, change)
    elif path.is_dir():
        path.chmod(0o777)
    got = obtained_within_limits(pristine, rank)
    assert isinstance(got, ShardioError) or same(got, rank_plan(pristine["plan"], rank))
