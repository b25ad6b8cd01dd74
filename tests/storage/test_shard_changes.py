"""A local shard rewritten or replaced while a run reads it (issue 41): a ``ShardChanged`` naming the shard,
as over S3 and HTTP, in the process that reads and through DataLoader workers (fork and spawn), for a rewrite
in place and a replacement by rename; never the other version's audio read silently."""

from __future__ import annotations

import os
import shutil
import time
import traceback
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import FormatError, Index, ShardChanged, ShardDataset
from shardio.reading.reader import Reader
from shardio.storage.localshard import CHECK_EVERY_NS

SIZES = [60, 60]


@pytest.fixture()
def versions(tmp_path: Path) -> tuple[Path, Path]:
    """Two datasets of the same layout and byte sizes (same keys and durations, other noise): the second's
    shards are same-size replacements for the first's."""
    old = make_uneven_dataset(tmp_path / "old", SIZES, duration_range=(0.25, 0.25))
    new = make_uneven_dataset(tmp_path / "new", SIZES, seed=1, duration_range=(0.25, 0.25))
    assert [s.bytes for s in old.shards] == [s.bytes for s in new.shards]
    assert [s.sha256 for s in old.shards] != [s.sha256 for s in new.shards]
    return tmp_path / "old", tmp_path / "new"


def _rewrite_in_place(target: Path, source: Path) -> None:
    with target.open("r+b") as handle:  # the same inode, the same size: only the bytes differ
        handle.write(source.read_bytes())


def _replace_by_rename(target: Path, source: Path) -> None:
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_bytes(source.read_bytes())
    os.replace(temporary, target)


def test_a_shard_rewritten_in_place_after_it_was_opened_is_refused(versions: tuple[Path, Path]) -> None:
    old, new = versions
    index = Index.load(old)
    name = index.shards[0].name
    reader = Reader(index)
    reader.members(0)  # the shard is open (and mapped) before it changes
    stat = (old / name).stat()
    _rewrite_in_place(old / name, new / name)
    os.utime(old / name, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old mtime put back: ctime still moves
    time.sleep(
        CHECK_EVERY_NS / 1e9
    )  # a change is seen at the first check after it: a millisecond of reads later
    with pytest.raises(ShardChanged, match="the local shard file changed") as caught:
        reader.members(1)  # read silently before: the new version's audio under the old index
    assert name in str(caught.value) and "s000_00001" in str(caught.value)
    with pytest.raises(ShardChanged, match=name):
        reader.members(2)
    assert set(reader.members(SIZES[0])) == {"wav", "json"}  # the other shard is as it was


def test_a_shard_replaced_before_it_was_opened_is_refused(versions: tuple[Path, Path]) -> None:
    old, new = versions
    index = Index.load(old)
    name = index.shards[1].name
    time.sleep(
        0.05
    )  # file times tick every few milliseconds: a change within a tick of the load can go unseen
    _replace_by_rename(old / name, new / name)
    reader = Reader(index)
    reader.members(0)
    changed = r"the local shard file changed \(its status changed at .* after its index was loaded"
    with pytest.raises(ShardChanged, match=f"{name}.*{changed}"):
        reader.members(SIZES[0])
    assert Reader(Index.load(old)).members(SIZES[0])  # an index loaded after the change reads it


def _drain(loader: DataLoader, change: object) -> int:
    """Read batches until the loader fails, calling ``change()`` after the first; how many came."""
    batches = iter(loader)
    next(batches)
    change()  # type: ignore[operator]
    count = 1
    for _ in batches:
        count += 1
    return count


def test_two_fork_workers_refuse_a_shard_rewritten_in_place_mid_epoch(versions: tuple[Path, Path]) -> None:
    old, new = versions
    dataset = ShardDataset(old, batch_size=2, shuffle=False)
    names = [s.name for s in dataset.index.shards]
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, prefetch_factor=1, multiprocessing_context="fork"
    )
    # before: read on silently, 175 of 200 samples the new version's audio
    with pytest.raises(ShardChanged, match="the local shard file changed") as caught:
        _drain(loader, lambda: [_rewrite_in_place(old / n, new / n) for n in names])
    assert any(n in str(caught.value) for n in names)
    traceback.clear_frames(caught.tb)  # ends the iterator's workers now (the garbage collector: 5 s for each)


def test_two_spawn_workers_refuse_a_shard_replaced_by_rename(versions: tuple[Path, Path]) -> None:
    old, new = versions
    dataset = ShardDataset(old, batch_size=2, shuffle=False)
    names = [s.name for s in dataset.index.shards]
    time.sleep(0.05)
    for (
        name
    ) in names:  # after the dataset was made, before a worker opens the shards: "the first open" is the
        _replace_by_rename(old / name, new / name)  # index's load, which the workers share
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(ShardChanged, match="the local shard file changed") as caught:
        next(iter(loader))
    assert any(n in str(caught.value) for n in names)
    traceback.clear_frames(caught.tb)  # ends the iterator's workers now (the garbage collector: 5 s for each)


def test_skip_leaves_out_the_samples_of_a_changed_shard_only(versions: tuple[Path, Path]) -> None:
    old, new = versions
    dataset = ShardDataset(old, batch_size=4, shuffle=False, on_error="skip")
    name = dataset.index.shards[0].name
    time.sleep(0.05)
    _rewrite_in_place(old / name, new / name)
    batches = list(DataLoader(dataset, batch_size=None, num_workers=0))
    skipped = [text for batch in batches for text in batch["skipped"]]
    assert len(skipped) == SIZES[0] and all("the local shard file changed" in text for text in skipped)
    assert sum(len(batch["keys"]) for batch in batches) == SIZES[1]


def test_spawn_workers_report_an_index_replaced_between_epochs(tmp_path: Path) -> None:
    """A spawned worker unpickles the dataset, mapping the index's columns file again: one replaced since
    fails its checks there, which killed the worker before it could report ("DataLoader worker exited
    unexpectedly"); the FormatError now reaches the training process with its message."""
    make_uneven_dataset(tmp_path / "a", [6, 6])
    make_uneven_dataset(tmp_path / "b", [5, 9], seed=2)
    loader = DataLoader(
        ShardDataset(tmp_path / "a", batch_size=2),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    assert sum(len(batch["keys"]) for batch in loader) == 12
    for name in ("index.json", "index.columns"):
        shutil.copy(tmp_path / "b" / name, tmp_path / "a" / name)
    belong = "index.columns: .* the index files do not belong together"
    with pytest.raises(FormatError, match=belong) as caught:
        next(iter(loader))
    traceback.clear_frames(caught.tb)  # ends the iterator's workers now (the garbage collector: 5 s for each)
