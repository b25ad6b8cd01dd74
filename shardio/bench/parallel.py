"""The machine's parallel floor for ``shardio bench``: one corpus read by several processes at once, each with
0 DataLoader workers and its own rank of the plan, nothing handed from one process to another.

``N`` DataLoader workers cannot beat this: it is what ``N`` cores of the machine give the reading and decoding
themselves (caches and memory bandwidth they share, a shared host's neighbours) before any transport. On a
shared 2-core VM two such readers ran at 0.85-1.07 of a lone reader's rate per CPU-second, and at 1.7-1.9x its
wall rate only in rounds where no neighbour held a core; the ratio of ``N`` workers to this floor is the
hand-off's own share.
"""

from __future__ import annotations

import multiprocessing
import weakref
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import torch

from ..datasets.dataset import ShardDataset
from ..errors import ReadError
from ..world import World
from .cases import Epoch, count_batches

__all__ = ["parallel_floor"]

_PATIENCE = 600.0  # seconds an epoch of one reader may take before the bench gives up on it


def _serve(
    conn: Connection, directory: str, rank: int, processes: int, batch_size: int, shuffle: bool
) -> None:
    """A reader process: one epoch of its rank per request, until it is sent None."""
    torch.set_num_threads(1)  # as in a DataLoader worker: no intra-op pool spinning beside the other readers
    dataset = ShardDataset(directory, batch_size=batch_size, shuffle=shuffle, world=World(rank, processes))
    while conn.recv() is not None:
        try:
            conn.send(("ok", count_batches(_planned(dataset))))
        except Exception as exc:  # reported to the bench, which raises it there
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _planned(batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The batches without the samples a rank repeats to even out the ranks' batch counts (so the readers
    together count the corpus once, as the workers of one rank do)."""
    for batch in batches:
        keep = ~batch["repeat"]
        if bool(keep.all()):
            yield batch
        else:
            yield {
                **batch,
                "keys": [k for k, kept in zip(batch["keys"], keep.tolist()) if kept],
                "lengths": batch["lengths"][keep],
                "sample_rate": batch["sample_rate"][keep],
            }


def _stop(pipes: list[Connection], procs: list[Any]) -> None:
    for pipe in pipes:
        try:
            pipe.send(None)
        except OSError:
            pass
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()


def parallel_floor(directory: str, *, processes: int, batch_size: int, shuffle: bool = True) -> Epoch:
    """``processes`` reader processes, started now and kept (as persistent DataLoader workers are), each
    reading rank ``r`` of ``processes`` of ``directory`` with 0 workers; an epoch runs them all at once and
    returns the samples and audio seconds they read together."""
    context: Any = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    )
    pipes: list[Connection] = []
    procs: list[Any] = []
    for rank in range(processes):
        ours, theirs = context.Pipe()
        proc = context.Process(
            target=_serve,
            args=(theirs, directory, rank, processes, batch_size, shuffle),
            daemon=True,
            name=f"shardio-bench-reader-{rank}",
        )
        proc.start()
        theirs.close()
        pipes.append(ours)
        procs.append(proc)

    def epoch() -> tuple[int, float]:
        for pipe in pipes:
            pipe.send(True)
        samples, seconds = 0, 0.0
        for rank, pipe in enumerate(pipes):
            try:
                if not pipe.poll(_PATIENCE):
                    raise ReadError(
                        f"parallel floor: reader process {rank} of {processes} sent nothing in "
                        f"{_PATIENCE:.0f} s"
                    )
                status, value = pipe.recv()
            except EOFError:
                raise ReadError(f"parallel floor: reader process {rank} of {processes} exited") from None
            if status != "ok":
                raise ReadError(f"parallel floor: reader process {rank} of {processes} failed: {value}")
            samples, seconds = samples + value[0], seconds + value[1]
        return samples, seconds

    weakref.finalize(epoch, _stop, pipes, procs)
    return epoch
