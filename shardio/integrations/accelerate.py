"""Exact resume of a :class:`~shardio.ShardDataset` under HF Accelerate: :func:`track`.

What Accelerate would do to the loader (read in its 1.15 source, ``data_loader.prepare_data_loader``):
``accelerator.prepare(loader)`` over an IterableDataset either iterates it on the main process only and
sends slices of its batches to the others (``dispatch_batches``, the default for an IterableDataset), or
wraps the dataset in ``IterableDatasetShard``, which splits the stream again; and its ``set_epoch`` counts
epochs itself, from 0 in a resumed process. A ShardDataset already plans every rank's batches, so the
loader must not be prepared: the model and optimizer are, the loader is a plain ``DataLoader``.

``accelerator.save_state`` saves registered objects from the main process only: rank 0's state restores
every rank, because every rank has the same number of batches.
"""

from __future__ import annotations

from typing import Any

from ..datasets.dataset import ShardDataset
from ..errors import OptionError
from ..state import check_follows
from ._extras import require

__all__ = ["LoaderProgress", "track"]

require("accelerate", "accelerate")


class LoaderProgress:
    """The loader state after the last batch trained on; registered for ``save_state``/``load_state``.

    Call :meth:`update` with each batch once it has been trained on. :meth:`load_state_dict` (called by
    ``accelerator.load_state``) loads the dataset; iteration then continues from the batch after it.

    Args:
        dataset: The dataset the training loop iterates.

    Raises:
        TypeError: A dataset that is not a `ShardDataset`.
    """

    def __init__(self, dataset: ShardDataset) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError(f"LoaderProgress takes a ShardDataset, not {type(dataset).__name__}")
        self.dataset = dataset
        self._state: dict[str, Any] | None = None

    @property
    def epoch(self) -> int:
        """The epoch to play next (the loaded one after a resume)."""
        return self.dataset.epoch

    def update(self, batch: dict[str, Any]) -> None:
        """Record that a batch has been trained on, after every batch before it.

        Args:
            batch: A batch the dataset yielded.

        Raises:
            StateError: A batch that does not follow the last one recorded.
        """
        state = self.dataset.state_after(batch)
        check_follows(self._state, state)
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        """The state to save: after the last batch trained on, else where the dataset stands."""
        return self._state if self._state is not None else self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state: the next iteration of the dataset starts after its batch.

        Args:
            state: A state `state_dict` returned.
        """
        self.dataset.load_state_dict(state)
        self._state = state


def track(accelerator: Any, dataset: ShardDataset) -> LoaderProgress:
    """Check that ``dataset`` plans for the accelerator's ranks and register its progress for checkpointing.

    Build the ``DataLoader`` over ``dataset`` yourself and do not ``prepare()`` it. The returned
    :class:`LoaderProgress` is saved by ``accelerator.save_state`` and restored by ``accelerator.load_state``.

    Args:
        accelerator: The `accelerate.Accelerator`.
        dataset: The dataset, built after `Accelerator()` (or with its ranks as `world`).

    Returns:
        The registered progress: call its `update(batch)` after each trained batch.

    Raises:
        OptionError: Not a `ShardDataset`, or one that plans for other ranks than the accelerator's.
    """
    if not isinstance(dataset, ShardDataset):
        raise OptionError(f"track takes a ShardDataset, not {type(dataset).__name__}")
    world = dataset.ranks()
    if (world.rank, world.world_size) != (accelerator.process_index, accelerator.num_processes):
        raise OptionError(
            f"the dataset plans for rank {world.rank} of {world.world_size}, the accelerator "
            f"runs process {accelerator.process_index} of {accelerator.num_processes}: build "
            "the dataset "
            "after Accelerator() (or give it World(accelerator.process_index, "
            "accelerator.num_processes))"
        )
    progress = LoaderProgress(dataset)
    accelerator.register_for_checkpointing(progress)
    return progress
