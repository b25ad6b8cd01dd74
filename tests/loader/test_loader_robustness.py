"""ShardLoader under real signals, each run in a subprocess (a session of its own, killed whole) with a time
limit so that a hang fails the test: a worker stopped (SIGSTOP) without a ``timeout`` is named in a warning
while the loader waits, and the epoch goes on exactly once it resumes; with ``timeout`` it fails named, also
when it stopped right after handing a batch over (whose tensors' file descriptors travel with the message);
Ctrl-C (SIGINT to the whole process group) in the middle of an epoch leaves the next iteration exact and no
worker behind."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import get_worker_info

from shardio import Decoding, Ordering, ShardDataset, ShardLoader
from shardio.loader import silence
from shardio.loader.channel import Channel
from shardio.loader.server import BATCH
from tests.sample_shards import make_uneven_dataset

pytestmark = pytest.mark.timeout(180)

OPTIONS: dict[str, Any] = {"batch_size": 2, "seed": 3, "ordering": Ordering(shuffle_shards=2)}
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("robustness")
    make_uneven_dataset(directory, [5, 6, 4, 5], seed=7, duration_range=(0.02, 0.05))
    return directory


def run(function: str, *args: Any, limit: float = 90.0) -> subprocess.CompletedProcess[str]:
    """``function(*args)`` of this module in a fresh interpreter, in a session of its own; past ``limit``
    seconds the test fails and the session is killed whole (its workers too, stopped ones included).

    The interpreter starts with SIGINT at Python's handler, as a terminal's foreground job has it: a test run
    started in the background of a shell without job control (``pytest ... &`` in a script) inherits SIGINT
    ignored, and Python then never installs its handler, so the Ctrl-C test's signal was lost."""
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"import sys; sys.path[:0] = {[str(ROOT), str(ROOT / 'tests')]!r}\n"
        f"from tests.loader.test_loader_robustness import {function}\n"
        f"if __name__ == '__main__':\n    {function}(*{args!r})\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        pytest.fail(
            f"{function}{args!r} hung: killed after {limit:g} s\nstdout:\n{stdout}\nstderr:\n{stderr}"
        )
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def epochs(data: str, count: int) -> list[list[list[str]]]:
    """The keys of each batch of epochs 0 .. count - 1, iterated without workers."""
    dataset = ShardDataset(data, **OPTIONS)
    return [[list(batch["keys"]) for batch in dataset] for _ in range(count)]


# -- a stopped worker ---------------------------------------------------------------------------------


class StopAt:
    """A transform that stops its own worker process (SIGSTOP, as job control or a debugger would) at one key,
    in the middle of making a batch."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, sample: dict[str, Any], rng: Any) -> dict[str, Any]:
        if sample["key"] == self.key and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGSTOP)
        return sample


def _stopping_loader(
    data: str, timeout: float
) -> tuple[ShardLoader, Iterator[dict[str, Any]], list[list[str]]]:
    """A loader whose worker 1 stops itself while making batch 3 (its second), its iterator, and the keys of
    the first batch (taken: the workers are running)."""
    key = epochs(data, 1)[0][3][0]
    dataset = ShardDataset(data, **OPTIONS, decoding=Decoding(transform=StopAt(key)))
    loader = ShardLoader(dataset, num_workers=2, prefetch=1, multiprocessing_context="fork", timeout=timeout)
    batches = iter(loader)
    return loader, batches, [list(next(batches)["keys"])]


def _stopped_worker(data: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    silence.SILENT_S = 1.0  # instead of a minute
    loader, batches, keys = _stopping_loader(data, 0)
    pid = loader._pool.workers[1].process.pid
    waking = threading.Timer(4.0, os.kill, (pid, signal.SIGCONT))
    waking.start()
    try:
        began = time.monotonic()
        keys += [list(batch["keys"]) for batch in batches]
        print(json.dumps({"pid": pid, "keys": keys, "waited": time.monotonic() - began}))
    finally:
        waking.cancel()
        os.kill(pid, signal.SIGCONT)
        loader.close()


@pytest.mark.slow
def test_a_stopped_worker_is_named_while_the_loader_waits_and_its_batches_follow(data: Path) -> None:
    done = run("_stopped_worker", str(data))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["keys"] == epochs(str(data), 1)[0]  # every batch, in order, once the worker resumed
    assert result["waited"] >= 3.0  # it did wait for the stopped worker
    pid = result["pid"]
    assert (
        f"shardio loader worker 1 (pid {pid}) has given nothing for 1 s and is stopped (SIGSTOP"
        in done.stderr
    )
    assert f"worker 1 (pid {pid}) has given nothing for 2 s" in done.stderr  # again once the wait doubled
    assert "worker 0" not in done.stderr


def _stopped_worker_at_the_timeout(data: str) -> None:
    loader, batches, _ = _stopping_loader(data, 1.0)
    pid = loader._pool.workers[1].process.pid
    began = time.monotonic()
    try:
        for _ in batches:
            pass
    except RuntimeError as error:
        print(json.dumps({"pid": pid, "error": str(error), "after": time.monotonic() - began}), flush=True)
    # the training process ends now: multiprocessing joins its daemon workers at exit, a stopped one too


def test_a_stopped_worker_fails_at_the_timeout_named_and_is_ended(data: Path) -> None:
    done = run("_stopped_worker_at_the_timeout", str(data))
    assert done.returncode == 0, done.stderr  # not killed by run's time limit: the exit did not hang
    result = json.loads(done.stdout)
    pid = result["pid"]
    assert result["error"] == (
        f"shardio loader worker 1 (pid {pid}) gave no batch in 1 s (timeout); it was "
        f"stopped (SIGSTOP or job control: SIGCONT resumes it)"
    )
    assert result["after"] < 5.0  # the timeout, not the timeout and the seconds spent asking a stopped worker
    assert not _running(pid)


# -- a worker stopped right after handing a batch over ------------------------------------------------


@pytest.fixture(scope="module")
def long_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Batches whose audio is a view of its worker's block (over 4 KiB): a block's first trip sends it."""
    directory = tmp_path_factory.mktemp("robustness_long")
    make_uneven_dataset(directory, [5, 6, 4, 5], seed=7, duration_range=(0.5, 1.0))
    return directory


def _stop_after_handing_over() -> None:
    """Make worker 1 stop itself (SIGSTOP) right after sending its first batch, a message whose tensors'
    memory travels by file descriptor (the block's first trip; or, audio under 4 KiB, every tensor)."""
    send = Channel.send
    stopped: list[bool] = []

    def sending(self: Channel, message: Any) -> None:
        send(self, message)
        info = get_worker_info()
        if info is not None and info.id == 1 and message[0] == BATCH and not stopped:
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGSTOP)

    Channel.send = sending  # type: ignore[method-assign]  # this interpreter's, and its forked workers'


def _rest_of_an_epoch(loader: ShardLoader, timeout: float, stop: Any = None) -> None:
    """Take the first batch (worker 0's: the workers are running), then the rest of the epoch, worker 1 being
    stopped (by ``stop(pid)`` now, or by itself) and, without ``timeout``, woken 4 s later; print the keys
    taken, the error if any, and how long the rest took, as JSON."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    silence.SILENT_S = 1.0  # instead of a minute
    batches = iter(loader)
    keys = [list(next(batches)["keys"])]
    pids = [worker.process.pid for worker in loader._pool.workers]
    if stop is not None:
        stop(pids[1])
    waking = threading.Timer(4.0, os.kill, (pids[1], signal.SIGCONT))
    if not timeout:  # with one, the stopped worker is never woken: the timeout must end the wait
        waking.start()
    began = time.monotonic()
    result: dict[str, Any] = {"pids": pids, "trainer": os.getpid()}
    try:
        keys += [list(batch["keys"]) for batch in batches]
    except RuntimeError as error:
        result["error"] = str(error)
    finally:
        waking.cancel()
    result.update(keys=keys, after=time.monotonic() - began)
    if not timeout:
        loader.close()
    print(json.dumps(result), flush=True)
    # with a timeout, the training process ends now: the stopped worker must not hang its exit


def _stopped_at_hand_off(data: str, timeout: float) -> None:
    _stop_after_handing_over()
    _rest_of_an_epoch(
        ShardLoader(
            ShardDataset(data, **OPTIONS),
            num_workers=2,
            prefetch=1,
            multiprocessing_context="fork",
            timeout=timeout,
        ),
        timeout,
    )


@pytest.mark.parametrize(
    "timeout", [1.0, pytest.param(0.0, marks=pytest.mark.slow)], ids=["timeout", "no_timeout"]
)
@pytest.mark.parametrize("audio", ["short", pytest.param("long", marks=pytest.mark.slow)])
def test_a_worker_stopped_right_after_handing_a_batch_over_is_named(
    data: Path, long_data: Path, audio: str, timeout: float
) -> None:
    directory = str(data if audio == "short" else long_data)
    shm = set(os.listdir("/dev/shm"))
    done = run("_stopped_at_hand_off", directory, timeout, limit=40)
    assert done.returncode == 0, done.stderr  # not killed at the limit: neither the wait nor the exit hung
    result = json.loads(done.stdout)
    pid = result["pids"][1]
    if timeout:
        assert result["error"] == (
            f"shardio loader worker 1 (pid {pid}) gave no batch in 1 s (timeout); it "
            f"was stopped (SIGSTOP or job control: SIGCONT resumes it)"
        )
        assert result["after"] < 5.0  # the timeout, not the seconds spent asking a stopped worker
    else:
        assert "error" not in result
        assert result["keys"] == epochs(directory, 1)[0]  # every batch, in order, once the worker resumed
        named = f"shardio loader worker 1 (pid {pid}) has given nothing for 1 s and is stopped (SIGSTOP"
        assert named in done.stderr
        assert "worker 0" not in done.stderr
    deadline = time.monotonic() + 10
    while any(_running(worker) for worker in result["pids"]):
        assert time.monotonic() < deadline, "a worker outlived its training process"
        time.sleep(0.1)
    pids = [result["trainer"], *result["pids"]]
    assert not [name for name in set(os.listdir("/dev/shm")) - shm if any(f"_{p}_" in name for p in pids)]


class Bloated:
    """A transform that gives each sample a 1 MB field: a batch's message is larger than its pipe's buffer."""

    def __call__(self, sample: dict[str, Any], rng: Any) -> dict[str, Any]:
        return {**sample, "notes": "x" * 1_000_000}


def _stop_in_the_middle_of_a_message(pid: int) -> None:
    time.sleep(1.0)  # worker 1 has made its batch and is blocked writing it: nobody reads its pipe yet
    os.kill(pid, signal.SIGSTOP)


def _stopped_in_a_message(data: str, timeout: float) -> None:
    loader = ShardLoader(
        ShardDataset(data, **OPTIONS, decoding=Decoding(transform=Bloated())),
        num_workers=2,
        prefetch=1,
        multiprocessing_context="fork",
        timeout=timeout,
    )
    _rest_of_an_epoch(loader, timeout, _stop_in_the_middle_of_a_message)


@pytest.mark.parametrize(
    "timeout", [1.0, pytest.param(0.0, marks=pytest.mark.slow)], ids=["timeout", "no_timeout"]
)
def test_a_worker_stopped_in_the_middle_of_a_large_message_is_named(data: Path, timeout: float) -> None:
    done = run("_stopped_in_a_message", str(data), timeout, limit=40)
    assert done.returncode == 0, done.stderr  # not killed at the limit: the training process read no rest
    result = json.loads(done.stdout)
    pid = result["pids"][1]
    if timeout:
        assert result["error"] == (
            f"shardio loader worker 1 (pid {pid}) gave no batch in 1 s (timeout); it "
            f"was stopped (SIGSTOP or job control: SIGCONT resumes it)"
        )
        assert result["after"] < 5.0
    else:
        assert "error" not in result
        assert result["keys"] == epochs(str(data), 1)[0]
        assert f"shardio loader worker 1 (pid {pid}) has given nothing for 1 s and is stopped" in done.stderr


def _send_large_and_stop(pipe: Any, size: int) -> None:
    torch.set_num_threads(1)
    channel = Channel(pipe, carry_fds=True)
    channel.send(("batch", {"audio": torch.arange(10), "notes": b"y" * size}))  # blocks: nobody reads yet
    channel.send(("end", None))


@pytest.mark.timeout(60)
def test_a_channel_reads_a_large_message_as_it_arrives_and_waits_no_longer_than_asked() -> None:
    size = 4 << 20
    ours, theirs = multiprocessing.get_context("fork").Pipe(duplex=True)
    sender = multiprocessing.get_context("fork").Process(
        target=_send_large_and_stop, args=(theirs, size), daemon=True
    )
    channel = Channel(ours)
    sender.start()
    theirs.close()
    fds = _open_fds()
    try:
        time.sleep(0.5)  # the sender is blocked in the middle of its message
        os.kill(sender.pid, signal.SIGSTOP)
        for _ in range(3):
            began = time.monotonic()
            assert not channel.ready(0.2)  # part of the message is there: read, kept, and not waited on
            assert time.monotonic() - began < 2.0
        os.kill(sender.pid, signal.SIGCONT)
        assert channel.ready(30.0)
        kind, batch = channel.receive()
        assert (
            kind == "batch"
            and batch["notes"] == b"y" * size
            and torch.equal(batch["audio"], torch.arange(10))
        )
        assert channel.ready(30.0) and channel.receive() == ("end", None)
        del batch
        sender.join(10)
        assert channel.ready(5.0)
        with pytest.raises(EOFError):
            channel.receive()
        assert not _open_fds() - fds  # none left open
    finally:
        sender.kill()
        sender.join(10)
        sender.close()  # its sentinel descriptor, closed now rather than when collected in a later test
        channel.close()


def _send_and_stop(pipe: Any) -> None:
    torch.set_num_threads(1)  # as a worker does: the intra-op pool a forked child inherits may never answer
    channel = Channel(pipe, carry_fds=True)
    tensors = [torch.full((2048,), float(i)) for i in range(300)]  # more than one sendmsg's 253 descriptors
    channel.send(("batch", {"tensors": tensors, "big": torch.arange(100_000)}))
    os.kill(os.getpid(), signal.SIGSTOP)


def _open_fds() -> set[int]:
    """This process's open descriptors. Compared as sets: garbage of earlier tests collected meanwhile closes
    descriptors of its own (a count then falls), but opens none."""
    gc.collect()
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.mark.timeout(60)
def test_a_message_s_descriptors_travel_with_it_so_a_stopped_sender_holds_nothing() -> None:
    ours, theirs = multiprocessing.get_context("fork").Pipe(duplex=True)
    sender = multiprocessing.get_context("fork").Process(target=_send_and_stop, args=(theirs,), daemon=True)
    channel = Channel(ours)
    sender.start()
    fds = _open_fds()
    try:
        assert channel.ready(30.0)
        deadline = time.monotonic() + 30
        while not silence.process_state(sender.pid).startswith("stopped"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        kind, batch = channel.receive()  # the sender stopped: a fetch from it would never end
        assert kind == "batch" and len(batch["tensors"]) == 300
        assert all(torch.equal(t, torch.full((2048,), float(i))) for i, t in enumerate(batch["tensors"]))
        assert torch.equal(batch["big"], torch.arange(100_000))
        del batch
        assert not _open_fds() - fds  # each of the 301 descriptors closed once its memory was mapped
    finally:
        sender.kill()
        sender.join(10)
        channel.close()
        theirs.close()


def test_a_channel_reads_tensors_a_plain_connection_sends_and_a_plain_one_refuses_carried_ones() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    channel = Channel(ours, carry_fds=True)
    tensor = torch.arange(10, dtype=torch.float32)
    theirs.send(("batch", {"audio": tensor}))  # its descriptor fetched from this process's resource sharer
    assert torch.equal(channel.receive()[1]["audio"], tensor)
    channel.send(("batch", {"audio": tensor}))
    with pytest.raises(RuntimeError, match="read it with a shardio.loader.channel.Channel"):
        theirs.recv()
    channel.send(("end", None))  # a message without descriptors: as Connection.send
    assert theirs.recv() == ("end", None)
    channel.close()
    theirs.close()


def test_a_silent_worker_s_state_is_read_from_proc() -> None:
    assert silence.process_state(os.getpid()) == "running"
    assert silence.process_state(None) == ""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not silence.process_state(child.pid).startswith("stopped"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    assert silence.process_state(child.pid) == ""  # reaped: gone


# -- Ctrl-C in the middle of an epoch --------------------------------------------------------------


def _interrupted(data: str, method: str, persistent: bool) -> None:
    expected = epochs(data, 3)
    dataset = ShardDataset(data, **OPTIONS)
    loader = ShardLoader(
        dataset, num_workers=2, persistent_workers=persistent, multiprocessing_context=method
    )
    seen = []
    try:
        for batch in loader:
            seen.append(list(batch["keys"]))
            if len(seen) == 3:
                os.killpg(os.getpgid(0), signal.SIGINT)  # Ctrl-C: the training process and its workers
                time.sleep(5)
    except KeyboardInterrupt:
        pass
    assert seen == expected[0][:3], seen
    assert loader.state_dict()["start"] == 3
    # the next iterations play the next epochs whole (the interrupted one was left, as with break)
    after = [[list(batch["keys"]) for batch in loader] for _ in range(2)]
    assert after == expected[1:], after
    print(json.dumps([worker.process.pid for worker in loader._pool.workers]))


@pytest.mark.parametrize(
    "persistent", [pytest.param(False, marks=pytest.mark.slow), True], ids=["fresh", "persistent"]
)
@pytest.mark.parametrize("method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_ctrl_c_in_an_epoch_leaves_the_next_ones_exact_and_no_worker_behind(
    data: Path, method: str, persistent: bool
) -> None:
    done = run("_interrupted", str(data), method, persistent)
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    assert len(pids) == (2 if persistent else 0)
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, "a worker outlived its training process"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie no one reaps has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
