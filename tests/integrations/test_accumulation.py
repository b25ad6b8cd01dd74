"""Every integrated trainer reads its gradient accumulation against the dataset's (``ds.accumulation`` with
``Batching(step_batches=K)``): a mismatch is refused with a message naming both numbers, before training;
the matching setting, and any setting without ``step_batches``, is accepted. Each trainer is real, made in
a fresh interpreter (Accelerate's process state never in pytest's; SpeechBrain's in its own environment,
``SHARDIO_SPEECHBRAIN_PYTHON``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from job_runs import SPEECHBRAIN_PYTHON, run_python
from sample_shards import make_uneven_dataset

PRELUDE = """
from shardio import Batching, ShardDataset, ShardioError, World

def dataset(steps):
    return ShardDataset(DATA, batching=Batching(batch_size=2, step_batches=steps), world=World(0, 1))

def attempt(name, case):
    try:
        case()
        print(name, "accepted")
    except ShardioError as exc:
        print(name, type(exc).__name__, str(exc).splitlines()[0])
"""

CASES = {
    "lightning": """
import pytorch_lightning as pl
from shardio.integrations.lightning import ShardioCallback

def run(given, steps):
    trainer = pl.Trainer(accumulate_grad_batches=given, logger=False, enable_checkpointing=False,
                         accelerator="cpu", enable_progress_bar=False)
    ShardioCallback(dataset(steps)).on_train_start(trainer, None)
""",
    "accelerate": """
from accelerate import Accelerator
from shardio.integrations.accelerate import track

def run(given, steps):
    track(Accelerator(cpu=True, gradient_accumulation_steps=given), dataset(steps))
""",
    "transformers": """
import tempfile, torch
from transformers import TrainingArguments
from shardio.integrations.transformers import ShardioTrainer

def run(given, steps):
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), gradient_accumulation_steps=given, use_cpu=True,
                             report_to=[])
    trainer = ShardioTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=dataset(steps))
    trainer.get_train_dataloader()
""",
    "speechbrain": """
import tempfile, torch, speechbrain as sb
from speechbrain.utils.checkpoints import Checkpointer
from shardio.integrations.speechbrain import track

def run(given, steps):
    brain = sb.Brain(modules={"l": torch.nn.Linear(1, 1)}, checkpointer=Checkpointer(tempfile.mkdtemp()),
                     run_opts={"device": "cpu", "noprogressbar": True, "grad_accumulation_factor": given})
    track(brain, dataset(steps))
""",
}

SETTINGS = {
    "lightning": "Trainer(accumulate_grad_batches)",
    "accelerate": "Accelerator(gradient_accumulation_steps)",
    "transformers": "TrainingArguments(gradient_accumulation_steps)",
    "speechbrain": "grad_accumulation_factor",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("accumulation") / "data"
    make_uneven_dataset(root, (3, 9, 4), seed=1)
    return root


@pytest.mark.parametrize("trainer", sorted(CASES))
def test_a_trainer_whose_accumulation_is_not_the_datasets_is_refused_naming_both(
    trainer: str, data: Path
) -> None:
    if trainer == "speechbrain" and not SPEECHBRAIN_PYTHON:
        pytest.skip("SHARDIO_SPEECHBRAIN_PYTHON is not set (tests/README.md)")
    if (
        trainer != "speechbrain"
        and importlib.util.find_spec({"lightning": "pytorch_lightning"}.get(trainer, trainer)) is None
    ):
        pytest.skip(f"{trainer} is not installed")
    code = f"DATA = {str(data)!r}\n{PRELUDE}\n{CASES[trainer]}\n" + (
        'attempt("mismatch", lambda: run(2, 4))\n'
        'attempt("match", lambda: run(4, 4))\n'
        'attempt("no steps", lambda: run(2, None))\n'
    )
    out = run_python(code, timeout=180, python=SPEECHBRAIN_PYTHON if trainer == "speechbrain" else "")
    assert (
        f"mismatch OptionError {SETTINGS[trainer]} is 2, but the dataset's step_batches=4 on 1 ranks makes 4 "
        "batches per rank per optimizer step" in out
    ), out
    assert "match accepted" in out and "no steps accepted" in out, out
