"""A tiny Lightning training job over a ShardDataset, run as a script by ``integrations/test_lightning.py``.

``python lightning_job.py CONFIG.json``: Lightning's DDP launcher starts the other ranks by running the same
command again. Every rank appends each batch it trains on to ``{out}/rank{rank}.jsonl`` (epoch, global step,
keys, repeat flags); at global step ``kill_at_step`` every rank kills itself with SIGKILL. With
``step_batches`` the dataset plans optimizer steps of that many batches and the Trainer accumulates
``accumulate`` of them. ``strategy`` (default ``ddp``) may be ``ddp_spawn`` or ``ddp_fork``; with
``prebuilt`` the module builds its dataset in the launcher.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

from job_runs import dump_stacks_on_signal

from shardio import Batching, Ordering, ShardDataset, ShardLoader
from shardio.integrations.lightning import ShardioCallback


class NaiveCallback(pl.Callback):
    """What one writes first: the state after each batch, loaded back in a training hook, once Lightning's
    ``iter()`` has started the epoch (too late: it applies to the next iteration only)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.state = trainer.train_dataloader.dataset.state_after(batch)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.seen = getattr(self, "seen", 0) + 1
        if (
            self.state is not None
            and self.seen >= max(1, trainer.train_dataloader.num_workers)
            and not getattr(self, "loaded", False)
        ):
            # every worker has delivered a batch, so every one has begun the epoch (after the first batch
            # alone, a worker still starting up on a loaded machine would begin it with the state loaded here)
            self.loaded = True
            trainer.train_dataloader.dataset.load_state_dict(self.state)

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self.state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state = state_dict["loader"]


class Model(pl.LightningModule):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.layer = torch.nn.Linear(1, 1)
        self.log_file: Any = None
        self.resume = ShardioCallback() if config["callback"] == "shardio" else None

        # built here, in the launcher, and handed to the ranks (ddp_spawn pickles the module for each)
        self.prebuilt = self.dataset() if config.get("prebuilt") else None

    def dataset(self) -> ShardDataset:
        config = self.config
        sizes = (
            {"max_duration": config["max_duration"]}
            if config.get("max_duration")
            else {"batch_size": config["batch_size"]}
        )
        if config.get(
            "step_batches"
        ):  # optimizer steps of that many batches, accumulate_grad_batches each rank
            batching = Batching(**sizes, step_batches=config["step_batches"])
            return ShardDataset(
                config["data"], seed=5, ordering=Ordering(shuffle_shards=2), batching=batching
            )
        return ShardDataset(config["data"], seed=5, ordering=Ordering(shuffle_shards=2), **sizes)

    def train_dataloader(self) -> Any:
        config = self.config
        dataset = self.prebuilt if self.prebuilt is not None else self.dataset()
        if self.resume is not None:
            self.resume.attach(dataset)
        workers = config["workers"]
        options: dict[str, Any] = {"batch_size": None, "num_workers": workers}
        if workers:
            options["persistent_workers"] = config["persistent"]
        if config["loader"] == "shardio":
            return ShardLoader(dataset, num_workers=workers, persistent_workers=config["persistent"])
        if config["loader"] == "stateful":
            from torchdata.stateful_dataloader import StatefulDataLoader

            return StatefulDataLoader(dataset, **options)
        return DataLoader(dataset, **options)

    def on_train_start(self) -> None:
        estimate = {"estimated_stepping_batches": self.trainer.estimated_stepping_batches}
        (Path(self.config["out"]) / f"estimate{self.global_rank}.json").write_text(json.dumps(estimate))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == self.config.get("kill_at_step"):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.log_file is None:
            self.log_file = open(Path(self.config["out"]) / f"rank{self.global_rank}.jsonl", "a")
        record = {"epoch": self.current_epoch, "step": self.trainer.global_step, "keys": list(batch["keys"])}
        self.log_file.write(json.dumps(record) + "\n")
        self.log_file.flush()
        features = batch["audio"].mean(dim=(1, 2)).unsqueeze(1)
        return self.layer(features).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ValidatedModel(Model):
    """Validates every ``val_every`` training batches (and checkpoints at each validation end)."""

    def val_dataloader(self) -> Any:
        return DataLoader(ShardDataset(self.config["data"], batch_size=5, shuffle=False), batch_size=None)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", batch["audio"].mean().abs(), sync_dist=True, batch_size=len(batch["keys"]))


def main(config: dict[str, Any]) -> None:
    model = ValidatedModel(config) if config.get("val_every") else Model(config)
    if config.get("val_every"):  # a checkpoint at each validation end
        middle = pl.callbacks.ModelCheckpoint(
            dirpath=config["ckpt_dir"],
            save_top_k=-1,
            monitor="val_loss",
            filename="val-{epoch}-{step}",
            save_on_train_epoch_end=False,
        )
    else:
        middle = pl.callbacks.ModelCheckpoint(
            dirpath=config["ckpt_dir"],
            save_top_k=-1,
            every_n_train_steps=config["every_n_steps"],
            filename="mid-{epoch}-{step}",
        )
    callbacks: list[Any] = [
        middle,
        pl.callbacks.ModelCheckpoint(
            dirpath=config["ckpt_dir"],
            every_n_epochs=1,
            save_top_k=-1,
            filename="end-{epoch}-{step}",
            save_on_train_epoch_end=True,
        ),
    ]
    if model.resume is not None:
        callbacks.insert(0, model.resume)
    elif config["callback"] == "naive":
        callbacks.insert(0, NaiveCallback())
    devices = config["devices"]
    strategy = config.get("strategy", "ddp" if devices > 1 else "auto")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=config["max_epochs"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        reload_dataloaders_every_n_epochs=config.get("reload", 0),
        val_check_interval=config.get("val_every"),
        limit_train_batches=config.get("limit_train_batches", 1.0),
        accumulate_grad_batches=config.get("accumulate", 1),
    )
    trainer.fit(model, ckpt_path=config.get("ckpt_path"))


if __name__ == "__main__":
    dump_stacks_on_signal()
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
