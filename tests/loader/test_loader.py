"""ShardLoader (shardio.loader.loader): the 0-worker batches in the 0-worker order from real worker processes
(fork, forkserver, spawn), an exact state after any batch, held batches never overwritten, and a worker's
error, death or silence raised in the training process instead of a hang; each with batches pinned by the
pin-memory thread too (with a stand-in for torch's pinning where there is no accelerator)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

from shardio import Decoding, FormatError, OptionError, Ordering, ShardDataset, ShardLoader
from shardio.loader import pinning, server
from shardio.reading import blocks
from tests.sample_shards import make_uneven_dataset

OPTIONS: dict[str, Any] = {"batch_size": 3, "seed": 5, "ordering": Ordering(shuffle_shards=2)}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("loader")
    make_uneven_dataset(directory, [7, 12, 4, 9], seed=3)
    return directory


@pytest.fixture(scope="module")
def long_wavs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("long_wavs")
    make_uneven_dataset(directory, [40, 30], seed=5, duration_range=(2.0, 5.0))  # batches of 8: over 1 MiB
    return directory


@pytest.fixture(params=[False, True], ids=["plain", "pinned"])
def pin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]] | None:
    """None, or (pinned) the copies that loaders made by :func:`loader_for` pinned: without an accelerator a
    clone stands in for torch's pinning, recording the thread that made it and that
    thread's intra-op threads."""
    if not request.param:
        return None
    copies: list[tuple[str, int]] = []

    def clone(batch: dict[str, Any]) -> dict[str, Any]:
        copies.append((threading.current_thread().name, torch.get_num_threads()))
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    if not torch.cuda.is_available():
        monkeypatch.setattr(pinning, "pin_memory", clone)
    return copies


def loader_for(dataset: ShardDataset, pin: list[tuple[str, int]] | None, **options: Any) -> ShardLoader:
    loader = ShardLoader(dataset, **options)
    loader.pin_memory = pin is not None
    return loader


def pinned_in_their_thread(pin: list[tuple[str, int]] | None) -> bool:
    """True unless batches were pinned outside the pin-memory thread or with more than one intra-op thread;
    and once every loader is closed, no pin-memory thread is left."""
    alive = [t for t in threading.enumerate() if t.name == "shardio-pin-memory"]
    return not alive and (
        pin is None or torch.cuda.is_available() or bool(pin) and set(pin) == {("shardio-pin-memory", 1)}
    )


def keys(batches: Any) -> list[tuple[str, ...]]:
    return [tuple(batch["keys"]) for batch in batches]


def straight(data: Path, epochs: range, **options: Any) -> list[list[tuple[str, ...]]]:
    ds = ShardDataset(data, **{**OPTIONS, **options})
    played = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        played.append(keys(ds))
    return played


@pytest.mark.parametrize(
    "method,workers,persistent",
    [
        ("fork", 1, True),
        ("fork", 3, False),
        ("forkserver", 2, True),
        pytest.param("spawn", 2, False, marks=pytest.mark.slow),
    ],
)
def test_epochs_are_the_zero_worker_epochs(
    data: Path, method: str, workers: int, persistent: bool, pin: list[tuple[str, int]] | None
) -> None:
    with loader_for(
        ShardDataset(data, **OPTIONS),
        pin,
        num_workers=workers,
        persistent_workers=persistent,
        multiprocessing_context=method,
    ) as loader:
        played = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert len(loader) == len(straight(data, range(epoch, epoch + 1))[0])
            played.append(keys(loader))
    assert played == straight(data, range(3))
    assert pinned_in_their_thread(pin)


def test_epochs_advance_without_set_epoch_and_zero_workers_iterate_here(data: Path) -> None:
    for workers in (0, 2):
        loader = ShardLoader(ShardDataset(data, **OPTIONS), num_workers=workers)
        assert [keys(loader) for _ in range(2)] == straight(data, range(2))
        loader.close()


@pytest.mark.parametrize("workers_after", [2, pytest.param(3, marks=pytest.mark.slow), 0])
def test_a_state_after_any_batch_resumes_exactly(
    data: Path, workers_after: int, pin: list[tuple[str, int]] | None
) -> None:
    expected = [key for epoch in straight(data, range(2)) for key in epoch]
    n = len(straight(data, range(1))[0])
    for stop in (0, 1, n - 1, n, n + 2):
        first = loader_for(ShardDataset(data, **OPTIONS), pin, num_workers=2)
        got: list[tuple[str, ...]] = []
        state = first.state_dict()
        for epoch in range(2):
            first.set_epoch(epoch)
            for batch in first:
                if len(got) == stop:
                    break
                got.append(tuple(batch["keys"]))
                state = first.state_dict()
            if len(got) == stop:
                break
        first.close()
        state = json.loads(json.dumps(state))
        second = loader_for(ShardDataset(data, **OPTIONS), pin, num_workers=workers_after)
        second.load_state_dict(state)
        for epoch in range(state["epoch"], 2):
            second.set_epoch(epoch)
            got += keys(second)
        second.close()
        assert got == expected, f"stopped after {stop} batches"
        assert pinned_in_their_thread(pin if workers_after else None)


def test_break_then_iterate_plays_the_next_epoch_as_a_dataloader_does(
    data: Path, pin: list[tuple[str, int]] | None
) -> None:
    loader = loader_for(ShardDataset(data, **OPTIONS), pin, num_workers=2)
    iter(loader)  # begins nothing: Lightning calls iter() to check that a loader is iterable
    first = iter(loader)
    next(first)
    assert keys(loader) == straight(data, range(1, 2))[0]  # a new iteration supersedes the old one
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    loader.close()
    assert pinned_in_their_thread(pin)


def test_held_batches_are_never_overwritten(long_wavs: Path, pin: list[tuple[str, int]] | None) -> None:
    options = {"batch_size": 8, "seed": 2}
    expected = [(list(b["keys"]), b["audio"].clone()) for b in ShardDataset(long_wavs, **options)]
    assert len(expected) > blocks.LIMIT  # each worker runs out of blocks while all are held
    with loader_for(ShardDataset(long_wavs, **options), pin, num_workers=2, prefetch=3) as loader:
        held = list(loader)  # every batch alive until the end: no block may be written again meanwhile
    assert [b["keys"] for b in held] == [k for k, _ in expected]
    for batch, (_, audio) in zip(held, expected):
        assert torch.equal(batch["audio"], audio)


def test_a_worker_error_is_raised_typed_with_the_worker_s_traceback(
    tmp_path: Path, pin: list[tuple[str, int]] | None
) -> None:
    index = make_uneven_dataset(tmp_path, [6, 6], seed=1)
    shard = Path(index.shard_path(1))
    raw = bytearray(shard.read_bytes())
    raw[int(index.columns["frame_offset"][9]) + 3] ^= 0xFF  # a byte of sample 9's member name
    shard.write_bytes(bytes(raw))
    loader = loader_for(ShardDataset(tmp_path, batch_size=2, shuffle=False), pin, num_workers=2)
    with pytest.raises(FormatError, match="tar header checksum mismatch") as raised:
        list(loader)
    assert "raised in shardio loader worker" in "".join(raised.value.__notes__)
    assert str(shard) in str(raised.value) and index.keys[9] in str(raised.value)
    loader.close()
    assert pinned_in_their_thread(pin)


def _stall(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if os.environ.get("SHARDIO_TEST_STALL"):
        time.sleep(60)
    return sample


def _stall_worker_1(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    info = get_worker_info()
    if os.environ.get("SHARDIO_TEST_STALL") and info is not None and info.id == 1:
        time.sleep(60)
    return sample


def test_a_dead_worker_fails_the_iteration_instead_of_hanging(
    data: Path, monkeypatch: pytest.MonkeyPatch, pin: list[tuple[str, int]] | None
) -> None:
    monkeypatch.setenv("SHARDIO_TEST_STALL", "1")
    loader = loader_for(
        ShardDataset(data, **OPTIONS, decoding=Decoding(transform=_stall_worker_1)), pin, num_workers=2
    )
    iterator = iter(loader)
    next(iterator)  # worker 0's first batch; worker 1 is stuck in its first
    victim = loader._pool.workers[1].process
    threading.Timer(0.5, os.kill, (victim.pid, signal.SIGKILL)).start()
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"worker 1 \(pid {victim.pid}\) exited unexpectedly .*signal 9"):
        next(iterator)
    assert time.monotonic() - began < 30
    assert not loader._pool.workers  # the other one was ended too
    loader.close()
    assert pinned_in_their_thread(pin)


@pytest.mark.parametrize(
    "method",
    [
        "fork",
        pytest.param("forkserver", marks=pytest.mark.slow),
        pytest.param("spawn", marks=pytest.mark.slow),
    ],
)
def test_workers_outlast_a_training_step_longer_than_their_watch(data: Path, method: str) -> None:
    """A worker waiting for a credit, or between iterations, looks every ``WATCH_S`` whether the training
    process is gone; under forkserver its parent is the fork server, not the training process."""
    with ShardLoader(
        ShardDataset(data, **OPTIONS),
        num_workers=2,
        prefetch=1,
        persistent_workers=True,
        multiprocessing_context=method,
    ) as loader:
        played = []
        for number, batch in enumerate(loader):
            played.append(tuple(batch["keys"]))
            if number == 0:
                time.sleep(2.5 * server.WATCH_S)  # a long step: the workers wait for credits
        time.sleep(2.5 * server.WATCH_S)  # between epochs: they wait for START
        played_next = keys(loader)
    assert [played, played_next] == straight(data, range(2))


def _orphaned_workers_exit(data: str, method: str) -> None:
    loader = ShardLoader(
        ShardDataset(data, **OPTIONS), num_workers=2, prefetch=1, multiprocessing_context=method
    )
    next(iter(loader))
    print(" ".join(str(worker.process.pid) for worker in loader._pool.workers), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the training process dies without a word to its workers


@pytest.mark.parametrize("method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_workers_exit_once_the_training_process_is_killed(data: Path, method: str) -> None:
    paths = [str(Path(__file__).parents[2]), str(Path(__file__).parents[1])]
    code = (
        f"import sys; sys.path[:0] = {paths!r}\n"
        f"from tests.loader.test_loader import _orphaned_workers_exit\n"
        f"if __name__ == '__main__':\n    _orphaned_workers_exit({str(data)!r}, {method!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, "an orphaned worker kept running"
        time.sleep(0.2)


@pytest.mark.parametrize("pin_memory", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_an_iterator_left_unfinished_at_exit_closes_quietly(data: Path, pin_memory: bool) -> None:
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"  # pin_memory without an accelerator warns
        "from shardio import ShardDataset, ShardLoader\n"
        f"loader = ShardLoader(ShardDataset({str(data)!r}, batch_size=3), num_workers=2, "
        f"pin_memory={pin_memory})\n"
        "batches = iter(loader)\n"
        "next(batches)\n"
        "print(*[worker.process.pid for worker in loader._pool.workers])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    # the iterator was finalised after the modules it halts with: "Exception ignored ... AttributeError"
    assert done.returncode == 0 and done.stderr == "", done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2 and not any(_running(pid) for pid in pids)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie no one reaps has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_silent_worker_fails_at_the_timeout(
    data: Path, monkeypatch: pytest.MonkeyPatch, pin: list[tuple[str, int]] | None
) -> None:
    monkeypatch.setenv("SHARDIO_TEST_STALL", "1")
    loader = loader_for(
        ShardDataset(data, **OPTIONS, decoding=Decoding(transform=_stall)), pin, num_workers=1, timeout=0.5
    )
    with pytest.raises(RuntimeError, match=r"gave no batch in 0.5 s"):
        next(iter(loader))
    assert not loader._pool.workers
    loader.close()
    assert pinned_in_their_thread(None)  # no batch was pinned, and the thread is gone


def test_refusals(data: Path) -> None:
    with pytest.raises(OptionError, match="batch_size or max_duration"):
        ShardLoader(ShardDataset(data))
    with pytest.raises(OptionError, match="not a list"):
        ShardLoader([1, 2])  # type: ignore[arg-type]
    for bad in ({"num_workers": -1}, {"prefetch": 0}, {"timeout": -1}, {"num_workers": 1.5}):
        with pytest.raises(OptionError):
            ShardLoader(ShardDataset(data, **OPTIONS), **bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the warning without an accelerator")
def test_pin_memory_without_an_accelerator_warns_and_yields_plain_batches(data: Path) -> None:
    with pytest.warns(UserWarning, match="no accelerator"):
        loader = ShardLoader(ShardDataset(data, **OPTIONS), num_workers=0, pin_memory=True)
    assert keys(loader) == straight(data, range(1))[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an accelerator to pin memory for")
def test_pin_memory_on_an_accelerator_yields_pinned_copies_that_outlive_the_blocks(long_wavs: Path) -> None:
    options = {"batch_size": 8, "seed": 2}
    expected = list(ShardDataset(long_wavs, **options))
    with ShardLoader(
        ShardDataset(long_wavs, **options), num_workers=2, pin_memory=True, prefetch=3
    ) as loader:
        held = list(loader)  # every batch kept: more batches than blocks in flight
    assert keys(held) == keys(expected)
    for got, want in zip(held, expected):
        assert got["audio"].is_pinned() and got["lengths"].is_pinned()
        assert torch.equal(got["audio"], want["audio"]) and torch.equal(got["lengths"], want["lengths"])
        assert torch.equal(got["audio"].to("cuda", non_blocking=True).cpu(), want["audio"])


def test_workers_do_not_run_the_training_process_s_signal_handlers(data: Path, tmp_path: Path) -> None:
    marker = tmp_path / "handled"
    previous = signal.signal(signal.SIGTERM, lambda *_: marker.write_text(str(os.getpid())))  # as Lightning's
    try:
        loader = ShardLoader(ShardDataset(data, **OPTIONS), num_workers=1, multiprocessing_context="fork")
        next(iter(loader))
        worker = loader._pool.workers[0].process
        worker.terminate()  # what multiprocessing does to daemonic workers when the training process exits
        worker.join(30)
        assert worker.exitcode == -signal.SIGTERM and not marker.exists()
    finally:
        signal.signal(signal.SIGTERM, previous)
