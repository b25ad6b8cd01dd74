"""Exact resume of a :class:`~shardio.ShardDataset` under HF Accelerate: :func:`track`.

What Accelerate would do to the loader (read in its 1.15 source, ``data_loader.prepare_data_loader``):
``accelerator.prepare(loader)`` over an IterableDataset either iterates it on the main process only and
sends slices of its batches to the others (``dispatch_batches``, the default for an IterableDataset), or
wraps the dataset in ``IterableDatasetShard``, which splits the stream again; and its ``set_epoch`` counts
epochs itself, from 0 in a resumed process. A ShardDataset already plans every rank's batches, so the
loader must not be prepared: the model and optimizer are, the loader is a plain ``DataLoader``.

What it would do with a registered object (``register_for_checkpointing``): ``save_state`` pickles its
``state_dict()`` into ``custom_checkpoint_N.pkl`` and ``load_state`` unpickles that file with
``torch.load(weights_only=False)``, so a planted file runs code. So :func:`track` registers nothing: its
``save_state`` pre-hook writes the loader state as JSON (``shardio_loader.json`` in the checkpoint folder,
from the main process: rank 0's state restores every rank, because every rank has the same number of
batches), and its ``load_state`` pre-hook reads that file as untrusted data (a regular file, bounded, parsed
as JSON, then validated as every state), before Accelerate loads anything. A folder without it is refused
with a :class:`~shardio.StateError`, never a restart; shardio never unpickles an older shardio's
``custom_checkpoint_N.pkl`` (the ledger reads one with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import os
import re
import weakref
from typing import Any

from ..datasets.checks import check_accumulation
from ..datasets.dataset import ShardDataset
from ..errors import OptionError, StateError, shown
from ..ledger.rebuild import read_state
from ..state import LoaderState, check_follows
from ..storage.files import write_atomic
from ._extras import require

__all__ = ["LoaderProgress", "track"]

require("accelerate", "accelerate")

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_PICKLED = re.compile(r"custom_checkpoint_\d+\.pkl")  # Accelerate's name for a registered object's file
_TRACKED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


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


def track(accelerator: Any, dataset: ShardDataset, *, name: str = "shardio_loader") -> LoaderProgress:
    """Check that ``dataset`` plans for the accelerator's ranks and save its progress with the checkpoints.

    Build the ``DataLoader`` over ``dataset`` yourself and do not ``prepare()`` it. ``accelerator.save_state``
    then writes the returned :class:`LoaderProgress`'s state as JSON, ``{name}.json`` in the checkpoint
    folder, and ``accelerator.load_state`` reads it back (nothing pickled, nothing unpickled).

    Args:
        accelerator: The `accelerate.Accelerator`.
        dataset: The dataset, built after `Accelerator()` (or with its ranks as `world`).
        name: The state file's name in each checkpoint folder, without `.json` (one per tracked dataset).

    Returns:
        The progress: call its `update(batch)` after each trained batch.

    Raises:
        OptionError: Not a `ShardDataset`, one that plans for other ranks than the accelerator's, a `name`
            that is not a plain file name, one already tracked on this accelerator, or a
            `gradient_accumulation_steps` other than the dataset's `accumulation` (with `step_batches`).
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
    check_accumulation(
        dataset, accelerator.gradient_accumulation_steps, "Accelerator(gradient_accumulation_steps)"
    )
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise OptionError(
            f"track's name is a plain file name (letters, digits, '_', '.', '-'), not {shown(name)}"
        )
    names = _TRACKED.setdefault(accelerator, set())
    if name in names:
        raise OptionError(f"this accelerator already tracks a dataset as {name!r}: give each its own name")
    names.add(name)
    progress = LoaderProgress(dataset)
    file = f"{name}.json"

    def save(models: Any, weights: Any, output_dir: str) -> None:
        state = progress.state_dict()
        stepped = LoaderState.from_dict(state).step
        if stepped is not None:
            # Accelerate saves its count of micro-batches and syncs at each multiple of the accumulation: a
            # count of this world's micro-batches is off the steps on another world (6 batches of 2 ranks x 2
            # resumed on 1 x 4 synced after 2); the micro-batch within the step (0 at its boundary), the same
            # place in the step for this run, resumes on any world
            accelerator.step = stepped[1]
        on_each_node = accelerator.project_configuration.save_on_each_node
        if accelerator.is_main_process or (on_each_node and accelerator.is_local_main_process):
            data = json.dumps(state).encode("utf-8")
            write_atomic(os.path.join(output_dir, file), data)

    def load(models: Any, input_dir: str) -> None:
        path = os.path.join(input_dir, file)
        if not os.path.lexists(path):
            raise StateError(_missing(input_dir, file))
        progress.load_state_dict(read_state(path))

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)
    return progress


def _missing(folder: str, file: str) -> str:
    """Why a checkpoint folder without ``file`` is refused (an older shardio's pickled state named)."""
    try:
        pickled = sorted(name for name in os.listdir(folder) if _PICKLED.fullmatch(name))
    except OSError:
        pickled = []
    where = f"the checkpoint {shown(folder, 200)} holds no shardio loader state ({file})"
    if not pickled:
        return (
            f"{where}: it was saved without track() (or with another name), and resuming would restart "
            "or skip batches; resume a checkpoint saved with track()"
        )
    return (
        f"{where}, but {', '.join(pickled)}: an older shardio's state, pickled, which Accelerate would "
        "unpickle with weights_only=False (running whatever it holds): not loaded. If you trust it, "
        "convert it (json.dump(torch.load(FILE, weights_only=True)) into "
        f"{file}, then remove FILE), see docs/trainers/accelerate.md"
    )
