"""A tiny HF Accelerate training loop over a ShardDataset, run by ``accelerate launch`` (test_accelerate.py).

``accelerate_job.py CONFIG.json``: every rank appends each batch it trains on to ``{out}/rank{rank}.jsonl``;
``accelerator.save_state`` writes ``{ckpt}/step-{N}`` every ``every_n_steps`` steps and at each epoch end;
at global step ``kill_at_step`` every rank kills itself with SIGKILL. ``prepare``, ``dispatch_batches`` and
``collate`` (an unbatched dataset batched by ``shardio.collate``) set up the configurations that must fail.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import IO, Any

import torch
from accelerate import Accelerator
from job_runs import dump_stacks_on_signal
from torch.utils.data import DataLoader

from shardio import Batching, Ordering, ShardDataset, ShardLoader, collate
from shardio.integrations.accelerate import track


def accelerator_options(config: dict[str, Any]) -> dict[str, Any]:
    if "dispatch_batches" not in config:
        return {}
    from accelerate.utils import DataLoaderConfiguration

    return {"dataloader_config": DataLoaderConfiguration(dispatch_batches=config["dispatch_batches"])}


def prepared_model(accelerator: Accelerator) -> tuple[Any, Any]:
    """The model and its optimizer, seeded alike on every rank and prepared."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return accelerator.prepare(model, optimizer)


def resume(accelerator: Accelerator, config: dict[str, Any]) -> tuple[int, Path, IO[str]]:
    """The step to go on from (0, or ``N`` of ``resume_from``'s ``step-{N}``, whose state is loaded), the
    checkpoint folder and this rank's log, opened to append."""
    step = 0
    if config.get("resume_from"):
        accelerator.load_state(config["resume_from"])
        step = int(Path(config["resume_from"]).name.split("-")[1])
    log = open(Path(config["out"]) / f"rank{accelerator.process_index}.jsonl", "a")
    return step, Path(config["ckpt_dir"]), log


def main(config: dict[str, Any]) -> None:
    if config.get("step_batches"):
        stepped(config)
        return
    accelerator = Accelerator(cpu=True, **accelerator_options(config))
    model, optimizer = prepared_model(accelerator)
    collated = config.get("collate", False)  # an unbatched dataset batched by the DataLoader
    dataset = ShardDataset(
        config["data"],
        batch_size=None if collated else config["batch_size"],
        seed=5,
        ordering=Ordering(shuffle_shards=2),
    )
    progress = track(accelerator, dataset)
    options: dict[str, Any] = {
        "batch_size": config["batch_size"] if collated else None,
        "num_workers": config["workers"],
    }
    if collated:
        options["collate_fn"] = collate
    if config["workers"]:
        options["persistent_workers"] = config["persistent"]
    loader: Any = DataLoader(dataset, **options)  # not prepared: the dataset plans this rank's batches itself
    if config.get("loader") == "shardio":
        loader = ShardLoader(
            dataset, num_workers=config["workers"], persistent_workers=config.get("persistent", True)
        )
    if config.get("prepare"):  # the pitfall, for tests/integrations/test_accelerate.py
        loader = accelerator.prepare(loader)
    step, ckpt, log = resume(accelerator, config)
    for epoch in range(progress.epoch, config["max_epochs"]):
        dataset.set_epoch(epoch)  # keeps a state just loaded for this epoch
        for batch in loader:
            if step == config.get("kill_at_step"):
                os.kill(os.getpid(), signal.SIGKILL)
            log.write(json.dumps({"epoch": epoch, "step": step, "keys": list(batch["keys"])}) + "\n")
            log.flush()
            features = batch["audio"].mean(dim=(1, 2)).unsqueeze(1)
            loss = model(features).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if not collated:  # update refuses a DataLoader's collated batches: no position describes them
                progress.update(batch)
            step += 1
            if step % config["every_n_steps"] == 0:
                accelerator.save_state(str(ckpt / f"step-{step}"))
        if step % config["every_n_steps"]:
            accelerator.save_state(str(ckpt / f"step-{step}"))  # the epoch end
    accelerator.wait_for_everyone()
    accelerator.end_training()


def stepped(config: dict[str, Any]) -> None:
    """With ``step_batches``: ``gradient_accumulation_steps`` of ``K / processes``, ``accelerator.accumulate``
    (each batch logged with ``sync``: whether it ends an optimizer step), ``save_state`` at every
    ``every_n_steps``-th optimizer step, SIGKILL at optimizer step ``kill_at_step``."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = config["step_batches"] // processes
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model, optimizer = prepared_model(accelerator)
    batching = Batching(batch_size=config["batch_size"], step_batches=config["step_batches"])
    dataset = ShardDataset(config["data"], batching=batching, seed=5, ordering=Ordering(shuffle_shards=2))
    progress = track(accelerator, dataset)
    loader = DataLoader(dataset, batch_size=None, num_workers=config["workers"])
    step, ckpt, log = resume(accelerator, config)
    for epoch in range(progress.epoch, config["max_epochs"]):
        dataset.set_epoch(epoch)
        for batch in loader:
            if step == config.get("kill_at_step"):
                os.kill(os.getpid(), signal.SIGKILL)
            with accelerator.accumulate(model):
                features = batch["audio"].mean(dim=(1, 2)).unsqueeze(1)
                accelerator.backward(model(features).pow(2).mean())
                optimizer.step()
                optimizer.zero_grad()
            sync = accelerator.sync_gradients
            entry = {"epoch": epoch, "step": step, "sync": sync, "keys": list(batch["keys"])}
            log.write(json.dumps(entry) + "\n")
            log.flush()
            progress.update(batch)
            if sync:
                step += 1
                if step % config["every_n_steps"] == 0:
                    accelerator.save_state(str(ckpt / f"step-{step}"))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    dump_stacks_on_signal()
    torch.set_num_threads(1)
    main(json.loads(Path(sys.argv[1]).read_text()))
