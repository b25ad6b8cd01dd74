"""ESPnet2's trainer fed by a ``ShardDataset``, resumed mid-epoch (``shardio[espnet]``).

ESPnet2 builds each epoch's training batches through an iterator factory
(``AbsIterFactory.build_iter(epoch)``, chosen by ``--iterator_type``; ``task`` asks the task's
``build_task_iter_factory``) and saves ``checkpoint.pth`` (model, reporter, optimizers, schedulers, scaler)
only at an epoch's end, so ``--resume true`` restarts an interrupted epoch from its first batch.
:func:`shardio_task` makes a task class (``ASRTask``, ...) whose ``task`` iterator is a
:class:`ShardioIterFactory` and whose trainer (:func:`shardio_trainer`) writes ``shardio_checkpoint.pth``
every ``--shardio_save_every_steps`` optimizer steps: the model, optimizers, schedulers, scaler and torch's
random state as ESPnet saves them, and the loader's state as JSON text. A resumed run (``--resume true``)
loads ESPnet's epoch-end ``checkpoint.pth`` as ESPnet does, then, when ``shardio_checkpoint.pth`` is of the
epoch it starts, that file too, and trains exactly the batches after it.

Hooks used, and why: the ``task`` iterator type is ESPnet's documented place for a task's own iterator; the
mid-epoch save needs the model and optimizer between two steps, which only ``Trainer.train_one_epoch``
holds, so the trainer subclass hands :class:`ShardioEpoch` a saver before ESPnet's loop starts, and the
epoch saves when the loop asks for the next batch (the previous step is complete then). The file is loaded
with ``torch.load(weights_only=True)``: it holds tensors, numbers and strings only, nothing of shardio is
pickled.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..datasets.dataset import ShardDataset
from ..errors import OptionError, shown
from ..loader.loader import ShardLoader
from ._extras import require
from .espnet_checkpoint import CHECKPOINT, reporter_stats, resume_checkpoint, save_checkpoint

__all__ = ["CHECKPOINT", "ShardioEpoch", "ShardioIterFactory", "shardio_task", "shardio_trainer"]


class ShardioEpoch:
    """One epoch of ESPnet batches ``(utt_ids, batch)`` from a :class:`ShardioIterFactory`'s loader.

    Args:
        factory: The factory whose loader and functions make the batches.
        epoch: shardio's epoch (ESPnet's epoch minus one: ESPnet counts from 1).
    """

    def __init__(self, factory: ShardioIterFactory, epoch: int) -> None:
        self.factory, self.epoch = factory, epoch
        self.saver: Callable[[int], None] | None = None
        self.every = 0
        self.trained = 0  # the batches this process's iteration gave

    def __len__(self) -> int:
        return len(self.factory.loader)

    def __iter__(self) -> Iterator[tuple[list[str], dict[str, torch.Tensor]]]:
        loader = self.factory.loader
        loader.set_epoch(self.epoch)
        for step, batch in enumerate(loader, 1):
            self.trained += 1
            yield self.factory.espnet_batch(batch)
            # ESPnet asks for the next batch after this one's optimizer step: save here
            if self.saver is not None and self.every and step % self.every == 0:
                self.saver(step)


class ShardioIterFactory:
    """ESPnet's iterator factory over a ``ShardDataset`` (an ``AbsIterFactory``: ``build_iter(epoch)``).

    Args:
        dataset: The training set; batched (``max_duration`` or ``batch_size``).
        preprocess: ESPnet's ``preprocess_fn(uid, {speech_name: array, text_name: str})`` (the task's
            ``build_preprocess_fn``), or None.
        collate: ESPnet's ``collate_fn`` (``CommonCollateFn``: a list of ``(uid, data)`` to
            ``(uids, batch)``).
        num_workers: The ``ShardLoader``'s decoding processes.
        speech_name: The name ESPnet's model takes the audio under (``speech`` for ASR).
        text_name: The name of the transcript (``text``); a batch without ``text`` gives none.

    Raises:
        OptionError: A dataset that is not a batched ``ShardDataset``.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        *,
        preprocess: Callable[[str, dict[str, Any]], dict[str, Any]] | None,
        collate: Callable[[list[tuple[str, dict[str, Any]]]], tuple[list[str], dict[str, torch.Tensor]]],
        num_workers: int = 0,
        speech_name: str = "speech",
        text_name: str = "text",
    ) -> None:
        if not isinstance(dataset, ShardDataset) or not dataset.batched:
            raise OptionError(f"ShardioIterFactory needs a batched ShardDataset, not {shown(dataset)}")
        self.dataset, self.loader = dataset, ShardLoader(dataset, num_workers=num_workers)
        self.preprocess, self.collate = preprocess, collate
        self.speech_name, self.text_name = speech_name, text_name
        self.resume_checked = False

    def build_iter(self, epoch: int, shuffle: bool | None = None) -> ShardioEpoch:
        """ESPnet's epoch ``epoch`` (from 1) as shardio's epoch ``epoch - 1``; ``shuffle`` is the plan's."""
        return ShardioEpoch(self, epoch - 1)

    def espnet_batch(self, batch: dict[str, Any]) -> tuple[list[str], dict[str, torch.Tensor]]:
        """A shardio batch as ESPnet's ``(utt_ids, batch)``: each sample's first channel, unpadded, with its
        text, through ``preprocess`` and then ``collate``."""
        audio, lengths = batch["audio"], batch["lengths"]
        texts = batch.get(self.text_name)
        samples = []
        for row, key in enumerate(batch["keys"]):
            data: dict[str, Any] = {self.speech_name: audio[row, 0, : int(lengths[row])].numpy().copy()}
            if texts is not None:
                data[self.text_name] = texts[row]
            samples.append((key, self.preprocess(key, data) if self.preprocess is not None else data))
        return self.collate(samples)


def shardio_trainer(trainer: type) -> type:
    """A subclass of ESPnet's trainer class ``trainer`` (``espnet2.train.trainer.Trainer``) that saves and
    resumes :class:`ShardioEpoch` epochs mid-epoch (see the module docstring).

    Args:
        trainer: The task's trainer class.

    Returns:
        The subclass; other iterators train as ``trainer`` trains them.
    """

    class ShardioTrainer(trainer):
        @classmethod
        def build_options(cls, args: argparse.Namespace) -> Any:
            options = super().build_options(args)
            options.shardio_save_every_steps = getattr(args, "shardio_save_every_steps", 0)
            return options

        @classmethod
        def train_one_epoch(
            cls,
            model: torch.nn.Module,
            iterator: Any,
            optimizers: Sequence[Any],
            schedulers: Sequence[Any],
            scaler: Any,
            reporter: Any,
            summary_writer: Any,
            options: Any,
            distributed_option: Any,
        ) -> bool:
            if isinstance(iterator, ShardioEpoch):
                path = os.path.join(str(options.output_dir), CHECKPOINT)
                if options.resume and not iterator.factory.resume_checked and os.path.exists(path):
                    loader = iterator.factory.loader
                    resume_checkpoint(
                        path, iterator.epoch, loader, model, optimizers, schedulers, scaler, reporter
                    )
                iterator.factory.resume_checked = True
                accum = max(int(options.accum_grad), 1)
                every = int(getattr(options, "shardio_save_every_steps", 0) or 0)
                iterator.every = every * accum
                rank0 = not distributed_option.distributed or distributed_option.dist_rank == 0
                if rank0 and every:
                    iterator.saver = lambda step: save_checkpoint(
                        path,
                        model,
                        optimizers,
                        schedulers,
                        scaler,
                        iterator.factory.loader,
                        iterator.epoch,
                        step,
                        reporter_stats(reporter),
                    )
            invalid = super().train_one_epoch(
                model=model,
                iterator=iterator,
                optimizers=optimizers,
                schedulers=schedulers,
                scaler=scaler,
                reporter=reporter,
                summary_writer=summary_writer,
                options=options,
                distributed_option=distributed_option,
            )
            # A run resumed from a checkpoint after an epoch's last batch (killed during its validation)
            # has no batch left in it: ESPnet would read "all steps invalid" and stop training.
            return bool(invalid) and not (isinstance(iterator, ShardioEpoch) and iterator.trained == 0)

    return ShardioTrainer


def shardio_task(task: type) -> type:
    """A subclass of the ESPnet task class ``task`` (``espnet2.tasks.asr.ASRTask``, ...) whose training
    batches come from a shardio dataset, saved and resumed mid-epoch.

    Its options, beside the task's: ``--shardio_train DIR`` (the training set, with ``--iterator_type task``;
    validation and attention plots stay on ESPnet's sequence iterator), ``--shardio_max_duration``
    (padded seconds a batch, per rank), ``--shardio_batch_size``, ``--shardio_num_buckets``,
    ``--shardio_num_workers`` and ``--shardio_save_every_steps`` (a mid-epoch checkpoint every N optimizer
    steps; 0: none).

    Args:
        task: The ESPnet task class.

    Returns:
        The subclass; run it as ESPnet runs a task (``main(cmd=[...])``).

    Raises:
        ImportError: ESPnet is not installed (``pip install 'shardio[espnet]'``).
    """
    require("espnet", "espnet2")
    from espnet2.iterators.abs_iter_factory import AbsIterFactory

    made = _TASKS.get(task)
    if made is not None:
        return made

    AbsIterFactory.register(ShardioIterFactory)  # ESPnet's trainer checks its factories' type

    class ShardioTask(task):
        trainer = shardio_trainer(task.trainer)  # type: ignore[attr-defined]

        @classmethod
        def add_task_arguments(cls, parser: argparse.ArgumentParser) -> None:
            super().add_task_arguments(parser)
            group = parser.add_argument_group("shardio")
            group.add_argument("--shardio_train", default=None, help="the shardio training set")
            group.add_argument("--shardio_max_duration", type=float, default=None)
            group.add_argument("--shardio_batch_size", type=int, default=None)
            group.add_argument("--shardio_num_buckets", type=int, default=None)
            group.add_argument("--shardio_num_workers", type=int, default=0)
            group.add_argument("--shardio_save_every_steps", type=int, default=0)

        @classmethod
        def build_task_iter_factory(cls, args: argparse.Namespace, iter_options: Any, mode: str) -> Any:
            if mode != "train":  # validation and attention plots stay on ESPnet's own loader
                return cls.build_sequence_iter_factory(args=args, iter_options=iter_options, mode=mode)
            if args.shardio_train is None:
                raise OptionError("--iterator_type task with shardio needs --shardio_train DIR")
            dataset = ShardDataset(
                args.shardio_train,
                max_duration=args.shardio_max_duration,
                batch_size=args.shardio_batch_size,
                num_buckets=args.shardio_num_buckets,
                seed=args.seed,
            )
            return ShardioIterFactory(
                dataset,
                preprocess=iter_options.preprocess_fn,
                collate=iter_options.collate_fn,
                num_workers=args.shardio_num_workers,
            )

    ShardioTask.__name__ = f"Shardio{task.__name__}"
    # ESPnet's own multi-GPU launch (--ngpu N) pickles the task's main_worker for spawned processes: the
    # class is found again by this name, through the module's __getattr__
    ShardioTask.__qualname__ = _PREFIX + f"{task.__module__}.{task.__qualname__}".replace(".", "__")
    _TASKS[task] = ShardioTask
    return ShardioTask


_TASKS: dict[type, type] = {}
_PREFIX = "ShardioTask__"


def __getattr__(name: str) -> type:
    """``ShardioTask__{module}__{class}``: ``shardio_task`` of that ESPnet task class, as a process that
    ESPnet spawns unpickles it (its ``main_worker``); only a subclass of ESPnet's ``AbsTask`` is made."""
    parts = name[len(_PREFIX) :].split("__") if name.startswith(_PREFIX) else []
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
        from espnet2.tasks.abs_task import AbsTask

        if isinstance(found, type) and issubclass(found, AbsTask):
            return shardio_task(found)
        break
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
