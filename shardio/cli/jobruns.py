"""Running a user's job for ``shardio check-resume``: in a session of its own, with its output in a file, to
its end, or killed with SIGKILL, every process of it at once, as a preemption does.

A job's processes are its process and all their descendants (read from ``/proc``): ``torchrun`` starts each
rank in a session of its own, so killing the first process's group alone would leave the ranks training. The
kill moment is read from the outside, in the run's yield log (batch records of rank 0); the job decides
nothing by it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Ending", "kill_tree", "run_part"]

POLL = 0.02
"""Seconds between looks at a running job (its exit, its yield log)."""


@dataclass(frozen=True)
class Ending:
    """How a run of the job ended: ``killed`` by us, else its exit code (negative: a signal's number);
    ``timed_out`` when it outlived its limit (and was killed); ``steps``: rank 0's batches counted."""

    killed: bool
    code: int
    timed_out: bool
    steps: int
    seconds: float


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                text = file.read(4096)
        except OSError:
            continue
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def _tree(pid: int) -> list[int]:
    children, found, todo = _children(), [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid``, every descendant and their process groups (rank sessions too)."""
    for _ in range(5):  # a process forked while we looked: once more
        tree = _tree(pid)
        groups = set()
        for member in tree:
            try:
                groups.add(os.getpgid(member))
            except OSError:
                pass
        for member in tree:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass
        for group in groups - {os.getpgrp()}:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        if len(_tree(pid)) <= 1:
            return


class _StepCounter:
    """Rank 0's batch records in a yield-log directory, read as they are appended."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.count = directory, 0
        self._offsets: dict[str, int] = {}

    def update(self) -> int:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return self.count
        for name in names:
            path = self.directory / name
            offset = self._offsets.get(name, 0)
            try:
                with open(path, "rb") as file:
                    file.seek(offset)
                    chunk = file.read(1 << 22)
            except OSError:
                continue
            whole = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[name] = offset + len(whole)
            self.count += sum(
                1 for line in whole.splitlines() if b'"kind":"batch"' in line and b'"rank":0,' in line
            )
        return self.count


def run_part(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    output: Path,
    log: Path,
    kill_at: int | None,
    kill_after: float | None,
    limit: float,
) -> Ending:
    """Run ``command`` in ``cwd`` (its output into ``output``); kill it once rank 0 has yielded ``kill_at``
    batches (in ``log``) or ``kill_after`` seconds have passed, and at ``limit`` seconds in any case."""
    counter = _StepCounter(log)
    start = time.monotonic()
    with open(output, "wb") as out:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    killed = timed_out = False
    try:
        while process.poll() is None:
            elapsed = time.monotonic() - start
            steps = counter.update() if kill_at is not None else 0
            due = (kill_at is not None and steps >= kill_at) or (
                kill_after is not None and elapsed >= kill_after
            )
            if due or elapsed >= limit:
                kill_tree(process.pid)
                killed, timed_out = True, not due
                break
            time.sleep(POLL)
    finally:
        if process.poll() is None and not killed:  # interrupted: leave nothing of the job running
            kill_tree(process.pid)
        code = process.wait()
        kill_tree(process.pid)  # its processes left running after it exited (a rank, a worker)
    return Ending(killed, code, timed_out, counter.update(), time.monotonic() - start)
