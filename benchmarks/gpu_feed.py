"""No GPU waits, measured on an accelerator: a training loop on the GPU fed by shardio or by WebDataset.

Run ``python benchmarks/gpu_feed.py [--files 480] [--steps 60] [--workers 0 2 4 8]``. On a machine without
CUDA the model runs on the CPU and the figures say so (they then measure nothing about GPU waits).

- Corpus: synthetic speech (:mod:`shardio.synth`) with LibriSpeech-like durations (mostly 10-17 s), the
  same utterances as 16 kHz PCM WAV and as FLAC, packed into plain ``.tar`` shards that both loaders read.
- Model: features on the device (STFT, a fixed 80-band projection, log), then a stack of 1-D convolutions;
  AdamW, bf16 autocast on CUDA. Every batch is cropped or zero-padded on the device to ``--crop`` seconds,
  so every step costs the GPU the same.
- Loaders, with ``pin_memory`` on CUDA and persistent workers: shardio through ``ShardLoader`` (the
  recommended set-up, float32) and through a plain ``DataLoader`` (``ShardDataset(batch_size=B)``, float32
  and ``dtype="int16"``), and WebDataset + soundfile through a ``DataLoader`` (decoding from
  ``io.BytesIO``, batched with the same collate), for each worker count.
- Measured: the compute ceiling (steps/s on one batch already on the device), then, per loader, ``--steps``
  timed steps after ``--warmup`` steps: steps/s, **GPU busy share** = ceiling step time x steps / wall
  time (1.0: the GPU never waited for data), and the share of the loop spent inside ``next(loader)``.

Writes ``benchmarks/results/gpu_feed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shardio import Decoding, ShardDataset, ShardLoader  # noqa: E402
from shardio.bench.cases import webdataset_pipeline  # noqa: E402
from shardio.bench.data import dataset_corpus, shard_files  # noqa: E402
from shardio.bench.measure import cpu_seconds  # noqa: E402
from shardio.bench.report import write_results  # noqa: E402
from shardio.packing.pack import pack  # noqa: E402
from shardio.synth import duration_sample, make_corpus  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RATE = 16000


class Net(nn.Module):
    """Log-spectral features on the device, then ``depth`` 1-D convolutions of ``width`` channels."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(400))
        self.register_buffer("bands", torch.rand(201, 80) / 201)
        layers: list[nn.Module] = [nn.Conv1d(80, width, 5, padding=2), nn.GELU()]
        for _ in range(depth):
            layers += [nn.Conv1d(width, width, 5, padding=2), nn.GELU()]
        self.body = nn.Sequential(*layers, nn.Conv1d(width, 32, 1))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spectrum = torch.stft(audio, 400, 160, window=self.window, return_complex=True).abs()
        features = torch.log1p(spectrum.transpose(1, 2) @ self.bands).transpose(1, 2)
        return self.body(features).float().pow(2).mean()


def _on_device(batch: dict[str, Any], device: torch.device, crop: int) -> torch.Tensor:
    audio = batch["audio"].to(device, non_blocking=True)[:, 0]
    audio = audio.float() / 32768.0 if audio.dtype == torch.int16 else audio.float()
    if audio.shape[1] >= crop:
        return audio[:, :crop]
    return nn.functional.pad(audio, (0, crop - audio.shape[1]))


class Trainer:
    """One model and optimiser on ``device``; :meth:`step` runs forward, backward and the update."""

    def __init__(self, device: torch.device, width: int, depth: int) -> None:
        torch.manual_seed(0)
        self.device = device
        self.model = Net(width, depth).to(device)
        self.optimiser = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self, audio: torch.Tensor) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.model(audio)
        loss.backward()
        self.optimiser.step()
        self.optimiser.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def ceiling(trainer: Trainer, batch: dict[str, Any], crop: int, steps: int) -> float:
    """Seconds per step with the batch already on the device: the loop's floor."""
    audio = _on_device(batch, trainer.device, crop)
    for _ in range(3):
        trainer.step(audio)
    trainer.sync()
    started = time.perf_counter()
    for _ in range(steps):
        trainer.step(audio)
    trainer.sync()
    return (time.perf_counter() - started) / steps


def _endless(loader: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    while True:
        yield from loader


def feed(
    trainer: Trainer, loader: Iterable[dict[str, Any]], crop: int, warmup: int, steps: int
) -> dict[str, float]:
    """Train ``warmup`` then ``steps`` steps on ``loader``'s batches; wall time and time inside ``next``."""
    batches = _endless(loader)
    for _ in range(warmup):
        trainer.step(_on_device(next(batches), trainer.device, crop))
    trainer.sync()
    waited = 0.0
    cpu = cpu_seconds()
    started = time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - asked
        trainer.step(_on_device(batch, trainer.device, crop))
    trainer.sync()
    wall = time.perf_counter() - started
    return {"wall_s": wall, "wait_s": waited, "cpu_s": cpu_seconds() - cpu}


def loaders(directory: str, workers: int, batch_size: int, pin: bool) -> dict[str, Iterable[dict[str, Any]]]:
    """The compared loaders over one dataset: shardio's ShardLoader, then plain DataLoaders."""
    persistent = workers > 0
    made: dict[str, Iterable[dict[str, Any]]] = {
        "shardio ShardLoader float32": ShardLoader(
            ShardDataset(directory, batch_size=batch_size), num_workers=workers, pin_memory=pin
        )
    }
    for dtype in ("float32", "int16"):
        dataset = ShardDataset(directory, batch_size=batch_size, decoding=Decoding(dtype=dtype))
        made[f"shardio DataLoader {dtype}"] = DataLoader(
            dataset, batch_size=None, num_workers=workers, persistent_workers=persistent, pin_memory=pin
        )
    ext = "flac" if "flac" in directory else "wav"
    pipeline = webdataset_pipeline(
        shard_files(dataset_corpus(directory, "x", "x")), ext=ext, batch_size=batch_size
    )
    made["webdataset + soundfile DataLoader"] = DataLoader(
        pipeline, batch_size=None, num_workers=workers, persistent_workers=persistent, pin_memory=pin
    )
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=480)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--crop", type=float, default=16.0, help="seconds every batch is cropped/padded to")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4, 8])
    parser.add_argument("--out-dir", default=None, help="where the corpora go (default: a temp dir)")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    crop = int(args.crop * RATE)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="shardio-gpu-feed-"))
    durations = duration_sample(args.files)
    datasets = {}
    for ext in ("wav", "flac"):
        source = out / f"corpus-{ext}"
        if not source.exists():
            make_corpus(source, num_files=args.files, formats=(ext,), sample_rate=RATE, durations=durations)
        datasets[ext] = out / f"dataset-{ext}"
        if not (datasets[ext] / "index.json").exists():
            pack(source, datasets[ext], samples_per_shard=64, progress=False)
    trainer = Trainer(device, args.width, args.depth)
    first = next(iter(ShardDataset(str(datasets["wav"]), batch_size=args.batch_size)))
    floor_s = ceiling(trainer, first, crop, max(10, args.steps // 2))
    rows = []
    for ext, directory in datasets.items():
        for workers in args.workers:
            for name, loader in loaders(
                str(directory), workers, args.batch_size, device.type == "cuda"
            ).items():
                measured = feed(trainer, loader, crop, args.warmup, args.steps)
                del loader
                rows.append(
                    {
                        "corpus": ext,
                        "loader": name,
                        "workers": workers,
                        **measured,
                        "steps_per_s": args.steps / measured["wall_s"],
                        "gpu_busy": floor_s * args.steps / measured["wall_s"],
                        "wait_share": measured["wait_s"] / measured["wall_s"],
                        "cpu_ms_per_step": 1000 * measured["cpu_s"] / args.steps,
                    }
                )
                print(
                    f"{ext:4} {name:36} {workers}w  {rows[-1]['steps_per_s']:6.1f} steps/s  "
                    f"busy {rows[-1]['gpu_busy']:.2f}  in next() {rows[-1]['wait_share']:.2f}  "
                    f"CPU {rows[-1]['cpu_ms_per_step']:.0f} ms/step",
                    flush=True,
                )
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "CPU"
    command = (
        f"python benchmarks/gpu_feed.py --files {args.files} --steps {args.steps} --workers "
        + " ".join(str(w) for w in args.workers)
    )
    kernel = f"{platform.system()} {platform.release()}"
    report = {
        "command": command,
        "device": name,
        "cpus": os.cpu_count(),
        "kernel": kernel,
        "torch": torch.__version__,
        "files": args.files,
        "batch_size": args.batch_size,
        "crop_s": args.crop,
        "width": args.width,
        "depth": args.depth,
        "ceiling_step_ms": 1000 * floor_s,
        "rows": rows,
    }
    lines = [
        "# shardio gpu_feed",
        "",
        f"`{command}` on {name} with {os.cpu_count()} CPU cores, {kernel} (torch {torch.__version__}). "
        f"{args.files} utterances with LibriSpeech-like durations, batch {args.batch_size}, every batch "
        f"cropped/padded to {args.crop:g} s on the device; model: STFT features + {args.depth} convolutions "
        f"of {args.width} channels, AdamW{', bf16 autocast' if device.type == 'cuda' else ''}. "
        f"Ceiling (batch already on the device): {1000 * floor_s:.1f} ms a step. One run of "
        f"{args.steps} steps after {args.warmup} warm-up steps per row.",
        "",
        "GPU busy: ceiling step time x steps / wall time (1.00: the GPU never waited for data). "
        "In next(): share of the loop's wall time spent waiting for the loader. CPU: CPU time of the "
        "training process and its workers per step (the training loop's own share is the same in every row).",
        "",
        "| corpus | loader | workers | steps/s | GPU busy | in next() | CPU ms/step |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['corpus']} | {r['loader']} | {r['workers']} | {r['steps_per_s']:.1f} | {r['gpu_busy']:.2f} | "
        f"{r['wait_share']:.2f} | {r['cpu_ms_per_step']:.0f} |"
        for r in rows
    ]
    write_results(args.results, "gpu_feed", report, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
