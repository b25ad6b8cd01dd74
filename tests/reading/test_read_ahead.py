"""Read-ahead of remote reads: coalesced per shard, concurrent, and exact under injected faults."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from remote_servers import HTTPFileServer, serve_copy
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import Index, Ordering, Reading, RetryPolicy, ShardDataset
from shardio.reading.prefetch import ReadAhead, Span, coalesce, dense_for


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Index:
    return make_uneven_dataset(
        tmp_path_factory.mktemp("ahead") / "ds", [24, 24, 16], duration_range=(0.02, 0.05)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, local: Index) -> Iterator[HTTPFileServer]:
    with serve_copy(local.root, tmp_path_factory.mktemp("ahead-http")) as http:
        yield http


def keys_of(batches: list[dict]) -> list[list[str]]:
    return [list(batch["keys"]) for batch in batches]


def test_runs_of_a_shard_take_one_request_each(server: HTTPFileServer, local: Index) -> None:
    expected = keys_of(list(ShardDataset(local.root, batch_size=8, shuffle=False)))
    counts = {}
    for budget in (0, 1, 1 << 20):
        dataset = ShardDataset(
            f"{server.url}/ds", batch_size=8, shuffle=False, reading=Reading(read_ahead=budget)
        )
        assert keys_of(list(dataset)) == expected
        counts[budget] = dataset.stats.requests
    assert counts[0] == len(local)  # one ranged request per sample
    assert counts[1] == len(expected)  # one batch ahead: one request per batch (each is a run of one shard)
    assert counts[1 << 20] == len(local.shards)  # batches grouped: one request per run of a shard


def test_shuffled_read_ahead_gives_the_same_batches(server: HTTPFileServer, local: Index) -> None:
    expected = keys_of(
        list(ShardDataset(local.root, batch_size=5, ordering=Ordering(shuffle_shards=2), seed=3))
    )
    for budget in (1, 4096, 1 << 24):  # at least one batch ahead, a few, everything
        dataset = ShardDataset(
            f"{server.url}/ds",
            batch_size=5,
            ordering=Ordering(shuffle_shards=2),
            seed=3,
            reading=Reading(read_ahead=budget),
        )
        assert keys_of(list(dataset)) == expected
        assert dataset.stats.requests < len(local)


def test_two_workers_read_ahead_under_random_faults(server: HTTPFileServer, local: Index) -> None:
    expected = keys_of(list(ShardDataset(local.root, batch_size=4, seed=1)))
    dataset = ShardDataset(
        f"{server.url}/ds",
        batch_size=4,
        seed=1,
        reading=Reading(read_ahead=1 << 16, retry=RetryPolicy(attempts=6, backoff=0.005, max_backoff=0.02)),
    )
    server.faults.random(0.3, seed=7, match="shard-", max_in_row=2)
    try:
        batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
    finally:
        injected = sum(server.faults.injected.values())
        server.faults.clear()
    assert keys_of(batches) == expected  # nothing lost, nothing repeated, the same order
    assert not any(batch["skipped"] for batch in batches) and injected > 0


SPANS = st.lists(
    st.builds(
        lambda shard, start, length: Span(shard, start, start + length),
        st.integers(0, 2),
        st.integers(0, 1000),
        st.integers(0, 80),
    ),
    max_size=25,
)


@given(spans=SPANS, gap=st.integers(0, 100))
def test_coalesced_spans_cover_exactly_the_runs(spans: list[Span], gap: int) -> None:
    merged = coalesce(spans, gap)
    for span in spans:  # every span is read by one request
        assert sum(m.shard == span.shard and m.start <= span.start and span.end <= m.end for m in merged) == 1
    for a, b in zip(merged, merged[1:]):  # requests of one shard are apart by more than the gap
        assert a.shard < b.shard or b.start > a.end + gap
    for m in merged:  # and each starts and ends on a span of its shard
        assert any(s.shard == m.shard and s.start == m.start for s in spans)
        assert any(s.shard == m.shard and s.end == m.end for s in spans)


def test_a_mostly_wanted_shard_is_one_request() -> None:
    spans = [Span(0, start, start + 100) for start in range(0, 1000, 200)]  # half of bytes 0-900 wanted
    assert coalesce(spans, max_gap=10) == [Span(0, 0, 900)]
    assert coalesce(spans, max_gap=10, dense=0.6) == spans  # not dense enough: a request per span


def test_dense_threshold_follows_the_workers_share() -> None:
    assert dense_for(1.0) == 0.5
    assert dense_for(0.5) == 0.25
    assert dense_for(1 / 8) == 0.25  # never below: 8 workers would each fetch 8x the bytes they use


def test_requests_go_out_in_the_order_batches_need_them() -> None:
    """The first batch's spans are requested first, even when their shard sorts last: its reader waits for
    its own bytes, not for the whole group's."""
    wanted = {0: [Span(5, 0, 10)], 1: [Span(0, 0, 10), Span(3, 0, 10)], 2: [Span(3, 20, 30), Span(1, 0, 10)]}
    order: list[int] = []

    def fetch(span: Span) -> bytes:
        order.append(span.shard)
        return bytes(span.end - span.start)

    ahead = ReadAhead(lambda ids: wanted[int(ids[0])], fetch, concurrency=1, max_gap=0)
    batches = [np.array([b]) for b in range(3)]
    for ids in ahead.run(batches):
        for span in wanted[int(ids[0])]:
            assert ahead.take(span.shard, span.start, span.end - span.start) == bytes(span.end - span.start)
    assert order == [5, 0, 3, 1]  # shard 3's two spans are dense enough to be one request


def test_two_workers_read_runs_of_a_shard_in_few_requests(server: HTTPFileServer, local: Index) -> None:
    """Interleaved DataLoader workers each read every other batch of a shard's run: still about one request
    per shard and worker, not one per sample (exactly once, in plan order)."""
    options = {"batch_size": 4, "ordering": Ordering(shuffle_shards=1), "seed": 3}
    expected = keys_of(list(ShardDataset(local.root, **options)))
    server.faults.clear()
    dataset = ShardDataset(f"{server.url}/ds", **options)
    assert keys_of(list(DataLoader(dataset, batch_size=None, num_workers=2))) == expected
    # distinct ranges: a transport retry (a pooled connection the server had closed, under load) asks for a
    # range again, which is the network's doing, not the plan's
    reads = sum(1 for (method, path, _) in server.faults.ranges if method == "GET" and ".tar" in path)
    samples = len(local)
    assert reads <= 0.1 * samples + 2, f"{reads} ranged reads for {samples} samples"


def test_shard_size_checks_run_concurrently_in_the_read_ahead(server: HTTPFileServer, local: Index) -> None:
    """Each remote shard's size is checked once as it is opened; with read-ahead those checks run in its pool,
    not in turn in the reader (3 shards whose HEAD answers each take 1 s: ~1 s, not 3)."""
    expected = keys_of(list(ShardDataset(local.root, batch_size=8, seed=4)))
    server.faults.clear()
    server.faults.stall(len(local.shards), 1.0, match=".tar", method="HEAD")
    started = time.perf_counter()
    got = keys_of(list(ShardDataset(f"{server.url}/ds", batch_size=8, seed=4)))
    seconds = time.perf_counter() - started
    server.faults.clear()
    assert got == expected
    assert seconds < 2.5, f"{seconds:.2f} s: the size checks ran one after another"
