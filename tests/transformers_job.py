"""A tiny HF Transformers Trainer job over a ShardDataset, run as a script by
``tests/integrations/test_transformers.py``.

``python transformers_job.py CONFIG.json`` (one process) or under ``torchrun --nproc_per_node N`` (gloo on
CPU). Every rank appends each batch it trains on to ``{out}/rank{rank}.jsonl`` (global step, keys, samples its
dataset had read when the batch arrived); checkpoints every ``save_steps`` steps in ``{out}/ckpt``; at global
step ``kill_at_step`` every rank kills itself with SIGKILL. ``trainer`` is ``shardio`` (ShardioTrainer),
``seq2seq`` (ShardioSeq2SeqTrainer) or ``plain`` (the Trainer without shardio's integration, over an unbatched
ShardDataset that it batches with a padding collator). With ``step_batches`` (``Batching(step_batches=K)``)
each of the N processes accumulates ``K / N`` batches per optimizer step (``gradient_accumulation_steps``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from job_runs import dump_stacks_on_signal
from transformers import Seq2SeqTrainingArguments, Trainer, TrainingArguments

from shardio import Batching, Ordering, ShardDataset
from shardio.integrations.transformers import ShardioSeq2SeqTrainer, ShardioTrainer


class TinyModel(torch.nn.Module):
    """One weight; logs every batch it trains on (the forward pass is the training step)."""

    def __init__(self, out: Path, kill_at: int | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out, self.kill_at = out, kill_at
        self.trainer: Any = None
        self.dataset: Any = None
        self.log: Any = None

    def forward(
        self, input_values: torch.Tensor, keys: list[str] | None = None, epoch: int | None = None
    ) -> dict[str, torch.Tensor]:
        step = self.trainer.state.global_step
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.log is None:
            self.log = open(self.out / f"rank{self.trainer.args.process_index}.jsonl", "a")  # noqa: SIM115
        read = self.dataset.stats.samples if self.trainer.args.dataloader_num_workers == 0 else None
        self.log.write(
            json.dumps(
                {
                    "step": step,
                    "epoch": epoch,
                    "trainer_epoch": self.trainer.state.epoch,
                    "keys": list(keys or []),
                    "read": read,
                }
            )
            + "\n"
        )
        self.log.flush()
        return {"loss": self.layer(input_values.mean(dim=1, keepdim=True)).pow(2).mean()}


def shardio_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A shardio batch -> the model's keyword arguments."""
    return {"input_values": batch["audio"][:, 0], "keys": list(batch["keys"]), "epoch": batch["epoch"]}


def padded_inputs(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples of an unbatched ShardDataset -> the model's keyword arguments (the plain Trainer batches)."""
    longest = max(sample["audio"].shape[-1] for sample in samples)
    audio = torch.zeros(len(samples), longest)
    for row, sample in enumerate(samples):
        audio[row, : sample["audio"].shape[-1]] = sample["audio"][0]
    return {"input_values": audio, "keys": [sample["key"] for sample in samples]}


def main(config: dict[str, Any]) -> None:
    out = Path(config["out"])
    kind = config.get("trainer", "shardio")
    sizes = (
        {"max_duration": config["max_duration"]}
        if config.get("max_duration")
        else {"batch_size": None if kind == "plain" else config["batch_size"]}
    )
    accumulation = config.get("accumulation", 1)
    if config.get("step_batches"):
        sizes = {"batching": Batching(**sizes, step_batches=config["step_batches"])}
        accumulation = config["step_batches"] // int(os.environ.get("WORLD_SIZE", "1"))
    dataset = ShardDataset(config["data"], seed=5, ordering=Ordering(shuffle_shards=2), **sizes)
    torch.manual_seed(0)
    model = TinyModel(out, config.get("kill_at_step"))
    model.dataset = dataset
    workers = config.get("workers", 0)
    arguments = Seq2SeqTrainingArguments if kind == "seq2seq" else TrainingArguments
    args = arguments(
        output_dir=str(out / "ckpt"),
        use_cpu=True,
        report_to=[],
        save_strategy="steps",
        save_steps=config.get("save_steps", 3),
        num_train_epochs=config.get("epochs", 2),
        max_steps=config.get("max_steps", -1),
        per_device_train_batch_size=config["batch_size"],
        gradient_accumulation_steps=accumulation,
        learning_rate=0.01,
        logging_steps=1000,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=bool(workers and config.get("persistent")),
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
        ddp_backend="gloo" if "RANK" in os.environ else None,
        restore_callback_states_from_checkpoint=config.get("restore_callbacks", False),
    )
    classes = {"shardio": ShardioTrainer, "seq2seq": ShardioSeq2SeqTrainer, "plain": Trainer}
    collate = padded_inputs if kind == "plain" else shardio_inputs
    trainer = classes[kind](model=model, args=args, train_dataset=dataset, data_collator=collate)
    model.trainer = trainer
    trainer.train(resume_from_checkpoint=config.get("resume_from"))


if __name__ == "__main__":
    dump_stacks_on_signal()
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
