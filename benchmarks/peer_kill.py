"""Each peer's resume after a real kill, for ``benchmarks/peers.py``: a child process iterates the peer's
loader over a packed corpus, logs each batch's keys as it consumes it and saves the loader's state every few
batches (pickled, as ``torch.save`` keeps a checkpoint); the parent SIGKILLs the child's whole process group
(its DataLoader workers with it, as when a node dies) mid-epoch; a new child loads the last saved state and
reads to the end of the epoch. The keys of the batches up to that checkpoint, then the restarted child's, are
compared with a straight epoch read by a third child: the same keys in the same order (exact), and otherwise
how many samples came twice (repeated) or never (skipped).

A peer without a mechanism (WebDataset) is not run: a restarted job begins its epoch again.

``python benchmarks/peer_kill.py PEER OUT SIZE WORKERS CHECKPOINT LOG [--every N] [--pause S] [--resume]``
is the child (the parent's :func:`killed` starts it).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from peer_reading import RESUMABLE

HERE = Path(__file__).resolve().parent
EVERY = 5  # a checkpoint every this many batches
KILL_AFTER = 22  # batches consumed when the parent kills the child (not a multiple of EVERY: some are lost)
PAUSE = 0.05  # seconds a batch takes in the killed child (a training step), so that the kill lands mid-epoch
START_LIMIT = 600.0  # seconds for the child to reach the kill (imports and a loaded machine included)


def child(peer: str, out: Path, size: int, workers: int, checkpoint: Path, log: Path, args: Any) -> None:
    """Read ``peer``'s epoch (from ``checkpoint`` with ``args.resume``), appending each batch's keys to
    ``log`` as a JSON line and, every ``args.every`` batches (when given), the loader's state to
    ``checkpoint`` (written whole, then renamed over the last)."""
    make, batches = RESUMABLE[peer]
    loader = make(out, size, workers)
    if args.resume:
        with checkpoint.open("rb") as handle:
            loader.load_state_dict(pickle.load(handle)["state"])
    with log.open("a", buffering=1) as lines:
        for number, keys in enumerate(batches(loader), 1):
            lines.write(json.dumps(keys) + "\n")
            if args.every and number % args.every == 0:
                partial = checkpoint.with_suffix(".partial")
                with partial.open("wb") as handle:
                    pickle.dump({"batches": number, "state": loader.state_dict()}, handle)
                os.replace(partial, checkpoint)
            time.sleep(args.pause)


def _logged(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("]")]


def _command(peer: str, out: Path, size: int, workers: int, checkpoint: Path, log: Path) -> list[str]:
    return [sys.executable, str(HERE / "peer_kill.py"), peer, str(out), str(size), str(workers)] + [
        str(checkpoint),
        str(log),
    ]


def _environment() -> dict[str, str]:
    """This process's environment, with the repository and benchmarks/ on the child's import path."""
    paths = [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def killed(peer: str, out: Path, size: int, workers: int) -> dict[str, Any] | None:
    """``peer``'s resume after a SIGKILL on the corpus packed at ``out`` (batches of ``size``, ``workers``
    DataLoader workers): where the kill landed, the checkpoint resumed from, and the keys against a straight
    epoch; None where the peer has no mechanism."""
    if peer not in RESUMABLE:
        return None
    with tempfile.TemporaryDirectory(prefix="shardio-peer-kill-") as tmp:
        work = Path(tmp)
        checkpoint, env = work / "checkpoint.pkl", _environment()
        straight_log = work / "straight.jsonl"
        subprocess.run(
            _command(peer, out, size, workers, work / "unused.pkl", straight_log) + ["--pause", "0"],
            check=True,
            env=env,
        )
        log = work / "killed.jsonl"
        process = subprocess.Popen(
            _command(peer, out, size, workers, checkpoint, log) + ["--every", str(EVERY)],
            env=env,
            start_new_session=True,  # its own process group: the kill takes its workers too
        )
        deadline = time.monotonic() + START_LIMIT
        while len(_logged(log)) < KILL_AFTER and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = process.poll() is not None
        if not ended:
            os.killpg(process.pid, signal.SIGKILL)
        if process.wait() not in (0, -signal.SIGKILL):
            raise RuntimeError(f"{peer}: the child to be killed failed (exit {process.returncode})")
        consumed = _logged(log)
        saved_at = 0  # killed before its first checkpoint: the restart begins the epoch
        if checkpoint.exists():
            with checkpoint.open("rb") as handle:
                saved_at = int(pickle.load(handle)["batches"])
        restart_log = work / "restart.jsonl"
        subprocess.run(
            _command(peer, out, size, workers, checkpoint, restart_log)
            + ["--pause", "0"]
            + (["--resume"] if saved_at else []),
            check=True,
            env=env,
        )
        straight = [key for keys in _logged(straight_log) for key in keys]
        resumed = [key for keys in consumed[:saved_at] for key in keys]
        resumed += [key for keys in _logged(restart_log) for key in keys]
    return dict(
        killed_after=len(consumed),
        ended_before_kill=ended,
        checkpoint=saved_at,
        exact=resumed == straight,
        repeated=sum((Counter(resumed) - Counter(straight)).values()),
        skipped=sum((Counter(straight) - Counter(resumed)).values()),
        samples=len(straight),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(RESUMABLE))
    parser.add_argument("out", type=Path, help="the peer's packed corpus")
    parser.add_argument("size", type=int, help="samples a batch")
    parser.add_argument("workers", type=int, help="DataLoader workers")
    parser.add_argument("checkpoint", type=Path, help="the loader's state, saved or resumed from")
    parser.add_argument("log", type=Path, help="each batch's keys, a JSON line each")
    parser.add_argument("--every", type=int, default=0, help="save the state every N batches (0: never)")
    parser.add_argument("--pause", type=float, default=PAUSE, help="seconds after each batch")
    parser.add_argument("--resume", action="store_true", help="load the checkpoint first")
    args = parser.parse_args()
    child(args.peer, args.out, args.size, args.workers, args.checkpoint, args.log, args)


if __name__ == "__main__":
    main()
