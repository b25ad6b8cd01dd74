"""Silence: a loud word about a ShardLoader worker that has given nothing for a long while, when the loader
has no ``timeout``.

Without ``timeout`` the training process waits for a worker's next message as long as the worker lives: a
batch may rightly take long (a slow remote read retried, a long transform, a worker being debugged). A worker
that lives but makes no progress (stopped by ``SIGSTOP`` or job control, blocked in the kernel on a dead
network mount, deadlocked) would then hold the job forever without a word, as torch's DataLoader does. Here a
waiting loader logs a warning once a worker has been silent :data:`SILENT_S` seconds, naming the worker, its
pid and its process state (stopped, in uninterruptible sleep, ...), and again each time the wait doubles. It
keeps waiting: a warning changes no batch (``timeout=`` fails instead), and a worker that resumes is taken
from as before.

A worker asked to exit is ended by :func:`end`: a stopped one acts on no signal but ``SIGKILL`` (its
``SIGTERM`` waits for a ``SIGCONT``), and one left alive would hang the training process's exit, where
``multiprocessing`` joins its daemon processes.

A worker stopped just after sending a batch is waited for as any other: the file descriptors of the batch's
tensors (a block's first trip, a tensor outside the block) travel with the message (:mod:`.descriptors`),
where torch's reducer had the training process fetch them from the worker while unpickling, with no time
limit. A worker stopped in the middle of writing a message larger than its pipe's buffer (some 200 KiB) is
waited for the same way: the training process reads a message as its bytes arrive, within
its wait (:mod:`.channel`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["SILENT_S", "Silence", "end", "process_state"]

logger = logging.getLogger(__name__)

SILENT_S = 60.0
"""Seconds a worker may give nothing before a waiting loader without ``timeout`` warns of it."""

_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep (blocked in the kernel, e.g. on I/O)",
    "T": "stopped (SIGSTOP or job control: SIGCONT resumes it)",
    "t": "stopped by a debugger (traced)",
    "Z": "a zombie",
}


def process_state(pid: int | None) -> str:
    """Process ``pid``'s state in words, from ``/proc`` (empty where it cannot be read: not Linux, gone)."""
    if pid is None:
        return ""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode(errors="replace")
    except OSError:
        return ""
    # "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ')'
    fields = text[text.rfind(")") + 1 :].split()
    return _STATES.get(fields[0], fields[0]) if fields else ""


class Silence:
    """One wait for worker ``number`` (pid ``pid``), begun at ``began``; :meth:`check` warns at
    :data:`SILENT_S` seconds of it, then at each doubling."""

    def __init__(self, number: int, pid: int | None, began: float) -> None:
        self.number, self.pid = number, pid
        self.began = began  # time.monotonic() when the wait began
        self.after = SILENT_S

    def check(self) -> None:
        """Warn if the wait has reached its next mark (called while waiting, at most every second or so)."""
        waited = time.monotonic() - self.began
        if waited < self.after:
            return
        self.after *= 2
        state = process_state(self.pid)
        logger.warning(
            "shardio loader worker %d (pid %s) has given nothing for %.0f s%s; still waiting for it "
            "(pass timeout= to ShardLoader to fail instead)",
            self.number,
            self.pid,
            waited,
            f" and is {state}" if state else "",
        )


def end(process: Any, wait: float) -> None:
    """End ``process`` (a ``multiprocessing`` process asked to exit): wait ``wait`` seconds, then terminate
    it, then kill it; a stopped one is killed at once."""
    if not process_state(process.pid).startswith("stopped"):
        process.join(wait)
        if process.is_alive():
            process.terminate()
            process.join(wait)
    if process.is_alive():
        process.kill()
        process.join(wait)
