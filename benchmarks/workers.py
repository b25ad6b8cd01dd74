"""Where the CPU of a batch goes with DataLoader workers: per thread, in the training
process and in its workers.

Run ``python benchmarks/workers.py [DATASET_DIR] [--rounds 3] [--epochs 30]``. Without a dataset it packs 400
generated 1-5 s 16 kHz PCM WAV utterances (the ``wav16k`` corpus of ``shardio bench``, half its size) into a
temporary directory. Cases, read in interleaved rounds (batches of 16, shuffled, persistent workers):

- 0 workers: the training process reads, decodes and batches;
- 2 workers: the plain ``DataLoader(num_workers=2)`` users run;
- :class:`shardio.ShardLoader` with 2 workers (its default prefetch of 2 batches per worker, and 1);
- 2 decoding threads in the training process (an experiment, not an API: batches built by a thread pool, each
  thread with its own reader, handed over in order), the option of decoding without any transport;
- 2 reader processes at once, 0 workers each, one rank of the plan each (:mod:`shardio.bench.parallel`): what
  two cores of the machine give the reading itself, with no hand-off;
- 2 workers that hand over 8 batches at a time (an experiment, not an API: the trainer unpacks them), to see
  what amortising the DataLoader's per-item cost would win;
- torch's own floor: 2 workers yielding a small dict of 16 keys (no audio), per item.

For each, CPU milliseconds per batch of each thread role, from ``/proc`` (Linux; 10 ms ticks, so each case
runs ``--epochs`` epochs per round): the training process's main thread (DataLoader bookkeeping, unpickling,
the consuming loop) and its other threads (the index queues' feeders), the workers' (or readers') main threads
and their other threads (the result queue's feeder, which pickles and sends). Writes
``benchmarks/results/workers.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from shardio.bench.cases import count_batches, shardio_epoch
from shardio.bench.measure import descendants, machine_facts
from shardio.bench.parallel import parallel_floor
from shardio.bench.report import write_results
from shardio.datasets.dataset import ShardDataset
from shardio.loader.loader import ShardLoader
from shardio.planning.rankplan import rank_plan
from shardio.reading import batchmemory, blocks
from shardio.reading.assembly import Assembler, Decoding

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BATCH = 16
BUNDLE = 8
ROLES = ("trainer main thread", "trainer other threads", "worker main threads", "worker other threads")


class _Bundled(ShardDataset):
    """Yields lists of :data:`BUNDLE` batches (one DataLoader item each)."""

    def __iter__(self) -> Iterator[Any]:
        bundle: list[dict[str, Any]] = []
        for batch in super().__iter__():
            bundle.append(batch)
            if len(bundle) == BUNDLE:
                yield bundle
                bundle = []
        if bundle:
            yield bundle


class _Tiny(IterableDataset[dict[str, Any]]):
    """The DataLoader's own cost: items of 16 keys and 16 lengths, no audio, as many as
    a corpus has batches."""

    def __init__(self, items: int) -> None:
        self.items = items

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = __import__("torch").utils.data.get_worker_info()
        mine = range(info.id, self.items, info.num_workers) if info is not None else range(self.items)
        for _ in mine:
            yield {"keys": [f"key{i}" for i in range(BATCH)], "lengths": list(range(BATCH))}


def _more_blocks(_worker: int) -> None:
    blocks.LIMIT = max(blocks.LIMIT, 2 * BUNDLE + 8)  # in the worker: it keeps its prefetched bundles' blocks


def _bundled_epoch(directory: str) -> Callable[[], tuple[int, float]]:
    loader = DataLoader(
        _Bundled(directory, batch_size=BATCH),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=_more_blocks,
    )
    return lambda: count_batches(batch for bundle in loader for batch in bundle)


def _threaded_epoch(directory: str, threads: int) -> Callable[[], tuple[int, float]]:
    """Batches built by ``threads`` threads of this process, each with its own reader,
    handed over in order."""
    batchmemory._POOL = batchmemory._BlockPool(
        4 + 2 * threads
    )  # every thread's batch in flight takes a block
    dataset = ShardDataset(directory, batch_size=BATCH)
    local = threading.local()
    pool = ThreadPoolExecutor(threads)
    epochs = iter(range(1 << 30))

    def build(plan: Any, epoch: int, number: int) -> dict[str, Any]:
        if not hasattr(local, "assembler"):
            local.assembler = Assembler(
                dataset._new_reader(),
                Decoding(),
                seed=dataset.seed,
                batched=True,
                on_error="raise",
                fields=dataset.planner.fields,
                in_worker=False,
            )
        return local.assembler.batch(plan.batch(number), epoch, plan.repeat_flags(number))

    def batches() -> Iterator[dict[str, Any]]:
        epoch = next(epochs)
        dataset.set_epoch(epoch)
        plan = rank_plan(dataset.plan(epoch), 0)
        pending: deque[Future[dict[str, Any]]] = deque()
        for number in range(plan.num_batches):
            pending.append(pool.submit(build, plan, epoch, number))
            if len(pending) > threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    return lambda: count_batches(batches())


def _lean_epoch(directory: str, prefetch: int) -> Callable[[], tuple[int, float]]:
    loader = ShardLoader(ShardDataset(directory, batch_size=BATCH), num_workers=2, prefetch=prefetch)
    return lambda: count_batches(loader)


def _tiny_epoch(batches: int) -> Callable[[], tuple[int, float]]:
    loader = DataLoader(_Tiny(batches), batch_size=None, num_workers=2, persistent_workers=True)
    return lambda: (BATCH * sum(1 for _ in loader), 0.0)


def _threads() -> dict[tuple[int, int], float]:
    """CPU seconds of every thread of this process and its descendants."""
    found = {}
    for pid in [os.getpid(), *descendants()]:
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                found[(pid, int(task.name))] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            pass
    return found


def _role(pid: int, tid: int) -> str:
    return ROLES[(0 if pid == os.getpid() else 2) + (0 if pid == tid else 1)]


def _corpus(out: Path) -> str:
    from shardio.packing.pack import pack
    from shardio.synth import make_corpus

    make_corpus(
        out / "src", num_files=400, formats=("wav",), sample_rate=16000, min_seconds=1.0, max_seconds=5.0
    )
    pack(out / "src", out / "ds", samples_per_shard=50, compression="none", progress=False)
    return str(out / "ds")


def measure(directory: str, rounds: int, epochs: int) -> dict[str, Any]:
    """Per case: samples per wall second and CPU ms per batch of each thread role, medians over ``rounds``."""
    batches = len(ShardDataset(directory, batch_size=BATCH))
    cases = {
        "0 workers": shardio_epoch(directory, workers=0, batch_size=BATCH),
        "2 workers": shardio_epoch(directory, workers=2, batch_size=BATCH),
        "ShardLoader, 2 workers": _lean_epoch(directory, prefetch=2),
        "ShardLoader, 2 workers, prefetch 1": _lean_epoch(directory, prefetch=1),
        "2 decoding threads in the training process (experiment)": _threaded_epoch(directory, 2),
        "2 reader processes, 0 workers each (parallel floor)": parallel_floor(
            directory, processes=2, batch_size=BATCH
        ),
        f"2 workers, {BUNDLE} batches per hand-off (experiment)": _bundled_epoch(directory),
        "torch DataLoader alone: 2 workers, items without audio": _tiny_epoch(batches),
    }
    for epoch in cases.values():
        epoch()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for round_ in range(rounds):
        for name, epoch in cases.items() if round_ % 2 == 0 else reversed(cases.items()):
            before, started, samples = _threads(), time.perf_counter(), 0
            for _ in range(epochs):
                samples += epoch()[0]
            wall, after = time.perf_counter() - started, _threads()
            per_batch = 1000 / (samples / BATCH)
            row = {role: 0.0 for role in ROLES}
            for thread, seconds in after.items():
                row[_role(*thread)] += (seconds - before.get(thread, 0.0)) * per_batch
            row["total"] = sum(row[role] for role in ROLES)
            row["samples_per_s"] = samples / wall
            runs[name].append(row)
    return {
        name: {key: statistics.median(r[key] for r in done) for key in done[0]} for name, done in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", help="a shardio dataset of PCM WAV (default: generated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30, help="epochs per case per round")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    facts = machine_facts()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dataset or _corpus(Path(tmp))
        figures = measure(directory, args.rounds, args.epochs)
    facts["load_average_end"] = list(os.getloadavg())
    command = "python benchmarks/workers.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    lines = [
        "# Where a batch's CPU goes with DataLoader workers",
        "",
        f"`{command}` on {facts['cpu']}, {facts['cores']} cores (load average "
        f"{facts['load_average_start'][0]:.1f} at start, {facts['load_average_end'][0]:.1f} at end); torch "
        f"{facts['torch']}. Batches of {BATCH} PCM WAV utterances of 1-5 s; medians of {args.rounds} "
        f"interleaved rounds of {args.epochs} epochs. CPU ms per batch by thread (see the script's docs).",
        "",
        "| case | samples/s (wall) | " + " | ".join(ROLES) + " | total CPU ms per batch |",
        "|---|" + "---:|" * (len(ROLES) + 2),
    ]
    for name, row in figures.items():
        lines.append(
            f"| {name} | {row['samples_per_s']:,.0f} | "
            + " | ".join(f"{row[role]:.3f}" for role in ROLES)
            + f" | {row['total']:.3f} |"
        )
    write_results(
        args.results,
        "workers",
        {
            "command": command,
            "machine": facts,
            "batch_size": BATCH,
            "rounds": args.rounds,
            "epochs": args.epochs,
            "cases": figures,
        },
        "\n".join(lines) + "\n",
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
