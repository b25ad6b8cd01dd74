"""The trainer integrations' small contracts: import-light, a missing extra named, checks that refuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sample_shards import make_uneven_dataset
from torch.utils.data import DataLoader

from shardio import OptionError, ShardDataset, StateError, World

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_importing_shardio_imports_no_trainer() -> None:
    trainers = ("lightning", "pytorch_lightning", "accelerate", "transformers", "torchdata.nodes")
    done = _python(
        f"import sys, shardio, shardio.integrations\nprint([m for m in {trainers} if m in sys.modules])"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_missing_extra_is_named() -> None:
    hidden = (
        "lightning",
        "lightning.pytorch",
        "pytorch_lightning",
        "accelerate",
        "transformers",
        "torchdata.nodes",
    )
    code = "\n".join(
        [
            "import sys",
            *(f"sys.modules[{name!r}] = None" for name in hidden),  # None: importing it raises ImportError
            "for module in ('lightning', 'accelerate', 'transformers', 'torchdata'):",
            "    try:",
            "        __import__(f'shardio.integrations.{module}')",
            "    except ImportError as exc:",
            "        print(exc)",
        ]
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "pip install 'shardio[lightning]'" in done.stdout
    assert "pip install 'shardio[accelerate]'" in done.stdout
    assert "pip install 'shardio[transformers]'" in done.stdout
    assert "pip install 'shardio[torchdata]'" in done.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("integrations") / "data"
    make_uneven_dataset(root, (5, 6, 3), seed=3)
    return root


def test_accelerate_progress_resumes_a_plain_loop_exactly(data: Path) -> None:
    """The loop Accelerate runs, without the launcher: stop after 3 batches, save, resume afresh."""
    pytest.importorskip("accelerate")
    from shardio.integrations.accelerate import LoaderProgress

    def loader(dataset: ShardDataset) -> DataLoader:
        return DataLoader(dataset, batch_size=None, num_workers=2)

    straight = [list(b["keys"]) for b in loader(ShardDataset(data, batch_size=2, seed=1))]
    dataset = ShardDataset(data, batch_size=2, seed=1)
    progress = LoaderProgress(dataset)
    assert progress.state_dict() == dataset.state_dict()
    trained = []
    for batch in loader(dataset):  # two workers: the main process sees batches only as they arrive
        trained.append(list(batch["keys"]))
        progress.update(batch)
        if len(trained) == 3:
            break
    saved = progress.state_dict()
    resumed = LoaderProgress(ShardDataset(data, batch_size=2, seed=1))
    resumed.load_state_dict(saved)
    assert resumed.epoch == 0
    assert trained + [list(b["keys"]) for b in loader(resumed.dataset)] == straight


def test_accelerate_skip_first_batches_after_a_resume_is_refused(data: Path) -> None:
    """Accelerate's resume idiom skips the batches trained before the checkpoint; ``load_state`` has already
    put the dataset after them, so skipping would lose as many again. The first update says so."""
    accelerate = pytest.importorskip("accelerate")
    from shardio.integrations.accelerate import LoaderProgress

    dataset = ShardDataset(data, batch_size=2, seed=1)
    progress = LoaderProgress(dataset)
    for n, batch in enumerate(DataLoader(dataset, batch_size=None)):
        progress.update(batch)
        if n == 2:
            break
    resumed = LoaderProgress(ShardDataset(data, batch_size=2, seed=1))
    resumed.load_state_dict(progress.state_dict())
    skipping = accelerate.Accelerator(cpu=True).skip_first_batches(
        DataLoader(resumed.dataset, batch_size=None, num_workers=2), 3
    )
    batch = next(iter(skipping))
    assert batch["batch_index"] == 6
    with pytest.raises(StateError, match="after batch 2: batches 3 to 5 were skipped .skip_first_batches"):
        resumed.update(batch)


def test_accelerate_track_refuses_a_dataset_planned_for_other_ranks(data: Path) -> None:
    accelerate = pytest.importorskip("accelerate")
    from shardio.integrations.accelerate import track

    accelerator = accelerate.Accelerator(cpu=True)  # one process: rank 0 of 1
    with pytest.raises(OptionError, match="rank 1 of 2"):
        track(accelerator, ShardDataset(data, batch_size=2, world=World(1, 2)))
    progress = track(accelerator, ShardDataset(data, batch_size=2))
    assert progress.dataset.ranks().world_size == 1
    # nothing registered for Accelerate to pickle: a save and a load pre-hook (JSON) instead
    assert accelerator._custom_objects == []
    assert len(accelerator._save_model_state_pre_hook) == len(accelerator._load_model_state_pre_hook) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_accelerate_resharding_wrapper_is_refused(data: Path, workers: int) -> None:
    """``prepare_data_loader`` with ``dispatch_batches=False`` (what ``accelerator.prepare(loader)`` calls,
    here for rank 0 of 2) wraps the dataset in Accelerate's own ``IterableDatasetShard``: each rank would keep
    a slice of its share, padded with repeats. Iterating it fails, naming the wrapper and the fix, with and
    without workers; the dataset alone iterates, and so does another dataset iterated while that loader is
    active."""
    accelerate_loading = pytest.importorskip("accelerate.data_loader")
    from shardio import collate

    dataset = ShardDataset(data, seed=1, world=World(0, 2))
    loader = DataLoader(dataset, batch_size=3, collate_fn=collate, num_workers=workers)
    prepared = accelerate_loading.prepare_data_loader(
        loader, num_processes=2, process_index=0, dispatch_batches=False
    )
    assert type(prepared.dataset).__name__ == "IterableDatasetShard"
    batches = DataLoader(dataset, batch_size=3, collate_fn=collate, num_workers=workers)
    assert sum(len(batch["keys"]) for batch in batches) == 7  # rank 0's half of the 14 samples
    with pytest.raises(OptionError, match="IterableDatasetShard iterates this ShardDataset.*not the loader"):
        list(prepared)
    inner = ShardDataset(data, seed=2, world=World(1, 2))
    outer = accelerate_loading.prepare_data_loader(
        DataLoader(list(range(8)), batch_size=2), num_processes=2, process_index=0
    )
    for _ in outer:  # a prepared loader of another dataset is active: the dataset iterates
        assert sum(1 for _ in inner) == 7


def test_lightning_callback_refuses_to_restart_an_epoch_silently(data: Path) -> None:
    pytest.importorskip("pytorch_lightning")
    from shardio.integrations.lightning import ShardioCallback

    callback = ShardioCallback()
    dataset = ShardDataset(data, batch_size=2)
    batch = next(iter(dataset))
    callback.load_state_dict({"loader": dataset.state_after(batch)})
    with pytest.raises(StateError, match="attach"):
        callback.on_train_start(None, None)  # the dataset was never attached: its epoch would restart
    with pytest.raises(TypeError):
        callback.attach([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ShardioCallback takes a ShardDataset"):
        ShardioCallback("data/")  # type: ignore[arg-type]
    fresh = callback.attach(ShardDataset(data, batch_size=2))
    callback.on_train_start(None, None)
    assert [list(b["keys"]) for b in fresh][0] != list(batch["keys"])


def test_the_accelerate_tracker_takes_a_dataset() -> None:
    pytest.importorskip("accelerate")
    from shardio.integrations.accelerate import LoaderProgress

    with pytest.raises(TypeError, match="LoaderProgress takes a ShardDataset, not str"):
        LoaderProgress("data/")  # type: ignore[arg-type]


class _Tiny:
    """A Trainer's tiny model, made when transformers is importable."""

    @staticmethod
    def trainer(out: Path, dataset: object, **kwargs: object) -> object:
        import torch
        from transformers import TrainingArguments

        from shardio.integrations.transformers import ShardioTrainer

        args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to=[], disable_tqdm=True)
        return ShardioTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=dataset, **kwargs)


def test_the_transformers_trainer_takes_a_shard_dataset(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(OptionError, match="ShardDataset"):
        _Tiny.trainer(tmp_path, [1, 2, 3])


def test_the_transformers_trainer_refuses_a_dataset_planned_for_other_ranks(
    data: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    trainer = _Tiny.trainer(tmp_path, ShardDataset(data, batch_size=2, world=World(1, 2)))
    with pytest.raises(OptionError, match="rank 1 of 2"):
        trainer.get_train_dataloader()  # type: ignore[attr-defined]


def test_the_transformers_trainer_refuses_a_checkpoint_without_a_loader_state(
    data: Path, tmp_path: Path
) -> None:
    """A plain Trainer's checkpoint says nothing of the loader: resuming would restart (or skip) batches."""
    pytest.importorskip("transformers")
    from transformers import TrainerState

    checkpoint = tmp_path / "checkpoint-6"
    checkpoint.mkdir()
    TrainerState(global_step=6).save_to_json(str(checkpoint / "trainer_state.json"))
    trainer = _Tiny.trainer(tmp_path, ShardDataset(data, batch_size=2))
    with pytest.raises(StateError, match="no shardio loader state"):
        trainer.train(resume_from_checkpoint=str(checkpoint))  # type: ignore[attr-defined]
