"""A tiny NeMo ``EncDecCTCModel`` trained by Lightning on shardio batches, for tests/integrations/test_nemo.py
(run by NeMo's own Python: ``SHARDIO_NEMO_PYTHON``). ``prepare WORK`` packs a small corpus into shardio shards
(``WORK/shards``) and writes the same corpus as a NeMo tarred dataset (``WORK/tarred``: the layout NeMo's
``convert_to_tarred_audio_dataset.py`` writes), indexed in place with ``shardio index --nemo-manifest``.
``train WORK OUT KILL_AT [--devices N] [--workers N] [--every N] [--data shards|tarred] [--plain]`` trains
2 epochs with ``ShardioCallback`` and a ``ModelCheckpoint`` every ``--every`` steps (resuming from
``OUT/last.ckpt`` when it exists), appending each trained batch's keys to ``OUT/trained{rank}.txt`` and
killing itself with SIGKILL at the start of training step ``KILL_AT`` (0: never); ``--devices 2``: Lightning's
DDP over gloo. ``--plain``: the same without the callback (a plain ``DataLoader`` over the dataset, as
Lightning resumes one alone)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tarfile
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
    # utt004 listed twice (NeMo's converter names the second "-sub1"): 25 lines in 4 shards of 6, the last
    # line dropped as NeMo's converter drops the remainder
    entries = [json.loads(line) for line in lines]
    write_tarred([*entries[:5], entries[4], *entries[5:]], work / "tarred", shards=4)
    tarred = work / "tarred"
    manifest = str(tarred / "tarred_audio_manifest.json")
    assert main(["index", str(tarred), "--nemo-manifest", manifest, "--no-progress"]) == 0


def write_tarred(entries: list[dict[str, Any]], target: Path, *, shards: int) -> None:
    """Write ``entries`` (manifest lines) as NeMo's converter
    (``scripts/speech_recognition/convert_to_tarred_audio_dataset.py``) does with its defaults
    (``--num_shards shards``: no shuffling, no sorting, no slicing by offset, shard manifests written):
    ``audio_{n}.tar`` of ``len(entries) // shards`` entries each (the remainder dropped), members named after
    the audio's path with ``/`` and ``.`` replaced by ``_``, a file listed twice in a shard stored once
    and its repeats named ``{name}-sub{n}``; ``tarred_audio_manifest.json`` and
    ``sharded_manifests/manifest_{n}.json`` with each line's ``audio_filepath`` the member's name and its
    ``shard_id``. The script is not part of NeMo's package (it is in NeMo's repository), hence this copy of
    its layout."""
    target.mkdir(parents=True)
    (target / "sharded_manifests").mkdir()
    per_shard, written = len(entries) // shards, []
    for shard in range(shards):
        count: dict[str, int] = {}
        lines = []
        with tarfile.open(target / f"audio_{shard}.tar", mode="w", dereference=True) as tar:
            for entry in entries[shard * per_shard : (shard + 1) * per_shard]:
                base, ext = os.path.splitext(entry["audio_filepath"])
                base = base.replace("/", "_").replace(".", "_")
                name = base + ext
                if name not in count:
                    tar.add(entry["audio_filepath"], arcname=name)
                    member, count[name] = name, 1
                else:
                    member, count[name] = f"{base}-sub{count[name]}{ext}", count[name] + 1
                lines.append(json.dumps({**entry, "audio_filepath": member, "shard_id": shard}) + "\n")
        (target / "sharded_manifests" / f"manifest_{shard}.json").write_text("".join(lines))
        written += lines
    (target / "tarred_audio_manifest.json").write_text("".join(written))


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


def train(
    work: Path, out: Path, kill_at: int, *, devices: int, workers: int, every: int, data: str, plain: bool
) -> None:
    import lightning.pytorch as pl
    from nemo.collections.asr.models import EncDecCTCModel
    from torch.utils.data import DataLoader

    from shardio import ShardDataset
    from shardio.integrations.lightning import ShardioCallback
    from shardio.integrations.nemo import nemo_batch

    resume = ShardioCallback()
    out.mkdir(parents=True, exist_ok=True)

    class Model(EncDecCTCModel):  # type: ignore[misc]
        def train_dataloader(self) -> DataLoader:
            dataset = ShardDataset(work / data, batch_size=3, seed=0)
            return DataLoader(
                dataset if plain else resume.attach(dataset), batch_size=None, num_workers=workers
            )

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            if self.trainer.global_step + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            with open(out / f"trained{self.trainer.global_rank}.txt", "a") as handle:
                handle.write(" ".join(batch["keys"]) + "\n")
            return super().training_step(
                nemo_batch(batch, lambda text: [LABELS.index(c) for c in text]), batch_idx
            )

    torch.manual_seed(0)
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=out, every_n_train_steps=every, save_last=True, save_top_k=-1
    )
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
        callbacks=[checkpoints] if plain else [resume, checkpoints], use_distributed_sampler=False,
        logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    model = Model(cfg=_config(), trainer=trainer)
    last = out / "last.ckpt"
    trainer.fit(model, ckpt_path=str(last) if last.exists() else None)
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), out / "final.pt")


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    else:
        parser = argparse.ArgumentParser()
        parser.add_argument("work", type=Path)
        parser.add_argument("out", type=Path)
        parser.add_argument("kill_at", type=int)
        parser.add_argument("--devices", type=int, default=1)
        parser.add_argument("--workers", type=int, default=0)
        parser.add_argument("--every", type=int, default=3)
        parser.add_argument("--data", choices=("shards", "tarred"), default="shards")
        parser.add_argument("--plain", action="store_true")
        args = parser.parse_args(sys.argv[2:])
        train(
            args.work, args.out, args.kill_at, devices=args.devices, workers=args.workers,
            every=args.every, data=args.data, plain=args.plain,
        )  # fmt: skip
