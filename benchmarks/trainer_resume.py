"""What a resume costs under HF Transformers' Trainer: the plain Trainer against ShardioTrainer.

Run ``python benchmarks/trainer_resume.py [--files 1200] [--positions 100 250] [--runs 3]``. Corpus: synthetic
speech (:mod:`shardio.synth`, 1-5 s, 16 kHz FLAC) packed into shards. For each position P (in batches of 4),
each trainer trains a tiny model P steps and checkpoints there; then a new Trainer resumes from that
checkpoint for one step, ``--runs`` times. Reported: the median wall time of that ``train()`` call (loading
the checkpoint, whatever the trainer reads to get back to P, one step) and the samples the resumed process
read (``ds.stats.samples``, 0 workers): the plain Trainer (an unbatched ShardDataset that its DataLoader
batches, prepared by Accelerate) iterates the epoch from its start through ``skip_first_batches`` and throws
away the P batches before the checkpoint; ShardioTrainer loads the loader state and reads the one batch it
trains. Writes ``benchmarks/results/trainer_resume.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from shardio import ShardDataset
from shardio.bench.report import write_results
from shardio.integrations.transformers import ShardioTrainer
from shardio.packing.pack import pack
from shardio.synth import make_corpus

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BATCH = 4


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def forward(self, input_values: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.layer(input_values.mean(dim=1, keepdim=True)).pow(2).mean()}


def batched(batch: dict[str, Any]) -> dict[str, Any]:
    return {"input_values": batch["audio"][:, 0]}


def padded(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "input_values": torch.nn.utils.rnn.pad_sequence([s["audio"][0] for s in samples], batch_first=True)
    }


def trainer(kind: str, data: Path, out: Path, steps: int) -> tuple[Any, ShardDataset]:
    dataset = ShardDataset(data, batch_size=None if kind == "plain" else BATCH, seed=1)
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=True,
        report_to=[],
        max_steps=steps,
        save_steps=steps,
        per_device_train_batch_size=BATCH,
        disable_tqdm=True,
        logging_steps=10**6,
        remove_unused_columns=False,
        save_only_model=False,
    )
    torch.manual_seed(0)
    if kind == "plain":
        return Trainer(model=Tiny(), args=args, train_dataset=dataset, data_collator=padded), dataset
    return ShardioTrainer(model=Tiny(), args=args, train_dataset=dataset, data_collator=batched), dataset


def measure(kind: str, data: Path, work: Path, position: int, runs: int) -> dict[str, Any]:
    out = work / f"{kind}-{position}"
    trainer(kind, data, out, position)[0].train()
    times, reads = [], []
    for _ in range(runs):
        resumed, dataset = trainer(kind, data, out, position + 1)
        started = time.perf_counter()
        resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{position}"))
        times.append(time.perf_counter() - started)
        reads.append(dataset.stats.samples)
        for extra in out.glob(f"checkpoint-{position + 1}"):
            shutil.rmtree(extra)
    return {
        "trainer": kind,
        "position": position,
        "seconds": statistics.median(times),
        "samples_read": reads[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1200)
    parser.add_argument("--positions", type=int, nargs="+", default=[100, 250])
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        make_corpus(
            work / "corpus", num_files=options.files, formats=("flac",), min_seconds=1.0, max_seconds=5.0
        )
        pack(work / "corpus", work / "data")
        rows = [
            measure(kind, work / "data", work, position, options.runs)
            for position in options.positions
            for kind in ("plain", "shardio")
        ]
    lines = [
        (
            f"Resume cost under transformers' Trainer ({options.files} utterances of 1-5 s, 16 kHz FLAC, "
            f"batches of {BATCH}, 0 workers; {platform.processor() or platform.machine()}, "
            f"median of {options.runs})"
        ),
        "",
        "| trainer | resumed at batch | train() of 1 step after the resume | samples read |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {row['trainer']} | {row['position']} | {row['seconds']:.2f} s | {row['samples_read']} |"
        for row in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(RESULTS, "trainer_resume", {"files": options.files, "batch": BATCH, "rows": rows}, text)


if __name__ == "__main__":
    main()
