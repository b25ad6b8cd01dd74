"""A ShardLoader worker's credits (shardio.loader.credits): a semaphore and an interruption counter in shared
memory, across real processes; and through a ShardLoader, a worker that never runs more than its prefetch
ahead and that an interruption wakes while it waits for a credit."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio import Decoding, ShardDataset, ShardLoader
from shardio.loader import server
from shardio.loader.channel import Channel
from shardio.loader.credits import Credits
from tests.sample_shards import make_uneven_dataset

_made = multiprocessing.get_context("fork").Value("i", 0)  # samples the (forked) workers have read


def _count_sample(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    with _made.get_lock():
        _made.value += 1
    return sample


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("credits")
    make_uneven_dataset(directory, [12, 12, 12], seed=4)
    return directory


def _take_then_report(credits: Credits, since: int, results: Any) -> None:
    taken = 0
    while credits.take(0.2) and not credits.interrupted(since):
        taken += 1
    results.put((taken, credits.interrupted(since)))
    while not credits.take(30.0):  # blocked until the training process interrupts
        pass
    results.put(credits.interrupted(since))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_worker_takes_exactly_the_credits_granted_and_wakes_when_interrupted(method: str) -> None:
    context = multiprocessing.get_context(method)
    credits, results = Credits(context), context.Queue()
    credits.grant()  # left from an earlier iteration: reset removes it
    since = credits.reset(3)
    worker = context.Process(target=_take_then_report, args=(credits, since, results))
    worker.start()
    assert results.get(timeout=30) == (3, False)  # the three credits, then a timeout
    began = time.monotonic()
    credits.interrupt()
    assert results.get(timeout=30) is True
    assert time.monotonic() - began < 10  # woken, not timed out (it waits 30 s at a time)
    worker.join(30)
    assert worker.exitcode == 0


def test_reset_leaves_exactly_the_count_and_returns_the_interruptions_so_far() -> None:
    credits = Credits(multiprocessing.get_context("fork"))
    for _ in range(5):
        credits.grant()
    assert credits.reset(2) == 0
    assert credits.take(0.0) and credits.take(0.0) and not credits.take(0.0)
    credits.interrupt()
    since = credits.reset(0)
    assert since == 1 and not credits.interrupted(since) and not credits.take(0.0)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_worker_runs_at_most_its_prefetch_ahead(data: Path, prefetch: int) -> None:
    _made.value = 0
    dataset = ShardDataset(data, batch_size=3, seed=1, decoding=Decoding(transform=_count_sample))
    expected = [list(batch["keys"]) for batch in ShardDataset(data, batch_size=3, seed=1)]
    with ShardLoader(dataset, num_workers=1, prefetch=prefetch, multiprocessing_context="fork") as loader:
        iterator = iter(loader)
        got = [list(next(iterator)["keys"])]
        time.sleep(1.0)  # time enough to read every batch, were it not for the credits
        assert _made.value <= 3 * (1 + prefetch) < 3 * len(expected)  # the one taken, and one per credit
        got += [list(batch["keys"]) for batch in iterator]
    assert got == expected


def test_an_interruption_wakes_a_worker_waiting_for_a_credit(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        server, "WATCH_S", 60.0
    )  # inherited by forked workers: only the interruption wakes them
    with ShardLoader(
        ShardDataset(data, batch_size=3, seed=1), num_workers=2, prefetch=1, multiprocessing_context="fork"
    ) as loader:
        first = iter(loader)
        next(first)
        time.sleep(0.5)  # both workers made their next batches and wait for credits
        began = time.monotonic()
        second = [batch["keys"] for batch in loader]  # stops the first iteration: STOP to each worker
        assert time.monotonic() - began < 30
        assert len(second) == len(loader)


def test_an_iteration_stopped_right_after_start_still_begins_its_epoch(data: Path) -> None:
    """A worker told to stop before its first batch (a slow worker's START and STOP arrive together) still
    makes that batch: it begins the epoch, so the worker's next iteration plays the next
    epoch, as the others do."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=True)
    credits = Credits(context)
    since = credits.reset(2)
    credits.interrupt()
    ours.send(server.STOP)
    dataset = ShardDataset(data, batch_size=3, seed=1)
    assert server._iterate(Channel(theirs), credits, dataset, since, os.getppid())
    sent = []
    while ours.poll(1.0):
        sent.append(ours.recv()[0])
    assert sent == [server.BATCH, server.STOPPED]
    after = ShardDataset(data, batch_size=3, seed=1)
    after.set_epoch(1)
    assert [list(b["keys"]) for b in dataset] == [list(b["keys"]) for b in after]
