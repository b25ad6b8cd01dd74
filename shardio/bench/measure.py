"""Measuring for ``shardio bench``: rounds of cases, medians, CPU seconds of a process tree, peak RSS, machine
facts."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

if TYPE_CHECKING:
    from typing import Self  # Python 3.11

    from .cases import Epoch

__all__ = [
    "Case",
    "PeakRss",
    "cpu_seconds",
    "descendants",
    "machine_facts",
    "measure_rounds",
    "stats",
    "timed",
]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of ``values`` (and the values)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def timed(function: Callable[[], object], runs: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wall and CPU seconds (this process's) of ``runs`` calls of ``function``, each as :func:`stats` in
    milliseconds' precision (CPU time is the steadier of the two on a shared machine)."""
    wall, cpu = [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        function()
        wall.append(round(time.perf_counter() - started, 3))
        cpu.append(round(time.process_time() - started_cpu, 3))
    return stats(wall), stats(cpu)


def descendants() -> list[int]:
    """This process's children, grandchildren, ... (Linux ``/proc``; empty elsewhere)."""
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            children = [
                int(c)
                for task in Path(f"/proc/{pid}/task").glob("*/children")
                for c in task.read_text().split()
            ]
        except (OSError, ValueError):
            children = []
        found += children
        todo += children
    return found


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its live descendants (DataLoader workers)."""
    total = time.process_time()
    for pid in descendants():
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
        for pid in [os.getpid(), *(p for p in descendants() if p not in self._before)]:
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.sample())

    def __enter__(self) -> Self:
        self._before = set(descendants())
        self.peak = self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())


def machine_facts() -> dict[str, Any]:
    """CPU model, cores, kernel, load average and library versions, for the report."""
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
    # the kernel tells hosts apart that report the same CPU (a VM's, a sandbox's), whose ratios can differ
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "load_average_start": list(os.getloadavg()),
        **versions,
    }


@dataclass
class Case:
    """One measured case of a round: how to make its epoch, and what to label its figures with."""

    corpus: str
    name: str
    loader: str
    codec: str
    workers: int
    megabytes: float
    make: Callable[[], Epoch | None]
    epoch: Epoch | None = None

    @property
    def key(self) -> str:
        """``corpus|name``, the case's key in rates."""
        return f"{self.corpus}|{self.name}"


def measure_rounds(
    items: list[Case], reps: int, progress: bool, min_seconds: float = 0.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A warm-up round (which also measures peak RSS), then ``reps`` timed rounds over every case in turn;
    in a round, a case reads its corpus as many times as it takes to last ``min_seconds``. Rounds run the
    cases forward and backward in turn, so that a drift of the machine's speed (a shared host's neighbours
    come and go within seconds) weighs alike on two cases a target compares.

    Each pass records wall seconds and CPU seconds (this process and its workers): "per core" figures are
    per CPU-second, which a machine shared with other jobs distorts far less than wall time. The trainer's
    CPU share is the part of them spent in this process (the one a training loop runs in: with workers, what
    receiving batches costs it).
    """
    peaks: dict[str, int] = {}
    for case in tqdm(items, desc="bench warm-up", disable=not progress, leave=False):
        case.epoch = case.make()
        if case.epoch is None:
            continue
        with PeakRss() as rss:
            case.epoch()
        peaks[case.key] = rss.peak
    live = [case for case in items if case.epoch is not None]
    runs: dict[str, list[tuple[float, float, int, float, int, float]]] = {case.key: [] for case in live}
    for rep in tqdm(range(reps), desc="bench rounds", disable=not progress, leave=False):
        for case in live if rep % 2 == 0 else live[::-1]:
            assert case.epoch is not None
            used, own, started = cpu_seconds(), time.process_time(), time.perf_counter()
            samples, seconds = case.epoch()
            passes = 1
            while time.perf_counter() - started < min_seconds:
                more = case.epoch()
                samples, seconds, passes = samples + more[0], seconds + more[1], passes + 1
            elapsed = time.perf_counter() - started
            total = max(cpu_seconds() - used, 1e-6)
            runs[case.key].append(
                (elapsed, total, samples, seconds, passes, (time.process_time() - own) / total)
            )
    rows, rates = [], {}
    for case in live:
        done = runs[case.key]
        wall, cpu = [r[0] for r in done], [r[1] for r in done]
        rates[case.key] = {"wall": [r[2] / r[0] for r in done], "cpu": [r[2] / r[1] for r in done]}
        first = done[0]
        rows.append(
            {
                "corpus": case.corpus,
                "case": case.name,
                "loader": case.loader,
                "codec": case.codec,
                "workers": case.workers,
                "samples": first[2] // first[4],
                "audio_seconds": round(first[3] / first[4], 3),
                "megabytes": round(case.megabytes, 3),
                "passes_per_round": stats([r[4] for r in done]),
                "samples_per_s": stats(rates[case.key]["wall"]),
                "samples_per_cpu_s": stats(rates[case.key]["cpu"]),
                "audio_s_per_s": stats([r[3] / r[0] for r in done]),
                "audio_s_per_cpu_s": stats([r[3] / r[1] for r in done]),
                "mb_per_cpu_s": stats([case.megabytes * r[4] / r[1] for r in done]),
                "cores_used": stats([c / t for c, t in zip(cpu, wall)]),
                "trainer_cpu_share": stats([min(r[5], 1.0) for r in done]),
                "peak_rss_mb": round(peaks[case.key] / 1e6, 1),
            }
        )
    return rows, rates
