"""A worked training loop: checkpoint model, optimizer and loader state every N steps; survive a kill.

    python tools/train_example.py DATASET_DIR --checkpoint ckpt.pt --epochs 2 --every 5

Run it, kill it (Ctrl-C, kill -9, a preempted node), run the same command again: it resumes from the last
checkpoint onto exactly the batches the uninterrupted run would have seen. ``--keys-log`` records, per
step, the keys trained on, so the two runs can be compared (tests/promises/test_train_example.py does that).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from shardio import Decoding, ShardDataset


class TinyModel(nn.Module):
    """A stand-in acoustic model: a strided convolution and a linear head over the pooled features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 8, kernel_size=64, stride=32)
        self.head = nn.Linear(8, 1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(audio)).mean(dim=-1)).squeeze(-1)


def save_checkpoint(path: Path, **payload: object) -> None:
    """Write the checkpoint under a temporary name, then rename: a kill never leaves half a checkpoint."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, temporary)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-duration", type=float, default=20.0, help="padded seconds per batch")
    parser.add_argument("--keys-log", type=Path, help="append 'step key key ...' lines here")
    parser.add_argument("--die-at-step", type=int, help="kill this process with SIGKILL after that step")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    dataset = ShardDataset(args.dataset, max_duration=args.max_duration, seed=0, decoding=Decoding(mono=True))
    model = TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step, first_epoch = 0, 0
    if args.checkpoint.exists():
        checkpoint = torch.load(args.checkpoint, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        dataset.load_state_dict(checkpoint["loader"])
        step, first_epoch = checkpoint["step"], checkpoint["loader"]["epoch"]
        print(f"resumed at step {step}, epoch {first_epoch}")
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers)

    for epoch in range(first_epoch, args.epochs):
        dataset.set_epoch(epoch)  # keeps a just-loaded position in that epoch
        for batch in loader:
            loss = (model(batch["audio"]) - batch["lengths"].float() / 8000).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if args.keys_log:
                with args.keys_log.open("a") as log:
                    log.write(" ".join([str(step), *batch["keys"]]) + "\n")
            if step % args.every == 0:
                save_checkpoint(
                    args.checkpoint,
                    model=model.state_dict(),
                    optimizer=optimizer.state_dict(),
                    loader=dataset.state_after(batch),
                    step=step,
                )
            if step == args.die_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
    print(f"done: {step} steps")


if __name__ == "__main__":
    main()
