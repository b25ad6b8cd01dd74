"""World and Context: which rank and which DataLoader worker this process is, detected in exactly one place.

:meth:`Context.detect` is the one call of ``torch.utils.data.get_worker_info`` in shardio, and
:meth:`World.detect` the one reading of ``torch.distributed`` and ``RANK``/``WORLD_SIZE``. A dataset detects
the context where the user or torch calls it (an iteration, ``set_epoch``, ``state_dict``...) and hands the
value to the runtime below it; code that torch calls directly in a worker (a ``collate_fn``) detects it here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from .checks.options import integer
from .checks.states import MAX_WORKERS, MAX_WORLD_SIZE  # what a state can record
from .errors import OptionError

__all__ = ["Context", "World", "refuse_resharding"]


@dataclass(frozen=True)
class World:
    """The position of this process in the job: `rank` of `world_size`, `worker` of `num_workers`.

    Args:
        rank: This process's rank, from 0 (default 0).
        world_size: The job's ranks (default 1).
        worker: This DataLoader worker, from 0 (default 0: the process that iterates).
        num_workers: The rank's DataLoader workers (default 1: iteration in one process).
        ranks_per_node: The ranks each node runs, in contiguous blocks (ranks `n * R` to `n * R + R - 1` on
            node `n`, as torchrun starts them); only `Ordering(node_stable=True)` plans with it (default 1:
            every rank a node of its own; detected: `LOCAL_WORLD_SIZE`).

    Raises:
        OptionError: A value that is not an integer, or a rank or worker outside its range.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    ranks_per_node: int = 1

    def __post_init__(self) -> None:
        exact = type(self.rank) is type(self.world_size) is type(self.worker) is type(self.num_workers) is int
        exact = exact and type(self.ranks_per_node) is int and 1 <= self.ranks_per_node <= MAX_WORLD_SIZE
        if not (exact and 1 <= self.world_size <= MAX_WORLD_SIZE and 1 <= self.num_workers <= MAX_WORKERS):
            # anything but plain ints within their bounds (a detected world is): converted, or refused by name
            object.__setattr__(self, "world_size", integer("world_size", self.world_size, 1, MAX_WORLD_SIZE))
            object.__setattr__(self, "num_workers", integer("num_workers", self.num_workers, 1, MAX_WORKERS))
            object.__setattr__(self, "rank", integer("rank", self.rank, None))  # its range: just below
            object.__setattr__(self, "worker", integer("worker", self.worker, None))
            object.__setattr__(
                self, "ranks_per_node", integer("ranks_per_node", self.ranks_per_node, 1, MAX_WORLD_SIZE)
            )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise OptionError(f"rank {self.rank} is not within a world of size {self.world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise OptionError(f"worker {self.worker} is not within {self.num_workers} workers")

    @classmethod
    def detect(
        cls, rank: int | None = None, world_size: int | None = None, context: Context | None = None
    ) -> World:
        """The ranks from the arguments, else `torch.distributed`, else `RANK`/`WORLD_SIZE`, else 0 of 1.

        The worker comes from `torch.utils.data.get_worker_info()` (0 of 1 outside a DataLoader worker), the
        ranks per node from `LOCAL_WORLD_SIZE` (torchrun's; 1 without it).

        Args:
            rank: This process's rank (`None`: detected).
            world_size: The job's ranks (`None`: detected).
            context: Where this process runs, when the caller has detected it already.

        Returns:
            The world of this process.

        Raises:
            OptionError: A `RANK`, `WORLD_SIZE` or `LOCAL_WORLD_SIZE` that is not an integer, or a rank
                outside the world.
        """
        if rank is None or world_size is None:
            detected_rank, detected_size = _detect_ranks()
            rank = detected_rank if rank is None else rank
            world_size = detected_size if world_size is None else world_size
        context = Context.detect() if context is None else context
        return cls(rank, world_size, context.worker, context.num_workers, _detect_ranks_per_node())

    def with_worker(self, context: Context | None = None) -> World:
        """This world with a context's worker fields.

        Args:
            context: Where a process runs (default: detected for this process).

        Returns:
            A copy with `worker` and `num_workers` from `context`.
        """
        context = Context.detect() if context is None else context
        return replace(self, worker=context.worker, num_workers=context.num_workers)


@dataclass(frozen=True)
class Context:
    """Where this process runs: DataLoader worker ``worker`` of ``num_workers`` (``in_worker``), with the
    ``seed`` torch drew for it and the ``dataset`` its DataLoader runs there; else the process that iterates
    (a training process, with ``num_workers=0`` or between its workers' iterations): worker 0 of 1."""

    in_worker: bool = False
    worker: int = 0
    num_workers: int = 1
    seed: int = 0
    dataset: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def detect(cls) -> Context:
        """The context of this process, from ``torch.utils.data.get_worker_info()`` (also set in a
        :class:`~shardio.ShardLoader`'s workers).

        Returns:
            The context detected now.
        """
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return cls()
        return cls(True, info.id, info.num_workers, info.seed, info.dataset)


def _prepared_loader_dataset() -> Any:
    """The dataset of the loader Accelerate prepared and is iterating in this process, if any (read only where
    the job imported Accelerate: shardio never imports it for this)."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return None
    gradient = state.GradientState()
    return getattr(gradient.active_dataloader, "dataset", None) if gradient.in_dataloader else None


def _detect_ranks_per_node() -> int:
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is None:
        return 1
    try:
        return int(local)
    except ValueError:
        raise OptionError(f"LOCAL_WORLD_SIZE={local!r} is not an integer") from None


def _detect_ranks() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise OptionError(
            f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} are not integers"
        ) from None


def refuse_resharding(context: Context, dataset: Any) -> None:
    """An :class:`OptionError` where ``dataset`` is iterated by a wrapper that splits its stream among the
    ranks again: Accelerate's (or transformers') ``IterableDatasetShard``, which
    ``accelerator.prepare(loader)`` puts around an IterableDataset with ``dispatch_batches=False``.

    Every rank would keep a slice of its own share (the dataset has already split the epoch among the ranks)
    and pad the last with repeats: most samples lost, some trained twice, with no error of its own. In a
    DataLoader worker the wrapper is the dataset torch names in ``context``; in the process that iterates,
    the dataset of the loader Accelerate prepared and is iterating (``GradientState.active_dataloader``). A
    wrapper built by hand and iterated without workers outside a prepared loader is not seen.

    Args:
        context: Where this process runs.
        dataset: The dataset being iterated.

    Raises:
        OptionError: The loader iterates ``dataset`` through ``IterableDatasetShard``.
    """
    wrapper = context.dataset if context.in_worker else _prepared_loader_dataset()
    kind = type(wrapper)
    if (
        kind.__name__ == "IterableDatasetShard"
        and kind.__module__.split(".")[0] in ("accelerate", "transformers")
        and getattr(wrapper, "dataset", None) is dataset
    ):
        raise OptionError(
            f"{kind.__module__}.IterableDatasetShard iterates this ShardDataset: "
            "accelerator.prepare(loader) with dispatch_batches=False splits each rank's stream among "
            "the ranks again, but the dataset already gives each rank its own share (each rank "
            "would train on a slice of it, padded with repeats). Prepare the model and optimizer, "
            "not the loader, and checkpoint with shardio.integrations.accelerate.track"
        )
