"""Rank processes started with a dataset built before them (``handed_ranks_job.py METHOD DATA OUT [EPOCH]``).

The launcher builds a ``ShardDataset`` (``set_epoch(EPOCH)``, if given) and starts 2 gloo ranks with
``torch.multiprocessing.start_processes(start_method=METHOD)``, handing each the dataset, as Lightning's
``ddp_spawn`` and ``ddp_fork`` strategies do. Each rank plays epoch 0 (or ``EPOCH``) through a
2-worker DataLoader whose workers fork from the rank, then the next epoch with ``set_epoch`` and no workers,
and writes ``[epoch, keys]`` per batch to ``{OUT}/rank{r}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from shardio import Ordering, ShardDataset

WORLD_SIZE = 2


def rank_main(rank: int, dataset: ShardDataset, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    played: list[Any] = []
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    played += [[int(batch["epoch"]), list(batch["keys"])] for batch in loader]
    dist.barrier()
    dataset.set_epoch(played[-1][0] + 1)
    played += [[int(batch["epoch"]), list(batch["keys"])] for batch in DataLoader(dataset, batch_size=None)]
    Path(out, f"rank{rank}.json").write_text(json.dumps(played))
    dist.barrier()
    dist.destroy_process_group()


def main(method: str, data: str, out: str, epoch: str | None) -> None:
    from process_groups import free_port

    torch.set_num_threads(1)
    dataset = ShardDataset(data, batch_size=2, seed=3, ordering=Ordering(shuffle_shards=2))
    if epoch is not None:
        dataset.set_epoch(int(epoch))
    mp.start_processes(rank_main, args=(dataset, free_port(), out), nprocs=WORLD_SIZE, start_method=method)


if __name__ == "__main__":
    main(*sys.argv[1:4], sys.argv[4] if len(sys.argv) > 4 else None)
