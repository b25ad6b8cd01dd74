"""WorkerPool: a ShardLoader's worker processes, each with this process's end of its pipe and its credits.

The loader decides what an iteration yields and in which order (:mod:`.loader`); the pool is how it speaks
to the processes that make the batches: it starts them (:func:`~shardio.loader.server.serve`), begins an
iteration in each, takes a worker's next message, stops an iteration early and ends them. A worker that
dies, or says nothing within the loader's ``timeout``, ends the whole pool before its ``RuntimeError`` is
raised, so a failed iteration leaves no process behind; without a timeout a silent worker is waited for, with
a warning naming it (:mod:`.silence`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import torch

from ..datasets.dataset import ShardDataset
from .channel import Channel
from .credits import Credits
from .server import BATCH, EXIT, START, STOP, WATCH_S, serve
from .silence import Silence, end, process_state

__all__ = ["Worker", "WorkerPool"]

logger = logging.getLogger(__name__)

_JOIN_S = 5.0
"""How long a worker that is exiting is waited for (one asked to exit is then terminated)."""


class Worker(NamedTuple):
    """One worker process of a pool, with this process's end of its pipe and the worker's credits."""

    process: Any  # a multiprocessing Process of the loader's context
    channel: Channel
    credits: Credits


class WorkerPool:
    """The worker processes of one loader, started by the multiprocessing ``context`` when an iteration needs
    them. ``workers``: the processes, in worker order (empty when none are running); ``running``: the numbers
    of those in the middle of an iteration."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.workers: list[Worker] = []
        self.running: set[int] = set()

    def start(self, dataset: ShardDataset, count: int) -> None:
        """``count`` workers serving ``dataset``, unless every worker is alive already (where one is not,
        all are ended and started anew)."""
        if self.workers and all(worker.process.is_alive() for worker in self.workers):
            return
        self.shutdown()
        base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        for number in range(count):
            ours, theirs = self.context.Pipe(duplex=True)
            channel = Channel(ours)
            credits = Credits(self.context)
            # this process's pipe ends, which a forked worker inherits (as objects: nothing is pickled) and
            # closes
            forked = self.context.get_start_method() == "fork"
            ends = [channel, *(worker.channel for worker in self.workers)] if forked else []
            process = self.context.Process(
                target=serve,
                name=f"shardio-loader-{number}",
                daemon=True,
                args=(theirs, credits, dataset, number, count, base_seed, ends),
            )
            process.start()
            theirs.close()
            self.workers.append(Worker(process, channel, credits))

    def begin(self, prefetch: int) -> None:
        """Begin an iteration in every (started) worker, each with ``prefetch`` credits."""
        for worker in self.workers:
            worker.channel.send((START, worker.credits.reset(prefetch)))
        self.running = set(range(len(self.workers)))

    def grant(self, number: int) -> None:
        """One more credit to worker ``number``: it may make and send another batch."""
        self.workers[number].credits.grant()

    def receive(self, number: int, timeout: float) -> tuple[str, Any]:
        """The next message of worker ``number``; a ``RuntimeError`` if it died or (``timeout`` seconds; 0: no
        limit) said nothing."""
        worker = self.workers[number]
        began = time.monotonic()
        deadline = began + timeout if timeout else None
        silence = None  # without a timeout: a warning once the worker has been silent long (see .silence)
        while True:
            left = WATCH_S if deadline is None else min(WATCH_S, deadline - time.monotonic())
            if worker.channel.ready(left):
                try:
                    message: tuple[str, Any] = worker.channel.receive()
                    return message
                except (EOFError, OSError):  # the worker closed its end: it is exiting
                    worker.process.join(_JOIN_S)  # its exit code says how
            if not worker.process.is_alive():
                code = worker.process.exitcode
                self.shutdown()
                raise RuntimeError(
                    f"shardio loader worker {number} (pid {worker.process.pid}) exited "
                    f"unexpectedly with exit code {code}"
                    + (f" (killed by signal {-code})" if code is not None and code < 0 else "")
                )
            if deadline is not None and time.monotonic() >= deadline:
                state = process_state(worker.process.pid)
                self.shutdown()
                raise RuntimeError(
                    f"shardio loader worker {number} (pid {worker.process.pid}) gave no batch "
                    f"in {timeout:g} s (timeout)" + (f"; it was {state}" if state else "")
                )
            if deadline is None:
                silence = silence or Silence(number, worker.process.pid, began)
                silence.check()

    def halt(self, timeout: float) -> None:
        """Stop the iteration the workers are in, taking (and dropping) what they had sent (``timeout``: as
        :meth:`receive`'s)."""
        try:
            for number in self.running:
                self.workers[number].credits.interrupt()
                self.workers[number].channel.send(STOP)
            for number in sorted(self.running):
                while self.receive(number, timeout)[0] == BATCH:
                    pass
        except (OSError, RuntimeError):
            logger.debug("a shardio loader worker died while its iteration was stopped", exc_info=True)
            self.shutdown()
        self.running = set()

    def shutdown(self) -> None:
        """End every worker: asked first, then terminated."""
        workers, self.workers, self.running = self.workers, [], set()
        for worker in workers:
            try:
                worker.credits.interrupt()
                worker.channel.send(EXIT)
            except OSError:
                pass
            # a worker blocked writing a batch larger than the pipe's buffer fails at once
            worker.channel.close()
        for worker in workers:
            end(worker.process, _JOIN_S)
