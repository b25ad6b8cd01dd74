"""Exact distributed evaluation: word error totals summed over ranks count every utterance once.

    torchrun --nproc_per_node=3 tools/eval_example.py DATASET [--out totals.json]

Every rank gets the same number of batches (``remainder="pad"`` repeats batches from the epoch start to fill
the last round), and every batch's ``repeat`` flags those planned repeats: leaving them out of the sums makes
the all-reduced totals those of one process over the whole set. The "recogniser" here is a stand-in that
garbles some words of each reference transcript (its ``text`` metadata), so the totals are known exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardio import Batching, ShardDataset


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions, insertions, deletions)."""
    row = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, guess in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != guess))
    return row[-1]


def recognise(reference: str) -> str:
    """A stand-in recogniser: deterministically garbles or drops some words."""
    words = []
    for word in reference.replace("_", " ").split():
        code = zlib.crc32(word.encode()) % 5
        if code:
            words.append(word if code > 1 else word.upper())
    return " ".join(words)


def evaluate(dataset_dir: str, batch_size: int, workers: int, count_repeats: bool = False) -> dict[str, int]:
    """This job's totals: every rank's sums over its non-repeated samples (all of them with
    ``count_repeats``, the mistake), all-reduced when distributed."""
    dataset = ShardDataset(
        dataset_dir, shuffle=False, batching=Batching(batch_size=batch_size, remainder="pad")
    )
    totals = torch.zeros(3, dtype=torch.int64)  # word errors, reference words, utterances
    for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
        for text, repeat in zip(batch["text"], batch["repeat"].tolist()):
            if repeat and not count_repeats:  # a planned repeat: an earlier batch (on some rank) counts it
                continue
            reference = text.replace("_", " ").split()
            totals += torch.tensor([edit_distance(reference, recognise(text).split()), len(reference), 1])
    if dist.is_initialized():
        dist.all_reduce(totals)
    errors, words, utterances = totals.tolist()
    return {"errors": errors, "words": words, "utterances": utterances}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--count-repeats", action="store_true", help="the mistake: count the padding too")
    parser.add_argument("--out", type=Path, help="write the totals here as JSON (rank 0)")
    args = parser.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    totals = evaluate(args.dataset, args.batch_size, args.workers, args.count_repeats)
    if not dist.is_initialized() or dist.get_rank() == 0:
        wer = totals["errors"] / max(1, totals["words"])
        print(
            f"WER {wer:.4f}: {totals['errors']} errors / {totals['words']} words, "
            f"{totals['utterances']} utterances"
        )
        if args.out is not None:
            args.out.write_text(json.dumps(totals))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
