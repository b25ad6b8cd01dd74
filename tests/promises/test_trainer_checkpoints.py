"""Issue 46, trainer checkpoints as hostile input: a checkpoint that lost (or never had) shardio's state is a
refusal on a mid-epoch resume, never a restart; a tampered entry is a typed error; nothing of shardio's is
unpickled (Accelerate's ``custom_checkpoint_N.pkl`` is neither written nor read by shardio).

Real trainers in this process: a tiny Lightning ``Trainer`` (0 workers), an ``Accelerator(cpu=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from sample_shards import make_uneven_dataset

from shardio import ShardDataset, StateError, World

STEPS = 9  # batches of 3 an epoch: 25 samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trainer_checkpoints") / "data"
    make_uneven_dataset(root, [9, 7, 5, 4], seed=2)
    return root


def make(data: Path) -> ShardDataset:
    return ShardDataset(str(data), batch_size=3, seed=0, world=World(0, 1))


# -- Lightning ---------------------------------------------------------------------------------------------


def _fit(
    data: Path, root: Path, *, callback: bool, max_steps: int, ckpt_path: str | None = None
) -> list[list[str]]:
    """A tiny in-process Lightning run (0 workers, a checkpoint every step); the keys of the batches trained."""
    pl = pytest.importorskip("pytorch_lightning")
    from torch.utils.data import DataLoader

    from shardio.integrations.lightning import ShardioCallback

    resume = ShardioCallback() if callback else None
    trained: list[list[str]] = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            trained.append(list(batch["keys"]))
            return self.layer(batch["audio"].mean(dim=(1, 2)).unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader:
            ds = make(data)
            return DataLoader(resume.attach(ds) if resume else ds, batch_size=None, num_workers=0)

    saver = pl.callbacks.ModelCheckpoint(
        dirpath=str(root), every_n_train_steps=1, save_top_k=-1, filename="{step}"
    )
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[saver, *([resume] if resume else [])],
    )
    trainer.fit(Model(), ckpt_path=ckpt_path)
    return trained


@pytest.fixture(scope="module")
def lightning_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    """Checkpoints of a run with ShardioCallback, one every step of 1.5 epochs; the keys it trained."""
    pytest.importorskip("pytorch_lightning")
    root = tmp_path_factory.mktemp("lightning_ckpt")
    return root, _fit(data, root, callback=True, max_steps=STEPS + 4)


def _tampered(source: Path, target: Path, entry: Any) -> Path:
    """``source`` with its ShardioCallback entry replaced by ``entry`` (removed where ``entry`` is ``...``)."""
    checkpoint = torch.load(source, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ShardioCallback")]
    if entry is ...:
        del checkpoint["callbacks"][key]
    else:
        checkpoint["callbacks"][key] = entry
    torch.save(checkpoint, target)
    return target


@pytest.mark.parametrize(
    "step,entry",
    [(3, ...), (3, None), (3, {}), (3, {"loader": None}), (STEPS + 2, ...), (STEPS, {"loader": None})],
    ids=["missing", "None", "empty", "loader-None", "epoch-1", "last-batch"],
)  # mid-epoch 0, mid-epoch 1, after epoch 0's last batch (its on_train_batch_end)
def test_lightning_refuses_a_mid_epoch_resume_without_shardios_state(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path, entry: Any, step: int
) -> None:
    """Before: the resumed run trained the epoch again from its first batch (from the checkpoint at the
    epoch's last batch, epoch 0 again as epoch 1), with Lightning's generic warning only."""
    root, _ = lightning_run
    checkpoint = _tampered(root / f"step={step}.ckpt", tmp_path / "tampered.ckpt", entry)
    with pytest.raises(StateError, match="holds no shardio loader state"):
        _fit(data, tmp_path / "again", callback=True, max_steps=STEPS + 4, ckpt_path=str(checkpoint))


def test_lightning_resumes_exactly_from_its_own_checkpoint(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path
) -> None:
    root, trained = lightning_run
    again = _fit(
        data, tmp_path / "a", callback=True, max_steps=STEPS + 4, ckpt_path=str(root / "step=3.ckpt")
    )
    assert again == trained[3:]


@pytest.mark.parametrize(
    "entry",
    [[{"loader": None}], "loader", {"loader": [1, 2]}, {"loader": "\x1b[31mred"}],
    ids=["list", "string", "loader-list", "loader-string"],
)
def test_a_tampered_lightning_callback_entry_is_a_typed_error(
    data: Path, lightning_run: tuple[Path, list[list[str]]], tmp_path: Path, entry: Any
) -> None:
    """Before: a list entry was an AttributeError (``list.get``); a string loader was kept as the state."""
    root, _ = lightning_run
    checkpoint = _tampered(root / "step=3.ckpt", tmp_path / "tampered.ckpt", entry)
    with pytest.raises(StateError) as caught:
        _fit(data, tmp_path / "again", callback=True, max_steps=STEPS + 4, ckpt_path=str(checkpoint))
    assert "\x1b" not in str(caught.value)
