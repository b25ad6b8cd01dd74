"""Server: a ShardLoader worker process, which plays the dataset's batches over its pipe, one per credit.

The protocol, both ends: the training process sends ``(START, interruptions)`` to begin an iteration (the
worker's :class:`~shardio.loader.credits.Credits` set to its prefetch, and the interruption count the
iteration starts from), grants a credit in shared memory for each batch it takes, and sends ``STOP`` to end
an iteration early or ``EXIT`` (each announced through the credits); the worker answers ``BATCH`` (the
batch, its audio in a reused shared-memory block), ``END``, ``STOPPED`` or ``ERROR`` (the exception, with the
worker's traceback as a note). Either side looks every :data:`WATCH_S` whether the other is alive.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  registers the reducers that send tensors between processes
from torch.utils.data._utils import worker as torch_worker

from ..datasets.dataset import ShardDataset
from ..runtime.yieldlog import silence
from ..world import Context
from .channel import Channel
from .credits import Credits

__all__ = ["BATCH", "END", "ERROR", "EXIT", "START", "STOP", "STOPPED", "WATCH_S", "serve"]

START, STOP, EXIT = "start", "stop", "exit"  # training process -> worker
BATCH, END, STOPPED, ERROR = "batch", "end", "stopped", "error"  # worker -> training process
WATCH_S = 1.0
"""How often a process waiting on its pipe looks whether the other side is still alive."""


_DONE = object()


def serve(
    pipe: Connection,
    credits: Credits,
    dataset: ShardDataset,
    number: int,
    workers: int,
    base_seed: int,
    inherited: Sequence[Channel] = (),
) -> None:
    """A worker: each iteration the training process starts, the dataset's batches, one per credit.
    ``inherited``: the training process's ends of the pipes (this worker's, earlier workers'), which a forked
    worker has copies of and closes: kept open, they would hide the training process's closing its own (a
    worker blocked writing a large batch would not learn it)."""
    for pipe_end in inherited:
        pipe_end.close()
    # the process that forked this one: the training process, or under forkserver the fork server, which exits
    # with the training process. Either way this worker is orphaned (and exits) once its parent changes
    parent = os.getppid()
    silence()  # the training process records what it hands over (the yield log)
    _default_signals()
    torch.set_num_threads(1)
    seed = base_seed + number
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=number, num_workers=workers, seed=seed, dataset=dataset
    )
    channel = Channel(pipe, carry_fds=True)  # a batch's descriptors go with it: it needs nothing more of us
    try:
        while True:
            message = _message(channel, parent)
            if message is None or message == EXIT:
                return
            if isinstance(message, tuple) and message[0] == START:
                if not _iterate(channel, credits, dataset, message[1], parent):
                    return
    except KeyboardInterrupt:  # the training process is interrupted too, and says so
        return
    finally:
        channel.close()


def _default_signals() -> None:
    """Python's default signal handlers: a forked worker inherits the training process's, and a trainer's
    (Lightning's SIGTERM handler broadcasts to the process group) must not run here. SIGINT still raises
    KeyboardInterrupt, on which a worker exits quietly."""
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


def _iterate(channel: Channel, credits: Credits, dataset: ShardDataset, since: int, parent: int) -> bool:
    """One iteration, begun at interruption count ``since``; False when the worker is to exit.

    A batch is made only once a credit allows sending it, as a DataLoader worker makes one per index it is
    sent: no batch waits in its block for a credit, so a worker keeps ``prefetch`` batches ahead, not one
    more, and one block fewer in use (one fewer to cycle through the caches: 0-3% less
    CPU a WAV batch here)."""
    try:
        batches = iter(dataset)
        # the first batch is made whatever follows START (whose credits are there): making it begins the
        # iteration in the dataset, so the next one plays the next epoch, as in every other worker
        credits.take(0.0)
        batch = next(batches, _DONE)
        while batch is not _DONE:
            channel.send((BATCH, batch))
            ending = _next_credit(channel, credits, since, parent)
            if ending == STOP:
                return _tell(channel, (STOPPED, None))
            if ending == EXIT:
                return False
            batch = next(batches, _DONE)
    except Exception as exc:  # a send that failed too: the training process closed the pipe, we exit
        return _tell(channel, (ERROR, _portable(exc)))
    return _tell(channel, (END, None))


def _tell(channel: Channel, message: Any) -> bool:
    """Send ``message``; False when the training process has closed the pipe (it ends this worker)."""
    try:
        channel.send(message)
    except OSError:
        return False
    return True


def _next_credit(channel: Channel, credits: Credits, since: int, parent: int) -> str | None:
    """Wait for a credit: None once one is taken, else what ends the iteration instead: ``STOP``, or ``EXIT``
    (also when the training process is gone)."""
    while not (credits.take(WATCH_S) and not credits.interrupted(since)):
        if credits.interrupted(since):  # told to read the pipe: STOP or EXIT is there
            return STOP if _message(channel, parent) == STOP else EXIT
        if os.getppid() != parent:
            return EXIT
    return None


def _message(channel: Channel, parent: int) -> Any:
    """The next message from the training process; None once it is gone."""
    try:
        while not channel.ready(WATCH_S):
            if os.getppid() != parent:
                return None
        return channel.receive()
    except (EOFError, OSError):
        return None


def _portable(exc: Exception) -> Exception:
    """``exc`` with the worker's traceback as a note, or a ``RuntimeError`` telling it when
    it cannot be pickled."""
    context = Context.detect()
    where = f"in shardio loader worker {context.worker if context.in_worker else '?'} (pid {os.getpid()})"
    text = "".join(traceback.format_exception(exc))
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__} {where}:\n{text}")
    note = f"raised {where}:\n{text}"
    if hasattr(copy, "add_note"):
        copy.add_note(note)
    else:  # Python 3.10: the note is kept where 3.11 keeps it, though 3.10's tracebacks do not print it
        copy.__notes__ = [*getattr(copy, "__notes__", []), note]
    return copy
