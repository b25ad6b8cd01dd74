"""A tiny NeMo ``EncDecCTCModel`` trained by Lightning on shardio batches, for tests/integrations/test_nemo.py
(run by NeMo's own Python: ``SHARDIO_NEMO_PYTHON``). ``prepare WORK`` packs a small corpus; ``train WORK OUT
KILL_AT`` trains 2 epochs with ``ShardioCallback`` and a ``ModelCheckpoint`` every 3 steps (resuming from
``OUT/last.ckpt`` when it exists), appending each trained batch's keys to ``OUT/trained.txt`` and killing
itself with SIGKILL at the start of training step ``KILL_AT`` (0: never). ``train WORK OUT KILL_AT plain``:
the same without the callback (a plain ``DataLoader`` over the dataset, as Lightning resumes one alone)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

LABELS = [" ", "a", "b", "c"]
WORDS = ["ab", "ba", "abc", "cab", "bca", "ca"]


def prepare(work: Path) -> None:
    (work / "wav").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = []
    for number in range(24):
        frames = int(16000 * (0.3 + 0.05 * (number % 7)))
        audio = 0.3 * np.sin(np.arange(frames) * (0.05 + 0.01 * (number % 5))) + 0.01 * rng.standard_normal(
            frames
        )
        path = work / "wav" / f"utt{number:03d}.wav"
        sf.write(path, audio.astype(np.float32), 16000, subtype="PCM_16")
        text = f"{WORDS[number % 6]} {WORDS[(number * 5) % 6]}"
        lines.append(
            json.dumps({"audio_filepath": str(path), "duration": frames / 16000, "text": text}) + "\n"
        )
    (work / "manifest.json").write_text("".join(lines))
    from shardio.cli import main

    assert main(["pack", str(work / "manifest.json"), str(work / "shards"), "--no-progress"]) == 0


def _config() -> Any:
    from omegaconf import OmegaConf

    block = {"filters": 16, "repeat": 1, "kernel": [5], "stride": [1], "dilation": [1], "dropout": 0.0}
    return OmegaConf.create(
        {
            "sample_rate": 16000,
            "labels": LABELS,
            "preprocessor": {
                "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                "sample_rate": 16000, "features": 16, "n_fft": 512, "window_size": 0.02,
                "window_stride": 0.01, "dither": 0.0, "pad_to": 0,
            },
            "encoder": {
                "_target_": "nemo.collections.asr.modules.ConvASREncoder", "feat_in": 16,
                "activation": "relu", "conv_mask": True,
                "jasper": [{**block, "residual": False, "separable": False}],
            },
            "decoder": {
                "_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": 16,
                "num_classes": len(LABELS), "vocabulary": LABELS,
            },
            "optim": {"name": "adam", "lr": 0.002},
        }
    )  # fmt: skip


def train(work: Path, out: Path, kill_at: int, plain: bool = False) -> None:
    import lightning.pytorch as pl
    from nemo.collections.asr.models import EncDecCTCModel
    from torch.utils.data import DataLoader

    from shardio import ShardDataset
    from shardio.integrations.lightning import ShardioCallback
    from shardio.integrations.nemo import nemo_batch

    resume = ShardioCallback()
    log = out / "trained.txt"
    out.mkdir(parents=True, exist_ok=True)

    class Model(EncDecCTCModel):  # type: ignore[misc]
        def train_dataloader(self) -> DataLoader:
            dataset = ShardDataset(work / "shards", batch_size=3, seed=0)
            return DataLoader(dataset if plain else resume.attach(dataset), batch_size=None)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            if self.trainer.global_step + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            with open(log, "a") as handle:
                handle.write(" ".join(batch["keys"]) + "\n")
            return super().training_step(
                nemo_batch(batch, lambda text: [LABELS.index(c) for c in text]), batch_idx
            )

    torch.manual_seed(0)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=out, every_n_train_steps=3, save_last=True, save_top_k=-1
    )
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", callbacks=[checkpoints] if plain else [resume, checkpoints],
        use_distributed_sampler=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    model = Model(cfg=_config(), trainer=trainer)
    last = out / "last.ckpt"
    trainer.fit(model, ckpt_path=str(last) if last.exists() else None)
    torch.save(model.state_dict(), out / "final.pt")


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    else:
        train(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["plain"])
