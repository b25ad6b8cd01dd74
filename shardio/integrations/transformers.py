"""Exact resume of a :class:`~shardio.ShardDataset` under HF Transformers: :class:`ShardioTrainer`.

What the ``Trainer`` does on its own (read in transformers 5.23's ``trainer.py``, checked by
``tests/integrations/test_transformers.py``):

- ``get_train_dataloader`` -> ``_get_dataloader`` wraps the dataset in a ``DataLoader`` of
  ``per_device_train_batch_size`` and hands it to ``accelerator.prepare``, which for an IterableDataset
  dispatches: the main process iterates (its rank's share of a ShardDataset only) and sends slices of its
  batches to every rank; on two processes the first step failed (padded batches of different sizes);
- ``set_initial_training_values`` reads ``len(loader)`` once: the steps of every epoch, and ``max_steps``;
- on ``resume_from_checkpoint`` (``_init_training_state``) it takes the epoch as ``global_step //
  steps_per_epoch`` and the batches to skip as the remainder; ``_run_epoch`` then iterates the loader from
  the epoch's start through Accelerate's ``skip_first_batches``, reading and throwing away every batch
  already trained on (O(position)); ``ignore_data_skip`` restarts the epoch at its first batch instead;
- it saves the ``TrainerState`` (``trainer_state.json``, with the ``state()`` of every callback that is an
  ``ExportableState``) from the main process, in the same call that writes the checkpoint folder
  (``_save_checkpoint``); ``on_save`` callbacks run only after it, and are not told the folder.

So :class:`ShardioTrainer` (and :class:`ShardioSeq2SeqTrainer`) builds a plain ``DataLoader`` over the
dataset, never prepared: each rank reads its own share. It records ``state_after(batch)`` of every batch
it hands the training loop, keeps it in ``trainer_state.json`` through a callback of its own (so it is
written with the step it belongs to), loads it into the dataset on ``train(resume_from_checkpoint=...)``
before the loader's first ``iter()``, resumes the epoch the state names (not ``global_step``'s quotient),
passes the Trainer no batches to skip, and gives ``_run_epoch`` each epoch's real length: a shardio epoch's
length varies with duration batching, and after a resume on another world size. A Trainer subclass rather
than a callback: the epoch and the skip are decided in ``_init_training_state`` and ``_run_epoch``, which no
callback reaches.
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from ..datasets.checks import check_accumulation
from ..datasets.dataset import ShardDataset
from ..errors import OptionError
from ..state import LoaderState, check_follows
from ._extras import require
from .trainerstate import loader_state_in

__all__ = ["ShardioLoaderState", "ShardioSeq2SeqTrainer", "ShardioTrainer"]

logger = logging.getLogger(__name__)

_transformers = require("transformers", "transformers")[0]
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import get_last_checkpoint

_HOOKS = {
    "_init_training_state": ("resume_from_checkpoint",),
    "_run_epoch": (
        "steps_in_epoch",
        "num_update_steps_per_epoch",
        "steps_trained_in_current_epoch",
        "epochs_trained",
    ),
    "set_initial_training_values": ("dataloader",),
}
for _name, _parameters in _HOOKS.items():
    _found = getattr(Trainer, _name, None)
    if _found is None or not set(_parameters) <= set(inspect.signature(_found).parameters):
        raise ImportError(
            f"shardio's transformers integration needs transformers 5.x's Trainer.{_name} (tested "
            f"with 5.23); transformers {_transformers.__version__} differs: pip install "
            "'shardio[transformers]'"
        )


def _unchanged(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


class _Positioned:
    """The loader's ``collate_fn``: the batch's position, and the model inputs ``collate`` makes of it."""

    def __init__(self, collate: Callable[[dict[str, Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        position = {"epoch": batch["epoch"], "batch_index": batch["batch_index"]}
        return position, self.collate(batch)


class _EpochLoader(DataLoader):
    """A ``DataLoader`` (``batch_size=None``) that knows the state after each batch it has handed over."""

    def __init__(
        self, dataset: ShardDataset, collate: Callable[[dict[str, Any]], Any], **options: Any
    ) -> None:
        super().__init__(
            dataset,
            batch_size=None,
            collate_fn=_Positioned(collate),  # type: ignore[arg-type]
            **options,
        )
        self.shards = dataset
        self.state: dict[str, Any] | None = None
        self.epoch_start, self.epoch_length, self.handed = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` next (a state just loaded for it is kept); called by the Trainer before
        ``iter()``."""
        self.shards.set_epoch(epoch)
        self.epoch_start = LoaderState.from_dict(self.shards.state_dict()).start
        self.epoch_length, self.handed = len(self.shards), 0

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Any:
        for position, inputs in super().__iter__():
            state = self.shards.state_after(position)
            check_follows(self.state, state)
            self.state, self.handed = state, self.handed + 1
            yield inputs


def _fraction(state: LoaderState, loader: _EpochLoader) -> float:
    """The fraction of its epoch that ``state`` (the loader's, after its last batch) has trained: with steps,
    in optimizer steps, those of segments played on other worlds included (resumed on another world, the
    current segment is only the epoch's rest); else in this segment's batches."""
    accumulation = loader.shards.accumulation
    step = state.step
    if accumulation is None or step is None:
        return (loader.epoch_start + loader.handed) / loader.epoch_length
    earlier = step[0] - state.position // accumulation  # the steps of the segments before this one
    return (step[0] + step[1] / accumulation) / (earlier + loader.epoch_length / accumulation)


class ShardioLoaderState(TrainerCallback, ExportableState):
    """Keeps the loader state in ``trainer_state.json`` (added by :class:`ShardioTrainer` itself).

    The Trainer writes every ``ExportableState`` callback's :meth:`state` into the checkpoint's
    ``trainer_state.json``, next to the ``global_step`` it belongs to. The loader comes from the Trainer's
    events, so a copy made by ``restore_callback_states_from_checkpoint`` works as well as the original.
    """

    def __init__(self) -> None:
        self._loader: _EpochLoader | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if not isinstance(loader, _EpochLoader):
            raise OptionError(
                f"ShardioTrainer trains on the loader its get_train_dataloader() builds, not a "
                f"{type(loader).__name__}: do not override get_train_dataloader"
            )
        self._loader = loader

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = self._loader
        if loader is not None and loader.state is not None and loader.epoch_length:
            # the Trainer counts the epoch's fraction from the batches of this call alone
            loaded = LoaderState.from_dict(loader.state)
            state.epoch = loaded.epoch + _fraction(loaded, loader)

    def state(self) -> dict[str, Any]:
        loader_state = self._loader.state if self._loader is not None else None
        return {"args": {}, "attributes": {"loader_state": loader_state}}


class _ShardioTraining:
    """The overrides :class:`ShardioTrainer` and :class:`ShardioSeq2SeqTrainer` share."""

    args: Any  # the Trainer's
    state: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dataset = kwargs.get("train_dataset")
        if dataset is not None and not isinstance(dataset, ShardDataset):
            raise OptionError(
                f"{type(self).__name__} trains on a ShardDataset (or MixedDataset), not a "
                f"{type(dataset).__name__}"
            )
        self._shardio_collate = kwargs.get("data_collator") or _unchanged
        kwargs["data_collator"] = self._shardio_collate
        kwargs["callbacks"] = [ShardioLoaderState(), *(kwargs.get("callbacks") or [])]
        self._shardio_pending: dict[str, Any] | None = None
        self._shardio_resumed_epoch: int | None = None
        super().__init__(*args, **kwargs)
        if self.args.ignore_data_skip:
            logger.warning(
                "%s resumes the loader where the checkpoint left it: ignore_data_skip has no effect",
                type(self).__name__,
            )

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """Train, or resume exactly: ``resume_from_checkpoint`` (a folder, or ``True`` for the last one in
        ``output_dir``) restores the model, optimizer, scheduler and RNG as the Trainer does, and the loader
        at the batch after the last one trained on; nothing is read twice or skipped.

        Raises:
            StateError: the checkpoint holds no shardio loader state (not saved by a ShardioTrainer), or a
                ``trainer_state.json`` the Trainer could not load (``loader_state_in``).
        """
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        self._shardio_pending = None
        if resume_from_checkpoint:
            self._shardio_pending = loader_state_in(str(resume_from_checkpoint))
        try:
            return super().train(resume_from_checkpoint or None, *args, **kwargs)  # type: ignore[misc]
        finally:
            self._shardio_pending = None  # kept until then: auto_find_batch_size builds the loader again

    def get_train_dataloader(self) -> DataLoader:
        """A plain ``DataLoader`` over the ShardDataset (``batch_size=None``: it batches itself; not prepared
        by Accelerate: each rank reads its own share), with ``data_collator`` applied to each batch in the
        workers, the ``dataloader_*`` arguments of ``TrainingArguments`` and a loaded checkpoint's state."""
        dataset, args = self.train_dataset, self.args  # type: ignore[attr-defined]
        if not isinstance(dataset, ShardDataset):
            raise OptionError("ShardioTrainer needs train_dataset=a ShardDataset")
        world = dataset.ranks()
        if (world.rank, world.world_size) != (args.process_index, args.world_size):
            raise OptionError(
                f"the dataset plans for rank {world.rank} of {world.world_size}, the Trainer runs "
                f"process {args.process_index} of {args.world_size}: build the dataset in the "
                "launched process (torchrun sets RANK and WORLD_SIZE), or give it "
                "World(args.process_index, args.world_size)"
            )
        check_accumulation(
            dataset, args.gradient_accumulation_steps, "TrainingArguments(gradient_accumulation_steps)"
        )
        if not args.dataloader_in_order:
            raise OptionError(
                "dataloader_in_order=False hands batches over out of plan order: no saved state "
                "could say which were trained on"
            )
        self._shardio_resumed_epoch = None
        if self._shardio_pending is not None:
            dataset.load_state_dict(self._shardio_pending)
            loaded = LoaderState.from_dict(dataset.state_dict())
            self._shardio_resumed_epoch = loaded.epoch + (loaded.position >= len(dataset))
        options: dict[str, Any] = {
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
        }
        if args.dataloader_num_workers:
            options.update(
                persistent_workers=args.dataloader_persistent_workers,
                prefetch_factor=args.dataloader_prefetch_factor,
                multiprocessing_context=args.dataloader_multiprocessing_context,
            )
        loader = _EpochLoader(dataset, self._shardio_collate, **options)
        loader.state = self._shardio_pending  # the first batch must follow it
        return loader

    def set_initial_training_values(self, args: Any, dataloader: Any) -> Any:
        values = list(super().set_initial_training_values(args, dataloader))  # type: ignore[misc]
        if (
            args.max_steps > 0
        ):  # stop at max_steps, whatever the epochs' lengths (the first one's estimated it)
            values[0] = sys.maxsize
        return tuple(values)

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        epochs, _ = super()._init_training_state(*args, **kwargs)  # type: ignore[misc]
        if self._shardio_resumed_epoch is not None:
            epochs = self._shardio_resumed_epoch
        return epochs, 0  # no batch to skip: the dataset starts after the last one trained on

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        loader = kwargs["train_dataloader"]
        loader.set_epoch(kwargs["epoch"])
        rest = loader.epoch_length - loader.epoch_start
        accumulation = self.args.gradient_accumulation_steps
        updates = max(math.ceil(rest / accumulation), 1)
        if self.args.max_steps <= 0:
            self._plan_steps(kwargs["epoch"], loader, updates)
        kwargs.update(
            steps_in_epoch=rest, num_update_steps_per_epoch=updates, steps_trained_in_current_epoch=0
        )
        return super()._run_epoch(*args, **kwargs)  # type: ignore[misc]

    def _plan_steps(self, epoch: int, loader: _EpochLoader, updates: int) -> None:
        """Epochs decide (``num_train_epochs``): the Trainer stops at ``state.max_steps``, which it took from
        the first epoch's length; set it from this epoch's (and this one's for the epochs after), so that no
        epoch is cut short nor a step trained past the last epoch's end (a fractional last epoch: its
        share)."""
        whole = max(math.ceil(loader.epoch_length / self.args.gradient_accumulation_steps), 1)
        epochs = self.args.num_train_epochs
        later = max(math.ceil(epochs) - epoch - 1, 0)
        if epoch + 1 > epochs:  # the last epoch's fraction
            updates = max(math.ceil((epochs - epoch) * whole) - (whole - updates), 1)
        self.state.max_steps = self.state.global_step + updates + later * whole


class ShardioTrainer(_ShardioTraining, Trainer):
    """A ``Trainer`` over a :class:`~shardio.ShardDataset` that resumes exactly, with ``data_collator``
    turning each shardio batch into the model's inputs (default: the batch unchanged)::

        trainer = ShardioTrainer(model=model, args=TrainingArguments(output_dir="out", save_steps=1000),
                                 train_dataset=ShardDataset("data/", max_duration=200.0),
                                 data_collator=to_model_inputs)
        trainer.train(resume_from_checkpoint=True)      # or a checkpoint folder; nothing for a fresh run

    Every checkpoint holds the loader state after its last step; a run resumed from it trains on exactly
    the batches, per rank, of the uninterrupted run after it (any ``dataloader_num_workers``, persistent or
    not, gradient accumulation), without reading the batches before it. On another number of ranks every
    sample not yet trained on in the epoch is trained on once. Epochs (``num_train_epochs``) end at the
    dataset's end, each with its own length; ``max_steps`` stops at that step.

    Raises:
        OptionError: ``train_dataset`` is not a ShardDataset, plans for other ranks than the Trainer's,
            ``dataloader_in_order=False``, or ``gradient_accumulation_steps`` is not the dataset's
            ``accumulation`` (with ``Batching(step_batches=...)``).
        StateError: the checkpoint holds no shardio loader state, or one that does not fit the dataset.
    """


class ShardioSeq2SeqTrainer(_ShardioTraining, Seq2SeqTrainer):
    """:class:`ShardioTrainer` for a ``Seq2SeqTrainer`` (Whisper and other encoder-decoders)."""
