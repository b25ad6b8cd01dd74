"""A tiny SpeechBrain recipe over a ShardDataset, run by ``tests/integrations/test_speechbrain.py``
(alone, or under torchrun).

``speechbrain_job.py CONFIG.json``: a ``Brain`` over one linear layer trains ``epochs`` epochs with
``Brain.fit``, an intra-epoch checkpoint every ``ckpt_steps`` steps (SpeechBrain's ``ckpt_interval_steps``)
and one at each epoch end, in ``{ckpt_dir}``; a new process recovers from the latest. Every rank appends each
batch it trains on to ``{out}/rank{rank}.jsonl`` (``corpus/key`` for a ``mix``); at the ``kill_at_step``-th
batch this process would train (counted from 0 over the whole job) every rank kills itself with SIGKILL.
``track: false`` runs SpeechBrain alone. With ``step_batches`` (``Batching(step_batches=K)``) each of the N
processes accumulates ``K / N`` batches per optimizer step (``grad_accumulation_factor``; without it,
``accumulation``); each logged batch says whether it ended one (``sync``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import speechbrain as sb
import torch
from job_runs import dump_stacks_on_signal
from speechbrain.utils.checkpoints import Checkpointer
from speechbrain.utils.epoch_loop import EpochCounter
from torch.utils.data import DataLoader

from shardio import Batching, EpochSize, MixedDataset, Ordering, ShardDataset, ShardLoader
from shardio.integrations.speechbrain import LoaderProgress, track


class TinyBrain(sb.Brain):
    progress: LoaderProgress | None = None
    kill_at: int | None = None
    trained = 0  # batches this process trained on
    log: Any = None

    def compute_forward(self, batch: dict[str, Any], stage: Any) -> torch.Tensor:
        features = batch["audio"].mean(dim=(1, 2)).unsqueeze(1).to(self.device)
        return self.modules.layer(features)

    def compute_objectives(
        self, predictions: torch.Tensor, batch: dict[str, Any], stage: Any
    ) -> torch.Tensor:
        return predictions.pow(2).mean()

    def on_fit_batch_start(self, batch: dict[str, Any], should_step: bool) -> None:
        if self.trained == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_fit_batch_end(
        self, batch: dict[str, Any], outputs: Any, loss: torch.Tensor, should_step: bool
    ) -> None:  # should_step: this batch ends an optimizer step
        if self.progress is not None:
            self.progress.update(batch)
        keys = (
            [f"{corpus}/{key}" for corpus, key in zip(batch["corpus"], batch["keys"])]
            if "corpus" in batch
            else list(batch["keys"])
        )
        self.log.write(json.dumps({"step": self.trained, "keys": keys, "sync": should_step}) + "\n")
        self.log.flush()
        self.trained += 1

    def on_stage_end(self, stage: Any, stage_loss: float, epoch: int | None = None) -> None:
        if stage == sb.Stage.TRAIN:
            self.checkpointer.save_and_keep_only(meta={"epoch": epoch}, end_of_epoch=True, num_to_keep=2)

    def make_dataloader(
        self, dataset: Any, stage: Any, ckpt_prefix: str | None = "dataloader-", **loader_kwargs: Any
    ) -> Any:
        # Brain.fit uses a torch DataLoader as it is and wraps anything else in one: a
        # ShardLoader goes as it is
        if isinstance(dataset, ShardLoader):
            return dataset
        return super().make_dataloader(dataset, stage, ckpt_prefix, **loader_kwargs)


def main(config: dict[str, Any]) -> None:
    run_opts = {
        "device": "cpu",
        "distributed_backend": "gloo",
        "ckpt_interval_steps": config["ckpt_steps"],
        "noprogressbar": True,
    }
    if config.get("accumulation"):  # without step_batches
        run_opts["grad_accumulation_factor"] = config["accumulation"]
    sizes: dict[str, Any] = {"batch_size": config["batch_size"]}
    if config.get("step_batches"):
        sizes = {"batching": Batching(**sizes, step_batches=config["step_batches"])}
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        run_opts["grad_accumulation_factor"] = config["step_batches"] // processes
    sb.utils.distributed.ddp_init_group(run_opts)  # under torchrun (RANK, LOCAL_RANK set): a gloo group
    torch.manual_seed(0)
    counter = EpochCounter(limit=config["epochs"])
    modules = {"layer": torch.nn.Linear(1, 1)}
    checkpointer = Checkpointer(
        config["ckpt_dir"], recoverables={"layer": modules["layer"], "counter": counter}
    )
    brain = TinyBrain(
        modules=modules,
        opt_class=lambda params: torch.optim.SGD(params, lr=0.01),
        run_opts=run_opts,
        checkpointer=checkpointer,
    )
    dataset: ShardDataset
    if config.get("mix"):  # a MixedDataset of data and mix (another dataset), epochs sized by data
        dataset = MixedDataset(
            {"a": config["data"], "b": config["mix"]},
            {"a": 0.6, "b": 0.4},
            EpochSize(primary="a"),
            **sizes,
            seed=5,
            ordering=Ordering(shuffle_shards=2),
        )
    else:
        dataset = ShardDataset(config["data"], seed=5, ordering=Ordering(shuffle_shards=2), **sizes)
    if config.get("track", True):
        brain.progress = track(brain, dataset)
    brain.kill_at = config.get("kill_at_step")
    rank = int(os.environ.get("RANK", "0"))
    brain.log = open(Path(config["out"]) / f"rank{rank}.jsonl", "a")  # noqa: SIM115 - for the job's life
    workers = config["workers"]
    train_set: Any
    if config.get("loader") == "shardio":
        train_set = ShardLoader(
            dataset, num_workers=workers, persistent_workers=config.get("persistent", True)
        )
    else:
        options: dict[str, Any] = {"batch_size": None, "num_workers": workers}
        if workers:
            options["persistent_workers"] = config.get("persistent", False)
        train_set = DataLoader(dataset, **options)
    brain.fit(counter, train_set)


if __name__ == "__main__":
    dump_stacks_on_signal()
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
