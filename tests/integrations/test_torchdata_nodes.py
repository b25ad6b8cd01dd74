"""ShardNode: a torchdata.nodes pipeline over a ShardDataset resumes exactly from a Loader's state.

Each case builds ``Loader(ParallelMapper(ShardNode(ds), ...))`` (with a ``Prefetcher`` on top, or a
``Batcher`` over an unbatched dataset), stops after some batches, saves ``loader.state_dict()``, and resumes
a new pipeline over a new dataset from it: the batches after the state equal the uninterrupted run's, epoch
after epoch, and the resumed node reads no batch before the state. A run stopped mid-epoch closes its node and
drains its iterator, which ends the pipeline's threads (left alone, they poll until the garbage collector
reaches them, in whatever test runs then).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchdata.nodes")

from sample_shards import dataset_fixture, planned_keys
from torchdata.nodes import Batcher, Loader, ParallelMapper, Prefetcher

from shardio import Ordering, ShardDataset
from shardio.errors import StateError
from shardio.integrations.torchdata import ShardNode

data = dataset_fixture("nodes", (7, 5, 9, 4), seed=1)  # 9 batches of 3 an epoch
EPOCHS = 3
ORDERING = Ordering(shuffle_shards=2)


def batch_keys(batch: dict[str, Any]) -> list[str]:
    return list(batch["keys"])


def pipeline(data: Path, kind: str) -> tuple[Loader, ShardNode]:
    """The pipeline of ``kind`` and its source node."""
    if kind == "batcher":  # samples, batched by torchdata
        node = ShardNode(ShardDataset(data, seed=5, ordering=ORDERING))
        batcher = Batcher(node, batch_size=3, drop_last=False)
        return Loader(
            ParallelMapper(batcher, map_fn=lambda samples: [s["key"] for s in samples], num_workers=2)
        ), node
    node = ShardNode(ShardDataset(data, batch_size=3, seed=5, ordering=ORDERING))
    mapped = ParallelMapper(node, map_fn=batch_keys, num_workers=2)
    return Loader(Prefetcher(mapped, prefetch_factor=2) if kind == "prefetch" else mapped), node


def planned(data: Path, kind: str) -> list[list[str]]:
    if kind != "batcher":
        return planned_keys(data, 1, EPOCHS, batch_size=3, seed=5, ordering=ORDERING)[0]
    dataset = ShardDataset(data, seed=5, ordering=ORDERING)
    samples = []
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        samples += [sample["key"] for sample in dataset]
    per_epoch = len(samples) // EPOCHS
    return [
        samples[e * per_epoch :][i : i + 3][: min(3, per_epoch - i)]
        for e in range(EPOCHS)
        for i in range(0, per_epoch, 3)
    ]


def run(
    loader: Loader, epochs: int, stop: int | None = None, node: ShardNode | None = None
) -> tuple[list[list[str]], dict[str, Any] | None]:
    """The batches of ``epochs`` iterations of ``loader`` (each ``iter()`` an epoch), up to ``stop`` of them;
    the loader's state there. Stopped, the pipeline is ended: ``node`` closed and the iterator drained
    (without a node, the drain plays the epoch out)."""
    seen: list[list[str]] = []
    for _ in range(epochs):
        iterator = iter(loader)
        for batch in iterator:
            seen.append(batch)
            if len(seen) == stop:
                state = loader.state_dict()
                if node is not None:
                    node.close()
                for _ in iterator:
                    pass
                return seen, state
    return seen, None


@pytest.mark.parametrize("kind", ["mapper", "prefetch", "batcher"])
def test_a_straight_run_plays_each_epoch(data: Path, kind: str) -> None:
    loader, _ = pipeline(data, kind)
    assert run(loader, EPOCHS)[0] == planned(data, kind)


@pytest.mark.parametrize(
    "kind,stop",
    [("mapper", 4), ("prefetch", 4), ("prefetch", 9), ("prefetch", 13), ("batcher", 5), ("batcher", 11)],
)
def test_resume_from_a_loader_state(data: Path, kind: str, stop: int) -> None:
    """Mid-epoch 0 (4), at its end (9: the next ``iter()`` plays epoch 1), mid-epoch 1 (13: across an
    epoch)."""
    plan = planned(data, kind)
    first, node = pipeline(data, kind)
    seen, state = run(first, EPOCHS, stop, node)
    assert seen == plan[:stop] and state is not None
    resumed, _ = pipeline(data, kind)
    resumed.load_state_dict(state)
    rest, _ = run(resumed, EPOCHS - stop // 9)
    assert rest == plan[stop:]


@pytest.mark.parametrize("kind", ["mapper", "prefetch", "batcher"])
def test_a_closed_node_ends_its_pipeline(data: Path, kind: str) -> None:
    """Closed mid-epoch, the node ends the epoch: the drained iterator hands on the few batches the mappers
    held, every pipeline thread ends, and the next ``iter()`` plays the next epoch whole. Without ``close``,
    the threads poll until the garbage collector reaches the pipeline."""
    plan = planned(data, kind)
    before = set(threading.enumerate())
    loader, node = pipeline(data, kind)
    iterator = iter(loader)
    seen = [next(iterator) for _ in range(2)]
    node.close()
    drained = list(iterator)
    # in plan order (a Batcher closed in the middle of a batch hands it on short)
    flat = [key for batch in seen + drained for key in batch]
    assert seen == plan[:2] and flat == [key for batch in plan for key in batch][: len(flat)]
    assert len(drained) < 9
    started = set(threading.enumerate()) - before
    for thread in started:
        thread.join(timeout=10)  # each polls its stop flag every 0.1 s
    assert started and not [thread.name for thread in started if thread.is_alive()]
    per_epoch = len(plan) // EPOCHS
    assert run(loader, 1)[0] == plan[per_epoch : 2 * per_epoch]


def test_the_resumed_node_reads_nothing_before_the_state(data: Path) -> None:
    """The state loads into the dataset (O(1)): with no mapper, the node's first batch is the only one
    read."""
    first = Loader(ShardNode(ShardDataset(data, batch_size=3, seed=5, ordering=ORDERING)))
    _, state = run(first, 1, 6)
    dataset = ShardDataset(data, batch_size=3, seed=5, ordering=ORDERING)
    resumed = Loader(ShardNode(dataset))
    resumed.load_state_dict(state)
    batch = next(iter(resumed))
    assert dataset.stats.samples == len(batch["keys"]) == 3
    assert batch_keys(batch) == planned(data, "mapper")[6]


def test_a_foreign_state_is_refused(data: Path) -> None:
    node = ShardNode(ShardDataset(data, batch_size=3, seed=5))
    with pytest.raises(StateError):
        node.reset({"root": {}})
    other = ShardNode(ShardDataset(data, batch_size=4, seed=5))
    next(other)
    with pytest.raises(StateError):
        node.reset(other.state_dict())


def test_torchdatas_iterable_wrapper_uses_the_datasets_own_state(data: Path) -> None:
    """torchdata's ``IterableWrapper`` saves and loads an iterable's ``state_dict``/``load_state_dict`` when
    it has them (the Stateful protocol), and a ShardDataset iterated in this process has an exact one: it
    resumes exactly too, without fast-forwarding (measured here, for docs/trainers/torchdata.md)."""
    from torchdata.nodes import IterableWrapper

    plan = planned(data, "mapper")

    def wrapped(dataset: ShardDataset) -> Loader:
        return Loader(ParallelMapper(IterableWrapper(dataset), map_fn=batch_keys, num_workers=2))

    seen, state = run(wrapped(ShardDataset(data, batch_size=3, seed=5, ordering=ORDERING)), EPOCHS, 13)
    assert seen == plan[:13] and state is not None
    dataset = ShardDataset(data, batch_size=3, seed=5, ordering=ORDERING)
    resumed = wrapped(dataset)
    resumed.load_state_dict(state)
    rest, _ = run(resumed, 2)
    assert rest == plan[13:]
    assert dataset.stats.samples == sum(len(keys) for keys in rest)
