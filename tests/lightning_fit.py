"""A tiny in-process Lightning run over a ShardDataset (0 workers, a checkpoint every step), for the tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardio import ShardDataset


def lightning_trainer(
    dataset: Callable[[], ShardDataset], root: Path, *, callback: bool, max_steps: int
) -> tuple[Any, type[Any], list[list[str]]]:
    """A ``Trainer`` saving a checkpoint every step under ``root`` (with ``ShardioCallback`` where
    ``callback``), a model class that trains on ``dataset()``, and the list the model appends each trained
    batch's keys to; the caller runs ``trainer.fit(model(), ckpt_path=...)``."""
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
            ds = dataset()
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
    return trainer, Model, trained
