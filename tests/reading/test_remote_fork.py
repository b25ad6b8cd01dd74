"""Remote filesystems across fork: a DataLoader worker must not pay for the filesystems of its parent.

fsspec's HTTP filesystem closes its aiohttp session from a finalizer that waits on the event loop it was made
on; in a forked child that loop has no thread, so the wait runs to fsspec's 1 s poll before giving up. Every
parent filesystem a child dropped cost it that second, and since the drop happened when the first read-ahead
thread asked for a filesystem (fsspec clears its instance cache in a new process) or when a cyclic collection
ran in fsspec's event-loop thread, all of a worker's first requests waited behind it: the 2-worker read-ahead
measured ~1 s slower per epoch than 0 workers.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from remote_servers import HTTPFileServer

from shardio.storage.files import filesystem
from shardio.storage.filesystems import Filesystems
from shardio.storage.retries import RetryPolicy


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPFileServer]:
    root = tmp_path_factory.mktemp("fork-http")
    (root / "blob").write_bytes(bytes(range(256)) * 64)
    with HTTPFileServer(str(root)) as server:
        yield server


_held: list[Any] = []  # the parent's Filesystems, or its fsspec filesystem
_parents: list[
    weakref.ref[Any]
] = []  # the parent's filesystem, weakly: alive in the child means not finalized


def _child_read(url: str, results: multiprocessing.Queue, drop: bool) -> None:  # type: ignore[type-arg]
    """Read in a forked child, dropping the parent's filesystems (as a worker does) or, to compare, keeping
    them (nothing of the parent's is finalized); the seconds it took, the bytes, whether the parent's
    filesystem is still alive."""
    started = time.perf_counter()
    if drop:
        _held.clear()
    fs, path = filesystem(url)
    gc.collect()  # the parent's filesystems are cycles: a collection, in whichever thread, finalizes them
    data = fs.cat_file(path, start=10, end=20)
    results.put((time.perf_counter() - started, bytes(data), _parents[0]() is not None))


def _parent_session(url: str) -> None:
    fs, path = filesystem(url)
    assert fs.cat_file(path, start=0, end=4) == bytes(range(4))  # the filesystem now holds an aiohttp session
    _parents[:] = [weakref.ref(fs)]
    _held.append(fs)  # for the comparing child to keep; a dropping child leaves it to fsspec's cache


@pytest.mark.parametrize("holder", [pytest.param("fsspec", marks=pytest.mark.slow), "reader"])
def test_a_forked_child_reads_without_waiting_on_the_parents_filesystem(
    http: HTTPFileServer, holder: str
) -> None:
    """The parent's filesystem is held by fsspec's instance cache only, or by a reader's Filesystems that the
    child drops (as Reader._after_fork does); either way the child never finalizes it, so its first read never
    waits the finalizer's second. (The test once also compared the children's times: a loaded machine made
    that fail; ``python benchmarks/remote.py`` measures the read-ahead's speed with workers.)"""
    url = f"{http.url}/blob"
    if holder == "fsspec":
        _parent_session(url)
    else:
        _held.append(Filesystems())
        fs, path = _held[0].get(url, None, "test", RetryPolicy())
        assert fs.cat_file(path, start=0, end=4) == bytes(range(4))
        _parents[:] = [weakref.ref(fs)]
        del fs
    gc.collect()  # what earlier tests dropped (made outside shardio) is finalized here, not in the child
    context = multiprocessing.get_context("fork")
    for drop in (True, False, True, False):  # the wait recurs in every dropping child
        results = context.Queue()
        child = context.Process(target=_child_read, args=(url, results, drop))
        child.start()
        _, data, kept = results.get(timeout=30)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert data == bytes(range(10, 20))
        assert kept, "the child finalized the parent's filesystem"
    _held.clear()
