"""Exact resume of a :class:`~shardio.ShardDataset` under PyTorch Lightning: :class:`ShardioCallback`.

What Lightning does on its own (read in its 2.6 source, checked by ``tests/integrations/test_lightning.py``):

- it saves a loader's state only when the object ``train_dataloader()`` returns has ``state_dict`` and
  ``load_state_dict``; a plain ``DataLoader`` saves nothing, so a resumed run restarts the epoch at batch 0;
- it calls ``set_epoch`` on a loader's sampler only, never on an IterableDataset, so the dataset never
  hears which epoch Lightning is in (a fresh run still trains epoch e's plan in epoch e: one ``iter()`` per
  epoch, each playing the next epoch; a resumed process's dataset starts at epoch 0);
- it calls ``iter()`` on the train loader inside ``FitLoop.setup_data()``, right after
  ``train_dataloader()``, before ``on_train_start`` and before the first ``on_train_epoch_start``; later
  epochs call ``iter()`` after ``on_train_epoch_start`` (with ``reload_dataloaders_every_n_epochs``, the new
  loader's ``setup_data`` ``iter()`` too, whose workers begin the epoch before Lightning drops them);
  callbacks' ``load_state_dict`` runs before
  ``train_dataloader()``; a run resumed from a checkpoint taken after an epoch's last batch (but before the
  epoch end) uses that first iterator for the next epoch (Lightning 2.4, which NeMo 3.0 installs, asks it
  for one more batch of the checkpoint's epoch first, so there the dataset stays at that epoch's end);
- it takes the epoch length from ``len(loader)`` once, when it builds the loader, and ends every epoch
  there (a shardio epoch's length varies with duration batching and after a resume on another world size);
- it prefetches a batch (so a loader's own position is past the batch being trained on) only for loaders
  without a length; and with a ``StatefulDataLoader`` it restores the loader's own state, which was not
  exact in every configuration (with 0 workers, the epoch after the resumed one replayed the resumed rest).

So the callback takes the state from the batch that was trained on (``state_after(batch)`` in
``on_train_batch_end``, which runs before ``ModelCheckpoint`` saves), keeps it in the checkpoint as its
own state, and applies a loaded state when ``train_dataloader()`` hands it the new dataset
(:meth:`ShardioCallback.attach`), the only moment between the restore and the first ``iter()``.

Two of Lightning's warnings say the opposite of what the callback guarantees, so it silences them (those two
messages only, and only once it holds what makes them wrong): "Your `IterableDataset` has `__len__` defined"
(a ShardDataset's length is this rank's exact batch count, with any worker count: silenced from
:meth:`attach`) and "... your dataloader is not resumable. This can cause unreliable results" (the callback
resumes it exactly: silenced when a checkpoint holding its state is loaded). Without the
callback both still appear.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ..datasets.checks import check_accumulation
from ..datasets.dataset import ShardDataset
from ..errors import StateError, shown
from ..state import LoaderState, batch_position, check_follows
from ._extras import require

__all__ = ["ShardioCallback"]

logger = logging.getLogger(__name__)

# Subclassing the Callback of every Lightning installed makes the callback fit either package's Trainer.
_LENGTH_WARNING = r"Your `IterableDataset` has `__len__` defined"
_RESUME_WARNING = (
    r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is not"
)

_BASES = tuple(module.Callback for module in require("lightning", "lightning.pytorch", "pytorch_lightning"))


class ShardioCallback(*_BASES):  # type: ignore[misc]  # the bases are found at import time
    """Sets the epoch, saves the loader state after each trained batch in checkpoints, and restores it.

    Give the callback to the ``Trainer`` and pass each dataset through :meth:`attach` when
    ``train_dataloader()`` builds it (or give the dataset here when it is built once)::

        resume = ShardioCallback()
        trainer = Trainer(callbacks=[resume, ModelCheckpoint(...)], ...)

        def train_dataloader(self):
            return DataLoader(resume.attach(ShardDataset(...)), batch_size=None, num_workers=2)

    A run resumed from any checkpoint (mid-epoch or at an epoch end) then trains on exactly the batches
    the uninterrupted run trained on after it: with any worker count, persistent workers, DDP, a plain
    ``DataLoader`` or torchdata's ``StatefulDataLoader`` (whose own state it replaces).
    On another number of ranks every sample not yet trained on in the epoch is trained on exactly once.

    Args:
        dataset: The dataset, when it is built once (default: none; give each to `attach`).

    Raises:
        TypeError: A dataset that is not a `ShardDataset`.
    """

    def __init__(self, dataset: ShardDataset | None = None) -> None:
        super().__init__()
        if dataset is not None and not isinstance(dataset, ShardDataset):
            raise TypeError(
                f"ShardioCallback takes a ShardDataset (or none, then attach), not {type(dataset).__name__}"
            )
        self._dataset = dataset
        if dataset is not None:
            warnings.filterwarnings("ignore", message=_LENGTH_WARNING)  # its length is exact (module docs)
        self._state: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None
        self._trainer: Any = None
        self._restored = False  # a checkpoint gave this fit a shardio state
        self._rest: int | None = None  # batches the resumed epoch's iterator yields (a state loaded)
        self._first = True  # the fit's first batch is yet to come

    @property
    def state(self) -> dict[str, Any] | None:
        """The loader state after the last batch trained on (what the next checkpoint saves)."""
        return self._state

    def attach(self, dataset: ShardDataset) -> ShardDataset:
        """Register the dataset `train_dataloader()` builds: a loaded checkpoint's state applies to it, or
        else the trainer's current epoch.

        Args:
            dataset: The dataset just built.

        Returns:
            `dataset`, to hand to the `DataLoader`.

        Raises:
            TypeError: A dataset that is not a `ShardDataset`.
        """
        if not isinstance(dataset, ShardDataset):
            raise TypeError(f"ShardioCallback.attach takes a ShardDataset, not {type(dataset).__name__}")
        self._dataset = dataset
        warnings.filterwarnings(
            "ignore", message=_LENGTH_WARNING
        )  # its length is exact (see the module docs)
        if self._pending is not None:
            dataset.load_state_dict(self._pending)
            self._pending = None
            position, length = LoaderState.from_dict(dataset.state_dict()).position, len(dataset)
            at_end = position >= length
            self._rest = None if at_end else length - position
            if at_end and not _reruns_the_last_batch(self._trainer):
                # Lightning resumes a checkpoint taken after an epoch's last batch with that first iterator
                # as the next epoch's: so it must already be the next epoch.
                dataset.set_epoch(dataset.epoch + 1)
        elif self._trainer is not None:
            dataset.set_epoch(_epoch_to_train(self._trainer))
        return dataset

    # -- Lightning hooks ---------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer  # called before Lightning restores a checkpoint
        self._restored, self._first = False, True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._pending is not None:
            raise StateError(
                "the checkpoint holds a shardio loader state that no dataset received: pass the "
                "dataset through ShardioCallback.attach() in train_dataloader(), or the epoch "
                "would restart at its first batch"
            )
        if self._dataset is None:  # a fresh run may do without attach(): epoch 0 needs nothing set
            found = getattr(trainer.train_dataloader, "dataset", None) if trainer is not None else None
            if not isinstance(found, ShardDataset):
                raise StateError(
                    "ShardioCallback found no ShardDataset: pass it through attach() in train_dataloader()"
                )
            self._dataset = found
        if trainer is not None:
            check_accumulation(
                self._dataset, trainer.accumulate_grad_batches, "Trainer(accumulate_grad_batches)"
            )
            self._fit_resumed_epoch(trainer)

    def _fit_resumed_epoch(self, trainer: Any, batch_idx: int | None = None) -> None:
        """End a resumed epoch where its iterator ends. Lightning counts the resumed epoch's batches on from
        the checkpoint's count and ends it at ``len(loader)`` (its ``max_batches``, and its data fetcher's
        length, whose count it also starts there): the same world's whole epoch, but after a resume on
        another number of ranks the dataset plays the rest of the epoch as a segment of its own, whose length
        leaves out what was trained before (2 ranks resumed on 1: 2 batches trained, then Lightning ended the
        rank's 5-batch segment after 3). Called at ``on_train_start`` (the count as the checkpoint left
        it, before the first fetch) and again at the fit's first batch (``batch_idx``: Lightning's count
        before it; 2.4 counts a batch saved in ``on_train_batch_end`` as not completed, and resets
        ``max_batches`` in between)."""
        rest, loop, limit = self._rest, trainer.fit_loop, trainer.limit_train_batches
        whole = isinstance(limit, float) and limit == 1.0
        if rest is None or self._dataset is None or not (whole or type(limit) is int):
            return  # no state loaded, or a fraction of the epoch asked for
        if batch_idx is not None:
            self._rest = None
        fetcher: Any = getattr(loop, "_data_fetcher", None)  # Lightning 2.x: made by setup_data, before
        counted = loop.epoch_loop.batch_progress.current.ready if batch_idx is None else batch_idx
        end = counted + rest if whole else min(counted + rest, limit)  # an int limit: at most that many
        if end <= loop.max_batches or getattr(fetcher, "length", None) is None:
            return  # the same world (or the limit ends the epoch there), or no length to end it at
        if not isinstance(fetcher.length, int) or not isinstance(fetcher.fetched, int):
            raise StateError(
                f"this Lightning would end the resumed epoch after {loop.max_batches - counted} of the "
                f"{rest} batches left on this number of ranks, and the callback cannot change where: resume "
                "on the checkpoint's number of ranks, or from a checkpoint at an epoch's end"
            )
        loop.max_batches = end
        # the fetcher counts the batch just fetched (at the first batch), or will count from the checkpoint's
        fetcher.length = (fetcher.fetched - 1 if batch_idx is not None else counted) + end - counted

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Called for every epoch but a resumed one, before that epoch's iter() (but after epoch 0's).
        if self._dataset is None:
            return
        if _iterates_again(trainer):
            if getattr(trainer.fit_loop, "_last_train_dl_reload_epoch", None) == trainer.current_epoch:
                # reloaded: setup_data's iter() of the new loader has started workers that begin this epoch
                # (some maybe only after the set_epoch below) and that Lightning drops for its next iter()
                _stop_workers(trainer)
            self._dataset.set_epoch(trainer.current_epoch)
        elif self._dataset.epoch != trainer.current_epoch:
            self._dataset.set_epoch(trainer.current_epoch)
        # Lightning takes the epoch length from len(loader) once, when it builds the loader (max_batches, and
        # the CombinedLoader's limits), and ends every epoch there; a shardio epoch's length varies (duration
        # batching; the rest of an epoch resumed on another world size): a longer epoch would be cut short.
        length, limit = len(self._dataset), trainer.limit_train_batches
        wanted = (
            min(length, limit) if isinstance(limit, int) else int(length * limit)
        )  # as Lightning limits it
        if trainer.fit_loop.max_batches != wanted:
            combined = getattr(trainer.fit_loop, "_combined_loader", None)  # Lightning 2.x
            if combined is not None:  # else its length is len(loader), read again at each iter()
                combined.limits = None if wanted == length else [wanted]
            trainer.fit_loop.max_batches = wanted

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._first:
            return
        self._first = False
        self._fit_resumed_epoch(trainer, batch_idx)
        if self._restored or trainer.ckpt_path is None or not isinstance(batch, dict):
            return
        # resumed from a checkpoint without a shardio state: the dataset is where attach() left it
        epoch, index = batch_position(batch)
        if (epoch, index) != (trainer.current_epoch, batch_idx):
            raise StateError(
                f"the checkpoint {shown(str(trainer.ckpt_path), 200)} holds no shardio loader state "
                "(saved without ShardioCallback, or its entry is empty): Lightning resumes epoch "
                f"{trainer.current_epoch} at its batch {batch_idx}, the dataset would train epoch {epoch} "
                f"from batch {index} (batches trained before the checkpoint again, later ones never); "
                "resume from a checkpoint saved with ShardioCallback"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._dataset is None:
            raise StateError("ShardioCallback has no dataset: pass it through attach() in train_dataloader()")
        if not isinstance(batch, dict):
            raise StateError(
                f"ShardioCallback needs the batches ShardDataset yields (dicts with 'epoch' and "
                f"'batch_index'), got a {type(batch).__name__}"
            )
        state = self._dataset.state_after(batch)
        check_follows(self._state, state)
        self._state = state

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Lightning would restore a StatefulDataLoader's own state after attach(): this one replaces it.
        loop: Any = checkpoint
        for key in ("loops", "fit_loop", "state_dict"):
            loop = loop.get(key) if isinstance(loop, dict) else None
        if (
            self._has_state(checkpoint)
            and isinstance(loop, dict)
            and loop.pop("combined_loader", None) is not None
        ):
            logger.info("using ShardioCallback's loader state instead of the loader's own")

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self._state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        loader = state_dict.get("loader") if isinstance(state_dict, dict) else ()
        if loader is not None and not isinstance(loader, dict):
            raise StateError(
                f"the checkpoint's ShardioCallback entry is not {{'loader': a shardio state}}: "
                f"{shown(state_dict)}"
            )
        self._state = self._pending = loader
        self._restored = loader is not None
        if self._pending is not None:  # this resume is exact: Lightning's warning that it may not be is wrong
            warnings.filterwarnings("ignore", message=_RESUME_WARNING)

    def _has_state(self, checkpoint: dict[str, Any]) -> bool:
        callbacks = checkpoint.get("callbacks")
        entry = callbacks.get(self.state_key) if isinstance(callbacks, dict) else None
        return isinstance(entry, dict) and entry.get("loader") is not None


def _epoch_to_train(trainer: Any) -> int:
    """The epoch Lightning trains after ``setup_data``: ``current_epoch`` counts completed epochs, which a
    checkpoint saved in ``on_train_epoch_end`` (the epoch processed, not yet completed) is one short of."""
    progress = getattr(getattr(trainer.fit_loop, "epoch_progress", None), "current", None)
    processed = getattr(progress, "processed", None)
    return max(trainer.current_epoch, processed) if type(processed) is int else trainer.current_epoch


def _reruns_the_last_batch(trainer: Any) -> bool:
    """Whether Lightning restores a checkpoint saved in ``on_train_batch_end`` as if its batch had not been
    completed (2.4, the version NeMo 3.0 installs: its epoch loop has no ``restarted_on_train_batch_end``): it
    then asks the first iterator for one more batch of the checkpoint's epoch, which a dataset at that epoch's
    end answers with none, and starts the next epoch with a new ``iter()`` after ``on_train_epoch_start``."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return loop is not None and not hasattr(loop, "restarted_on_train_batch_end")


def _iterates_again(trainer: Any) -> bool:
    """Whether Lightning's epoch loop calls ``iter()`` on the train loader after ``on_train_epoch_start`` (the
    condition of ``TrainingEpochLoop.on_run_start`` in 2.6: every epoch after the first, unless resuming)."""
    fit_loop = trainer.fit_loop
    return bool(
        trainer.current_epoch > 0
        and not getattr(fit_loop, "is_resuming", False)
        and not fit_loop.epoch_loop.restarting
    )


def _stop_workers(trainer: Any) -> None:
    """Shut down (and join) the workers of the train loader's current iterator; the next
    ``iter()`` starts new."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    for iterator in getattr(getattr(combined, "_iterator", None), "iterators", []):
        if hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
    if combined is not None:
        combined.reset()  # Lightning's own: drops the iterators (and a persistent loader's)
