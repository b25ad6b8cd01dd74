"""Scale: start-up time and memory per process against the corpus size (1M, 10M, 30M samples).

Run ``python benchmarks/scale.py [--sizes 1000000 10000000 30000000] [--data DIR]``. Each dataset is
synthetic: one real shard of ``--per-shard`` short WAV samples, and ``N / per_shard`` shard names that are
symbolic links to it, with an index written directly (the same keys in every shard, which the index allows).
For each size, world size 8 (rank 0), ``batch_size=32``, each case runs in a fresh Python process:

- ``ShardDataset(...)`` construct time, then ``set_epoch(0)`` time: each case starts with no plan files in
  the benchmark's node cache (``DATA/shardio-scale/cache``), so it plans epoch 0 (with world 8 it writes
  every rank's share for the node, :mod:`shardio.runtime.planfiles`);
- time to the first batch with 0 workers, and with 2 workers started by ``fork`` and by ``forkserver``
  (whose server preloads ``torch`` and ``shardio.datasets.dataset``, as a user should: else each worker
  imports torch; the server's start, once per job and the same for any dataset, is timed apart);
- after the first batch: RSS and PSS (``/proc/PID/smaps_rollup``) of the training process and of each
  worker, each also as the excess over a baseline: the training process right after importing shardio and
  torch, and a worker process started the same way that only imported shardio;
- index bytes per sample (``index.json`` + ``index.columns``) and the JSON size of ``state_dict()``;
- with ``--node-ranks K``: K training processes of one node (ranks 0 to K-1 of the world of 8) started at
  once, each constructing the dataset and calling ``set_epoch(0)``, as the ranks of a node do at an epoch's
  start: the slowest rank's ``set_epoch`` time, and each rank's peak memory while planning above its memory
  before (``VmHWM``, reset before planning), summed over the node.

Writes ``benchmarks/results/scale.json`` and ``.md``. The machine this was written on was shared and
loaded: times are single runs and noisy; memory is what it is.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
WORLD_SIZE = 8
BATCH_SIZE = 32


def memory(pid: int) -> dict[str, float]:
    """RSS and PSS of process ``pid`` in MiB, and the PSS of its maps of ``index.columns`` and of the node's
    plan files (page cache that the node's processes share: a page mapped by k
    processes counts 1/k in each)."""
    fields = {"rss": 0.0, "pss": 0.0, "index_pss": 0.0, "plan_pss": 0.0}
    mapping = ""
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if (
                "-" in name
                and " " in line
                and not name.endswith(("Rss", "Pss"))
                and name[0] in "0123456789abcdef"
            ):
                parts = line.split()
                mapping = parts[5] if len(parts) > 5 else ""
            elif name in ("Rss", "Pss"):
                value = int(rest.split()[0]) / 1024
                fields[name.lower()] += value
                if name == "Pss" and mapping.endswith("index.columns"):
                    fields["index_pss"] += value
                elif name == "Pss" and f"{os.sep}plans{os.sep}" in mapping:
                    fields["plan_pss"] += value
    return {k: round(v, 1) for k, v in fields.items()}


def build(root: Path, n: int, per_shard: int) -> None:
    """A dataset of ``n`` samples: links to one real shard of ``per_shard`` samples, and its index."""
    from shardio import Index, ShardInfo, ShardWriter
    from shardio.shards.keys import Keys

    if (root / "index.json").exists():
        return
    base = root.parent / f"base-{per_shard}"
    if not (base / "index.json").exists():
        import io

        import soundfile

        generator = np.random.default_rng(0)
        with ShardWriter(base, max_samples=per_shard) as writer:
            for i in range(per_shard):
                frames = int(generator.integers(400, 1600))
                buffer = io.BytesIO()
                soundfile.write(
                    buffer,
                    generator.uniform(-0.5, 0.5, frames).astype(np.float32),
                    8000,
                    subtype="PCM_16",
                    format="WAV",
                )
                writer.write(
                    f"utt{i:05d}",
                    {"wav": buffer.getvalue(), "json": json.dumps({"text": "x"}).encode()},
                    audio_ext="wav",
                    num_frames=frames,
                    sample_rate=8000,
                    channels=1,
                )
    one = Index.load(base)
    shard = one.shards[0]
    count = n // per_shard
    root.mkdir(parents=True, exist_ok=True)
    names = [f"shard-{i:06d}.tar" for i in range(count)]
    one_shard = root / "_one.tar"  # inside the root: links that leave it are refused (allow_outside_root)
    if not one_shard.exists():
        try:
            os.link(base / shard.name, one_shard)
        except OSError:
            shutil.copyfile(base / shard.name, one_shard)
    for name in names:
        if not (root / name).exists():
            os.symlink(one_shard.name, root / name)
    columns = {name: np.tile(np.asarray(column), count) for name, column in one.columns.items()}
    columns["shard"] = np.repeat(np.arange(count, dtype=np.uint32), per_shard)
    blob = bytes(one.keys.blob) * count
    ends = (
        np.arange(count, dtype=np.uint64)[:, None] * np.uint64(len(one.keys.blob))
        + np.asarray(one.keys.ends)[None, :]
    ).ravel()
    index = Index(
        root=str(root),
        shards=[
            ShardInfo(
                name=name, bytes=shard.bytes, sha256=shard.sha256, samples=per_shard, duration=shard.duration
            )
            for name in names
        ],
        formats=list(one.formats),
        columns=columns,
        _keys=Keys(blob, ends),
    )
    index.save(str(root))


def child(root: str, workers: int, context: str) -> dict[str, Any]:
    """One case, in this (fresh) process."""
    import torch
    from torch.utils.data import DataLoader

    import shardio  # noqa: F401
    from shardio import ShardDataset, World

    baseline = memory(os.getpid())
    started = time.perf_counter()
    dataset = ShardDataset(root, batch_size=BATCH_SIZE, world=World(rank=0, world_size=WORLD_SIZE))
    constructed = time.perf_counter() - started
    started = time.perf_counter()
    dataset.set_epoch(0)  # as a training loop does before each epoch: this rank's plan, made here once
    planned = time.perf_counter() - started
    after_construct = memory(os.getpid())
    ctx = multiprocessing.get_context(context)
    server_s = 0.0
    if context == "forkserver" and workers:
        # the server imports torch and shardio once; workers forked from it start without importing them. Its
        # start (once per job, whatever the dataset) is timed apart from the first batch.
        ctx.set_forkserver_preload(["torch", "shardio.datasets.dataset"])
        started = time.perf_counter()
        from multiprocessing import forkserver

        forkserver.ensure_running()
        ready = ctx.Process(target=_noop)  # the server answers once its preloads are imported: wait for that
        ready.start()
        ready.join()
        server_s = time.perf_counter() - started
    started = time.perf_counter()
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, multiprocessing_context=ctx if workers else None
    )
    batches = iter(loader)
    batch = next(batches)
    first = time.perf_counter() - started
    assert isinstance(batch["audio"], torch.Tensor)
    result: dict[str, Any] = {
        "construct_s": round(constructed, 3),
        "set_epoch_s": round(planned, 3),
        "first_batch_s": round(first, 3),
        "forkserver_start_s": round(server_s, 3),
        "train_baseline": baseline,
        "train_after_construct": after_construct,
        "train": memory(os.getpid()),
        "state_bytes": len(json.dumps(dataset.state_dict())),
    }
    if workers:
        result["workers"] = [memory(w.pid) for w in batches._workers]  # type: ignore[attr-defined]
        ready, release = ctx.Event(), ctx.Event()
        idle = ctx.Process(target=_idle_worker, args=(ready, release))
        idle.start()
        ready.wait(120)
        result["worker_baseline"] = memory(idle.pid)  # type: ignore[arg-type]
        release.set()
        idle.join()
    del batches
    return result


def node_rank(root: str, rank: int, cache: str) -> dict[str, Any]:
    """One rank of a node, in this (fresh) process: construct, ``set_epoch(0)``, and what planning took."""
    os.environ["SHARDIO_CACHE_DIR"] = cache  # the node's cache, shared by its ranks (plan files)
    from shardio import ShardDataset, World

    dataset = ShardDataset(root, batch_size=BATCH_SIZE, world=World(rank=rank, world_size=WORLD_SIZE))
    before = memory(os.getpid())["rss"]
    with open("/proc/self/clear_refs", "w") as handle:  # "5": the peak RSS (VmHWM) starts again from now
        handle.write("5")
    started = time.perf_counter()
    dataset.set_epoch(0)
    planned = time.perf_counter() - started
    with open("/proc/self/status") as handle:
        peak = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) / 1024
    return {
        "rank": rank,
        "set_epoch_s": round(planned, 3),
        "transient_mib": round(max(0.0, peak - before), 1),
        "batches": len(dataset),
    }


def run_node(root: Path, ranks: int) -> dict[str, Any]:
    """``ranks`` processes of one node, started together (see :func:`node_rank`), with a fresh node cache."""
    import tempfile

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    with tempfile.TemporaryDirectory(prefix="shardio-node-") as cache:
        started = time.perf_counter()
        children = [
            subprocess.Popen(
                [sys.executable, __file__, "--child-rank", str(root), str(rank), cache],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for rank in range(ranks)
        ]
        outs = [child.communicate(timeout=1800) for child in children]
        wall = time.perf_counter() - started
    for child, (_, err) in zip(children, outs):
        if child.returncode != 0:
            raise RuntimeError(err[-3000:])
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return {
        "ranks": ranks,
        "wall_s": round(wall, 2),
        "slowest_set_epoch_s": max(r["set_epoch_s"] for r in results),
        "node_transient_mib": round(sum(r["transient_mib"] for r in results), 1),
        "per_rank": results,
    }


def _noop() -> None:
    pass


def _idle_worker(ready: Any, release: Any) -> None:
    import shardio.datasets.dataset  # noqa: F401  (what a DataLoader worker imports)

    ready.set()
    release.wait(120)


def run_case(root: Path, workers: int, context: str) -> dict[str, Any]:
    # plans are computed once per node and kept as files (shardio.runtime.planfiles): a case that found the
    # previous case's would time a lookup, so each case starts without them (the index's hash markers stay)
    shutil.rmtree(os.path.join(os.environ["SHARDIO_CACHE_DIR"], "plans"), ignore_errors=True)
    code = [sys.executable, __file__, "--child", str(root), str(workers), context]
    out = subprocess.run(
        code,
        capture_output=True,
        text=True,
        timeout=1800,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
            ),
        },
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# shardio scale",
        "",
        report["note"],
        "",
        "PSS excess: over the baseline process (the training process right after its imports; a worker that "
        "only imported shardio), leaving out the shared page cache of the mapped `index.columns` and of the "
        "node's plan files (their PSS: the `index / plan` figures in brackets).",
        "",
        "| samples | index B/sample | state B | case | construct s | set_epoch s | first batch s "
        "| train PSS excess MiB (index / plan) | each worker's PSS excess MiB (index / plan) | worker RSS "
        "MiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for size in report["sizes"]:
        for case in size["cases"]:

            def excess(now: dict[str, float], base: dict[str, float]) -> str:
                plan = now.get("plan_pss", 0.0)
                return (
                    f"{now['pss'] - now['index_pss'] - plan - base['pss']:+.0f} ({now['index_pss']:.0f} "
                    f"/ {plan:.0f})"
                )

            workers = case.get("workers", [])
            wpss = " / ".join(excess(w, case["worker_baseline"]) for w in workers)
            wrss = " / ".join(f"{w['rss']:.0f}" for w in workers)
            lines.append(
                f"| {size['samples']:,} | {size['index_bytes_per_sample']:.1f} | {case['state_bytes']} "
                f"| {case['name']} | {case['construct_s']:.2f} | {case['set_epoch_s']:.2f} "
                f"| {case['first_batch_s']:.2f} | {excess(case['train'], case['train_baseline'])} "
                f"| {wpss or '-'} | {wrss or '-'} |"
            )
    nodes = [size for size in report["sizes"] if "node" in size]
    if nodes:
        lines += [
            "",
            "Ranks of one node starting an epoch together (each constructs and calls `set_epoch(0)`); "
            "planning memory: each rank's peak RSS while planning above its RSS before, summed.",
            "",
            "| samples | ranks | slowest set_epoch s | each rank's set_epoch s | planning memory, node MiB "
            "| each rank's MiB |",
            "|---|---:|---:|---|---:|---|",
        ]
        for size in nodes:
            node = size["node"]
            times = " / ".join(f"{r['set_epoch_s']:.2f}" for r in node["per_rank"])
            peaks = " / ".join(f"{r['transient_mib']:.0f}" for r in node["per_rank"])
            lines.append(
                f"| {size['samples']:,} | {node['ranks']} | {node['slowest_set_epoch_s']:.2f} | {times} "
                f"| {node['node_transient_mib']:.0f} | {peaks} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--data", default=None, help="where the synthetic datasets go (default: a temp dir)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--node-ranks",
        type=int,
        default=0,
        help="also start this many ranks of one node at once and measure their planning",
    )
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-rank", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2])))
        return 0
    if args.child_rank:
        print(json.dumps(node_rank(args.child_rank[0], int(args.child_rank[1]), args.child_rank[2])))
        return 0
    import tempfile

    from shardio.bench.report import write_results

    data = Path(args.data or tempfile.gettempdir()) / "shardio-scale"
    os.environ["SHARDIO_CACHE_DIR"] = str(data / "cache")  # the benchmark's own node cache, not the user's
    sizes = []
    for n in args.sizes:
        root = data / f"n{n}"
        started = time.perf_counter()
        build(root, n, args.per_shard)
        built = time.perf_counter() - started
        index_bytes = sum(os.path.getsize(root / name) for name in ("index.json", "index.columns"))
        cases = []
        for name, workers, context in [
            ("0 workers", 0, "fork"),
            ("2 workers, fork", 2, "fork"),
            ("2 workers, forkserver", 2, "forkserver"),
        ]:
            case = run_case(root, workers, context)
            cases.append({"name": name, **case})
            print(
                f"{n:>11,} {name:<22} construct {case['construct_s']:.2f} s, first batch "
                f"{case['first_batch_s']:.2f} s, train PSS {case['train']['pss']:.0f} MiB",
                flush=True,
            )
        entry = {
            "samples": n,
            "shards": n // args.per_shard,
            "build_s": round(built, 1),
            "index_bytes_per_sample": index_bytes / n,
            "cases": cases,
        }
        if args.node_ranks:
            entry["node"] = run_node(root, args.node_ranks)
            print(
                f"{n:>11,} {args.node_ranks} ranks of a node: slowest set_epoch "
                f"{entry['node']['slowest_set_epoch_s']:.2f} s, planning memory "
                f"{entry['node']['node_transient_mib']:.0f} MiB in all",
                flush=True,
            )
        sizes.append(entry)
    given = list(argv if argv is not None else sys.argv[1:])
    for flag in ("--data", "--out"):  # where this machine keeps them: not for the results
        if flag in given[:-1]:
            given[given.index(flag) + 1] = "DIR"
    report = {
        "command": "python benchmarks/scale.py " + " ".join(given),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average_start": os.getloadavg(),
        },
        "note": (
            f"world {WORLD_SIZE} (rank 0), batch_size {BATCH_SIZE}; one run per case in a fresh process; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (a shared, loaded machine)."
        ),
        "sizes": sizes,
    }
    write_results(args.out, "scale", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
