"""Segments, the decoded cache's store, against a model: whatever the sequence of writes, reads, hints and
processes, a read returns the bytes last written under its number or nothing, never other bytes, and the
segment files never add up past the bound."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.storage.eviction import segment_sizes
from shardio.storage.segments import HEADER, Segments

COUNT = 40
BOUND = 3 << 20  # three reservations of 1 MiB: evictions come early


def _payload(number: int, version: int, size: int) -> bytes:
    return bytes([(number * 7 + version) % 251]) * size


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.integers(0, 1),
            st.integers(0, COUNT - 1),
            st.integers(1, 300_000),
        ),
        st.tuples(st.just("get"), st.integers(0, 1), st.integers(0, COUNT - 1), st.just(0)),
        st.tuples(st.just("hint"), st.integers(0, 1), st.integers(0, COUNT - 1), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
def test_reads_return_what_was_written_or_nothing_and_the_bound_holds(
    tmp_path_factory: object, steps: list[tuple[str, int, int, int]]
) -> None:
    directory = str(tmp_path_factory.mktemp("segments"))  # type: ignore[attr-defined]
    # two stores on one directory stand in for two processes of a node
    stores = [Segments(directory, "space", BOUND, COUNT) for _ in range(2)]
    written: dict[int, list[bytes]] = {}  # number -> every payload written under it
    version = 0
    for action, which, number, size in steps:
        store = stores[which]
        if action == "put":
            version += 1
            payload = _payload(number, version, size)
            if store.put(number, version, memoryview(payload)):
                written.setdefault(number, []).append(payload)
        elif action == "get":
            found = store.get(number)
            if found is not None:
                # a number written twice (by two processes) may read either: never anything else
                assert bytes(found[1]) in written.get(number, [])
        else:
            store.upcoming(np.array([number, (number + 1) % COUNT]))
        assert sum(size for size, _ in segment_sizes(directory).values()) <= BOUND
        assert store.distrusted == 0
    for store in stores:
        store.close()
    assert sum(size for size, _ in segment_sizes(directory).values()) <= BOUND


def test_the_upcoming_entries_are_evicted_last(tmp_path: Path) -> None:
    store = Segments(str(tmp_path), "space", 4 << 20, COUNT)  # segments of 1 MiB
    for number in range(12):
        assert store.put(number, 0, memoryview(_payload(number, 0, 900_000)))
    kept = [number for number in range(12) if store.get(number) is not None]
    assert len(kept) < 12
    store.upcoming(np.array(kept[:1]))
    for number in range(12, 20):
        store.put(number, 0, memoryview(_payload(number, 0, 900_000)))
    assert store.get(kept[0]) is not None  # the one entry named upcoming survived the evictions


def test_a_changed_byte_or_a_foreign_store_is_distrusted(tmp_path: Path) -> None:
    store = Segments(str(tmp_path / "a"), "space", 8 << 20, COUNT)
    assert store.put(3, 9, memoryview(b"x" * 1000))
    store.close()
    (segment,) = [path for path in segment_sizes(str(tmp_path / "a"))]
    data = bytearray(Path(segment).read_bytes())
    data[HEADER.size + 10] ^= 1
    Path(segment).write_bytes(bytes(data))
    store = Segments(str(tmp_path / "a"), "space", 8 << 20, COUNT)
    assert store.get(3) is None and store.distrusted == 1
    # a whole segment copied from another store (another secret): every entry distrusted
    other = Segments(str(tmp_path / "b"), "space", 8 << 20, COUNT)
    assert other.put(4, 1, memoryview(b"y" * 1000))
    other.close()
    (foreign,) = [path for path in segment_sizes(str(tmp_path / "b"))]
    os.replace(foreign, os.path.join(os.path.dirname(segment), "copied.seg"))
    store = Segments(str(tmp_path / "a"), "space", 8 << 20, COUNT)
    assert store.get(4) is None and store.distrusted == 1


def test_an_entry_is_checked_once_while_its_segment_is_unchanged_and_again_after_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Segments(str(tmp_path), "space", 8 << 20, COUNT)
    assert store.put(3, 9, memoryview(b"x" * 1000), b"tail")
    store.close()
    (segment,) = list(segment_sizes(str(tmp_path)))
    os.utime(segment, (time.time() - 3600, time.time() - 3600))  # written an hour ago: settled
    checks = []
    check = Segments._check
    monkeypatch.setattr(Segments, "_check", lambda self, *args: checks.append(1) or check(self, *args))
    store = Segments(str(tmp_path), "space", 8 << 20, COUNT)
    for _ in range(5):
        found = store.get(3)
        assert found is not None and found[0] == 9 and bytes(found[1]) == b"x" * 1000 + b"tail"
        time.sleep(0.002)  # past a status check's interval: the segment's status is looked at again
    assert len(checks) == 1
    with open(segment, "r+b") as changed:  # a byte of the payload changed in place, the size kept
        changed.seek(HEADER.size + 10)
        changed.write(b"y")
    time.sleep(0.002)
    assert store.get(3) is None and store.distrusted == 1 and len(checks) == 2


def test_a_segment_being_written_has_every_read_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Segments(str(tmp_path), "space", 8 << 20, COUNT)
    assert store.put(3, 9, memoryview(b"x" * 1000))
    checks = []
    check = Segments._check
    monkeypatch.setattr(Segments, "_check", lambda self, *args: checks.append(1) or check(self, *args))
    for _ in range(3):
        assert store.get(3) is not None
    assert len(checks) == 3  # its mtime is recent: a write within the file clock's tick would not move it
