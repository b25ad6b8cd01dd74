"""Launching a group of rank processes for gloo tests, under a wall-clock limit so that a hang fails.

Ranks fork from a ``forkserver`` that imported torch once (not from pytest). Each rank gets ``(rank,
world_size, port, config)``, writes its result to ``{out}/rank{rank}.json`` and, when it fails, its traceback
to ``rank{rank}.error`` (a hung rank may also leave its stacks in ``rank{rank}.stacks``).
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import multiprocessing.context
import os
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

__all__ = ["errors", "free_port", "join_gloo", "run_group", "run_rank"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def errors(out: Path) -> str:
    """The tracebacks (and a hung rank's stacks) that rank processes recorded, for failure messages."""
    found = sorted([*out.glob("*.error"), *out.glob("*.stacks")])
    return "\n".join(f"--- {path.name} ---\n{path.read_text()}" for path in found if path.stat().st_size)


def run_group(
    target: Callable[[int, int, int, dict[str, Any]], None],
    world_size: int,
    config: dict[str, Any],
    out: Path,
    *,
    timeout_s: float,
    preload: Sequence[str] = ("torch", "torch.distributed", "shardio"),
    exit_code: int = 0,
) -> list[dict[str, Any]]:
    """Run ``world_size`` processes of ``target`` (a module-level function) to completion; each rank's result.

    ``config`` reaches every rank with ``out`` added; ``exit_code`` is what every rank must end with
    (``-SIGKILL`` for a group that kills itself). A rank still alive after ``timeout_s`` fails the test.
    """
    out.mkdir(parents=True)
    port = free_port()
    ctx = cast(multiprocessing.context.ForkServerContext, multiprocessing.get_context("forkserver"))
    ctx.set_forkserver_preload(list(preload))
    processes = [
        ctx.Process(
            target=target, args=(rank, world_size, port, {**config, "out": str(out)}), name=f"rank{rank}"
        )
        for rank in range(world_size)
    ]
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout_s
        for process in processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
        hung = [p.name for p in processes if p.is_alive()]
        assert not hung, f"{hung} did not finish in {timeout_s:.0f} s (a hang?)\n" + errors(out)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    codes = [p.exitcode for p in processes]
    assert codes == [exit_code] * world_size, f"rank exit codes {codes}\n" + errors(out)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]


def run_rank(
    train: Callable[[int, int, int, dict[str, Any]], None],
    rank: int,
    world_size: int,
    port: int,
    config: dict[str, Any],
    *,
    stacks_after_s: float,
) -> None:
    """One rank: ``train(rank, world_size, port, config)``, its traceback recorded in
    ``rank{rank}.error`` under ``config["out"]`` and, still running after ``stacks_after_s``, its stacks in
    ``rank{rank}.stacks``."""
    out = Path(config["out"])
    # A forkserver child inherits "forkserver" as its default start method; a torchrun rank on Linux
    # (Python < 3.14) forks its DataLoader workers, so this one does too.
    multiprocessing.set_start_method("fork", force=True)
    with open(out / f"rank{rank}.stacks", "w") as stacks:  # a hung rank's stacks, for the failure message
        faulthandler.dump_traceback_later(stacks_after_s, file=stacks)
        try:
            train(rank, world_size, port, config)
        except BaseException:
            (out / f"rank{rank}.error").write_text(traceback.format_exc())
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()


def join_gloo(rank: int, world_size: int, port: int, timeout_s: float) -> None:
    """Join a gloo group on 127.0.0.1:``port`` as rank ``rank`` of ``world_size``, with the environment
    torchrun sets and one torch thread; a collective waits ``timeout_s`` at most."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
        }
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
