"""The yield log: off unless ``SHARDIO_YIELD_LOG`` is set; with it, what reaches the training loop, recorded
where it does (a ShardLoader's training process, not its workers; a DataLoader's workers, put back in plan
order on reading), with a marker for each state loaded, before or after the first ``iter()``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import ShardDataset, ShardLoader
from shardio.cli.resumecompare import compare_runs
from shardio.runtime.yieldlog import ENV, KEYS_ENV, BatchRecord, LoadRecord, keys_digest, read_log, recorder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("yieldlog") / "data"
    make_uneven_dataset(root, [9, 7, 5], seed=2)
    return root


def _batches(directory: Path) -> list[BatchRecord]:
    return [r for r in read_log(str(directory)) if isinstance(r, BatchRecord)]


def test_unset_it_records_nothing(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert recorder() is None
    assert sum(1 for _ in ShardLoader(ShardDataset(data, batch_size=4), num_workers=0)) > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shardloader_is_recorded_in_the_training_process(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "log"))
    monkeypatch.setenv(KEYS_ENV, "1")
    loader = ShardLoader(ShardDataset(data, batch_size=4, seed=1), num_workers=workers)
    loader.set_epoch(0)
    keys = [batch["keys"] for batch in loader]
    files = list((tmp_path / "log").iterdir())
    assert len(files) == 1 and files[0].name.endswith(f"-{os.getpid()}.jsonl")  # the workers wrote nothing
    records = _batches(tmp_path / "log")
    assert [r.digest for r in records] == [keys_digest(k) for k in keys]
    assert [r.keys for r in records] == [tuple(k) for k in keys]
    assert [(r.epoch, r.step, r.rank, r.world, r.worker) for r in records] == [
        (0, j, 0, 1, None) for j in range(len(keys))
    ]


def test_dataloader_workers_record_and_are_read_back_in_plan_order(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "log"))
    ds = ShardDataset(data, batch_size=3, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    trained = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        trained += [(epoch, keys_digest(batch["keys"])) for batch in loader]
    assert len(list((tmp_path / "log").iterdir())) >= 2  # one file per worker process
    records = _batches(tmp_path / "log")
    assert {r.worker for r in records} == {0, 1}
    straight = read_log(str(tmp_path / "log"))
    assert compare_runs(straight, [straight]).exact
    from shardio.cli.resumecompare import trained_batches

    (src,) = {r.src for r in records}
    in_order = trained_batches([straight], src)[0][0]
    assert [(t.batch.epoch, t.batch.digest) for t in in_order] == trained


def test_a_load_is_recorded_before_or_after_the_first_iter(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "log"))
    first = ShardLoader(ShardDataset(data, batch_size=4, seed=1), num_workers=0)
    first.set_epoch(0)
    batches = iter(first)
    next(batches)
    next(batches)
    state = first.state_dict()
    again = ShardLoader(ShardDataset(data, batch_size=4, seed=1), num_workers=0)
    again.load_state_dict(state)
    again.set_epoch(0)
    batches = iter(again)
    next(batches)
    again.load_state_dict(state)  # a second load, once the iteration has begun
    loads = [r for r in read_log(str(tmp_path / "log")) if isinstance(r, LoadRecord)]
    seen = [(r.epoch, r.position, r.after_iter, r.from_world) for r in loads]
    assert seen == [(0, 2, False, 1), (0, 2, True, 1)]


def test_a_forked_process_writes_a_file_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "log"))
    batch = {"epoch": 0, "batch_index": 0, "keys": ["a"]}
    fields = dict(src="s", rank=0, world=1, worker=None, it="1")
    log = recorder()
    assert log is not None
    log.batch(batch, **fields)
    child = os.fork()
    if child == 0:
        try:
            log = recorder()
            assert log is not None
            log.batch(batch, **fields)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    assert len(list((tmp_path / "log").iterdir())) == 2
    assert len(_batches(tmp_path / "log")) == 2


def test_an_unwritable_log_warns_once_and_training_goes_on(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv(ENV, str(tmp_path / "file" / "log"))
    assert sum(1 for _ in ShardLoader(ShardDataset(data, batch_size=4), num_workers=0)) > 0
    assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 1
