"""Exact resume of a :class:`~shardio.ShardDataset` under SpeechBrain's ``Brain.fit``: :func:`track`.

What SpeechBrain does on its own (read in its 1.1.2 source, ``speechbrain/core.py``,
``speechbrain/utils/checkpoints.py``, ``speechbrain/dataio/dataloader.py``; checked by
``tests/integrations/test_speechbrain.py``):

- ``Brain.fit`` builds the train loader first (``make_dataloader``, unless it is handed a ``DataLoader``),
  then calls ``on_fit_start()``, which wraps the modules in DDP, makes the optimizers and runs
  ``checkpointer.recover_if_possible()``; only then does each epoch's ``_fit_train`` call ``iter()`` on the
  loader. So every recoverable is loaded before the first ``iter()``, and DataLoader workers (persistent or
  not) start after it.
- The position it saves is a ``SaveableDataLoader``'s, which counts batches of a map-style dataset to skip;
  over an ``IterableDataset`` it saves nothing (it logs a warning) and under DDP it only warns that it
  "cannot automatically solve distributed sampling": a resumed epoch restarts at its first batch.
- Before each epoch's ``iter()``, ``_fit_train`` calls ``set_epoch(epoch)`` on ``brain.train_sampler`` (the
  documented place for a loader that ``fit`` is handed); nothing tells an ``IterableDataset`` the epoch.
  ``EpochCounter`` counts epochs from 1 and, recovered from an intra-epoch checkpoint, plays that epoch again.
- A batch counts as trained when ``fit_batch`` returns: ``on_fit_batch_end`` runs inside it after the
  optimizer step; then ``_fit_train`` may save an intra-epoch checkpoint (``ckpt_interval_steps`` /
  ``ckpt_interval_minutes``, the decision broadcast from rank 0) before it asks the loader for the next batch.
- ``Checkpointer.save_checkpoint`` runs every save hook in every process; hooks registered with
  ``register_checkpoint_hooks`` run on rank 0 only. Load hooks run in every process, from the one directory.

So :class:`LoaderProgress` is a recoverable: it takes the state from each batch trained on
(``state_after(batch)``, called from ``on_fit_batch_end``), rank 0 saves it as JSON in the checkpoint (every
rank has the same number of batches, so rank 0's state restores every rank), and its loader hands it to the
dataset when ``recover_if_possible`` runs, before the first ``iter()``. As ``brain.train_sampler`` it sets the
dataset's epoch: SpeechBrain's epoch ``e`` (from 1) plays the dataset's epoch ``e - 1``.

SpeechBrain also keeps a count of its own: the Brain's ``step``, the batches trained in the epoch, saved in
the checkpoint (its ``brain`` recoverable, loaded after this one) and restored as it was, by which
``fit_batch`` decides each optimizer step (``step % grad_accumulation_factor == 0``). Counted on the world
that saved it, it splits the steps of another world: a checkpoint of 2 ranks x 2 batches a step at step 3
(``step`` 6) went on on 1 rank x 4 with a step of 2 batches, off the straight run's steps to the epoch's end,
whose last 2 batches' gradients the epoch's end then threw away; and a checkpoint at an epoch's end (``step``
its length, 14) shifted every step of the next epoch alike. So at each epoch's start
:meth:`LoaderProgress.set_epoch` sets the Brain's ``step`` to the batches this rank has trained on in the
epoch, counted on its own world (with ``Batching(step_batches=K)``: the state's optimizer step times
``grad_accumulation_factor``; 0 for an epoch not begun).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..datasets.checks import check_accumulation
from ..datasets.dataset import ShardDataset
from ..errors import OptionError, StateError, shown
from ..ledger.rebuild import read_state
from ..state import LoaderState, check_follows
from ._extras import require

__all__ = ["LoaderProgress", "track"]

try:
    (_checkpoints,) = require("speechbrain", "speechbrain.utils.checkpoints")
except OSError as exc:  # SpeechBrain imports torchaudio, whose C++ extension is built for one torch
    raise ImportError(
        f"shardio's speechbrain integration needs speechbrain, which imports torchaudio, and the "
        f"torchaudio installed does not load against this torch: install its build for this torch "
        f"({exc})"
    ) from exc


@_checkpoints.register_checkpoint_hooks
class LoaderProgress:
    """The loader state after the last batch trained on: a SpeechBrain recoverable, and the train sampler
    whose ``set_epoch`` ``Brain.fit`` calls before each epoch.

    Made and registered by :func:`track`. Call :meth:`update` with each batch in the Brain's
    ``on_fit_batch_end``.

    Args:
        dataset: The dataset the Brain trains on.
        brain: The Brain, whose batch count of the epoch (``step``) :meth:`set_epoch` sets (``track`` gives
            it); ``None`` leaves it alone.

    Raises:
        TypeError: A dataset that is not a ``ShardDataset``.
    """

    def __init__(self, dataset: ShardDataset, brain: Any = None) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError(f"LoaderProgress takes a ShardDataset, not {type(dataset).__name__}")
        self.dataset = dataset
        self.brain = brain
        self._state: dict[str, Any] | None = None
        self._epoch_set = False

    @property
    def state(self) -> dict[str, Any] | None:
        """The loader state after the last batch trained on (what the next checkpoint saves)."""
        return self._state

    def set_epoch(self, epoch: int) -> None:
        """Start SpeechBrain's epoch ``epoch`` (counted from 1): the dataset's epoch ``epoch - 1``, kept where
        a recovered state continues it; the Brain's ``step`` becomes the batches this rank has trained on in
        it, counted on this world (by which SpeechBrain decides its optimizer steps).

        Args:
            epoch: SpeechBrain's epoch, from 1.

        Raises:
            OptionError: ``epoch`` is not an integer of at least 1.
        """
        if type(epoch) is not int or epoch < 1:
            raise OptionError(f"SpeechBrain's epochs count from 1 (its EpochCounter); got epoch {epoch!r}")
        self.dataset.set_epoch(epoch - 1)
        self._epoch_set = True
        if self.brain is not None:
            self.brain.step = self._batches_in_epoch()

    def _batches_in_epoch(self) -> int:
        """The batches per rank trained on in the epoch the dataset stands at, counted on this world: with
        steps, the state's optimizer step times the accumulation (earlier segments on other worlds
        counted in this world's steps), else the current segment's start."""
        state = LoaderState.from_dict(self.dataset.state_dict())
        state = state.at(state.start)
        accumulation = self.dataset.accumulation
        step = state.step
        if accumulation is None or step is None:
            return state.position
        return step[0] * accumulation + step[1]

    def update(self, batch: dict[str, Any]) -> None:
        """Record that a batch has been trained on, after every batch before it.

        Args:
            batch: A batch the dataset yielded.

        Raises:
            StateError: ``Brain.fit`` did not call :meth:`set_epoch` (``brain.train_sampler`` was replaced),
                or the batch is not the one after the last (a loader handing batches over out of order).
        """
        if not self._epoch_set:
            raise StateError(
                "Brain.fit did not call LoaderProgress.set_epoch before this batch: keep "
                "brain.train_sampler the LoaderProgress that track() set, and hand fit() the "
                "loader (or the dataset without shuffle or a sampler)"
            )
        state = self.dataset.state_after(batch)
        check_follows(self._state, state)
        self._state = state

    @_checkpoints.mark_as_saver
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state after the last batch trained on (or where the dataset stands) as JSON.

        Args:
            path: The file SpeechBrain's checkpointer names.
        """
        state = self._state if self._state is not None else self.dataset.state_dict()
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(state, handle)

    @_checkpoints.mark_as_loader
    def load(self, path: str | os.PathLike[str], end_of_epoch: bool = True) -> None:
        """Continue from a JSON state: the next iteration of the dataset starts after its batch.

        Args:
            path: The file a `save` wrote.
            end_of_epoch: SpeechBrain's flag; unused: the state says where the epoch stands.

        Raises:
            StateError: the file is not a JSON loader state, or its state does not fit the dataset.
        """
        del end_of_epoch
        state = read_state(os.fspath(path))
        self.dataset.load_state_dict(state)
        self._state = state


def track(brain: Any, dataset: ShardDataset, *, name: str = "shardio_loader") -> LoaderProgress:
    """Register ``dataset``'s progress with ``brain``'s checkpointer, as the recoverable ``name``, and as
    ``brain.train_sampler`` (``Brain.fit`` calls its ``set_epoch`` before each epoch).

    Call it after making the Brain (and so after ``ddp_init_group``) and before ``fit``; hand ``fit`` a
    ``DataLoader(dataset, batch_size=None, ...)`` or the dataset itself with such ``train_loader_kwargs``.

    Args:
        brain: the ``speechbrain.core.Brain`` that trains on ``dataset``, made with a checkpointer.
        dataset: the :class:`~shardio.ShardDataset` (or :class:`~shardio.MixedDataset`) it trains on.
        name: the recoverable's name in the checkpointer (its file in each checkpoint).

    Returns:
        The :class:`LoaderProgress`: call its :meth:`~LoaderProgress.update` in ``on_fit_batch_end``.

    Raises:
        OptionError: ``dataset`` is not a ShardDataset, ``name`` holds ``dataloader``, the Brain has no
            checkpointer or already a train sampler, the dataset plans for other ranks than the Brain's
            process group, or the Brain's ``grad_accumulation_factor`` is not the dataset's
            ``accumulation`` (with ``step_batches``).
    """
    if not isinstance(dataset, ShardDataset):
        raise OptionError(f"track takes a ShardDataset, not {type(dataset).__name__}")
    if not isinstance(name, str) or "dataloader" in name:
        raise OptionError(
            f"track's name {shown(name)}: SpeechBrain's Checkpointer loads a checkpoint that lacks a "
            "recoverable whose name holds 'dataloader' with a warning only, and the epoch would restart: "
            "name it otherwise"
        )
    checkpointer = getattr(brain, "checkpointer", None)
    if checkpointer is None:
        raise OptionError(
            "the Brain has no checkpointer: make it with checkpointer=Checkpointer(...), or there "
            "is nothing to resume from"
        )
    if getattr(brain, "train_sampler", None) is not None:
        raise OptionError(
            f"the Brain already has a train_sampler ({type(brain.train_sampler).__name__}): a "
            "ShardDataset plans its own order, and the LoaderProgress must be the train_sampler "
            "for Brain.fit to tell it the epoch"
        )
    world, rank, world_size = dataset.ranks(), *_process_group()
    if (world.rank, world.world_size) != (rank, world_size):
        raise OptionError(
            f"the dataset plans for rank {world.rank} of {world.world_size}, the Brain runs "
            f"rank {rank} of {world_size}: build the dataset after ddp_init_group (or give it "
            f"World({rank}, {world_size}))"
        )
    check_accumulation(dataset, getattr(brain, "grad_accumulation_factor", 1), "grad_accumulation_factor")
    progress = LoaderProgress(dataset, brain)
    checkpointer.add_recoverable(name, progress)
    brain.train_sampler = progress
    return progress


def _process_group() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
