"""Measuring for ``shardio bench``: medians, CPU seconds of a process tree, peak RSS, machine facts."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

__all__ = ["PeakRss", "cpu_seconds", "machine_facts", "stats"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of ``values`` (and the values)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def _descendants() -> list[int]:
    """This process's children, grandchildren, ... (Linux ``/proc``; empty elsewhere)."""
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            children = [int(c) for task in Path(f"/proc/{pid}/task").glob("*/children") for c in task.read_text().split()]
        except (OSError, ValueError):
            children = []
        found += children
        todo += children
    return found


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its live descendants (DataLoader workers)."""
    total = time.process_time()
    for pid in _descendants():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, ValueError, IndexError):
            pass
    return total


class PeakRss:
    """Samples, in a thread, the resident memory of this process plus the children it starts meanwhile."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.peak = interval, 0
        self._before: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        """Bytes resident now (0 where ``/proc`` is missing)."""
        total = 0
        for pid in [os.getpid(), *(p for p in _descendants() if p not in self._before)]:
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.sample())

    def __enter__(self) -> Self:
        self._before = set(_descendants())
        self.peak = self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())


def machine_facts() -> dict[str, Any]:
    """CPU model, cores, load average and library versions, for the report."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version()}
    for module in ("numpy", "torch", "soundfile", "webdataset", "zstandard"):
        try:
            versions[module] = str(__import__(module).__version__)
        except (ImportError, AttributeError):
            versions[module] = "absent"
    import soundfile
    versions["libsndfile"] = str(soundfile.__libsndfile_version__)
    return {"cpu": model, "cores": os.cpu_count(), "load_average_start": list(os.getloadavg()), **versions}
