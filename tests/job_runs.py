"""Running a trainer's job (Lightning, ``accelerate launch``) in a session of its own,
to its end or its limit.

A job that outlives its limit is a hang to explain, not only to report: every process of its session (the
ranks, their DataLoader workers) is asked for its Python stacks first (the jobs register ``faulthandler`` on
``SIGUSR1``, each process writing to a file of its own, forked workers too), then all are killed, and the
error shows the process table (state and kernel wait channel of each) and those stacks. A rare hang of 3 ranks
x 2 forked workers on 2 cores was seen with only the table: one worker single-threaded in a futex wait, its
rank and the others polling.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "SPEECHBRAIN_PYTHON",
    "STACKS_SIGNAL",
    "dump_stacks_on_signal",
    "job_environment",
    "needs_speechbrain",
    "run_in_session",
    "run_python",
]

STACKS_SIGNAL = signal.SIGUSR1
SPEECHBRAIN_PYTHON = os.environ.get("SHARDIO_SPEECHBRAIN_PYTHON", "")
"""The Python of a virtualenv made for SpeechBrain (``TORCH_SPEC=torch==2.9.1 bash tools/setup.sh ENV
test,speechbrain``: the torch and torchaudio pair ``shardio[speechbrain]`` installs), which SpeechBrain's jobs
run in; SpeechBrain imports torchaudio, which does not load against the torch of the other environments."""


def needs_speechbrain() -> Any:
    """A skip mark for a test that runs SpeechBrain, where :data:`SPEECHBRAIN_PYTHON` is not set."""
    import pytest

    return pytest.mark.skipif(
        not SPEECHBRAIN_PYTHON or not Path(SPEECHBRAIN_PYTHON).exists(),
        reason="SHARDIO_SPEECHBRAIN_PYTHON is not set (tests/README.md)",
    )


def job_environment(python: str = "") -> dict[str, str]:
    """The environment of a job or snippet run by ``python`` (default: this interpreter): the repository and
    tests/ first on its path, warnings off; this interpreter's own path too, but never in another
    environment's (its packages are not built for that one's torch)."""
    tests = Path(__file__).parent
    inherited = [] if python and python != sys.executable else sys.path
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests), *inherited]),
        "PYTHONWARNINGS": "ignore",
    }


def dump_stacks_on_signal() -> None:
    """In a job: on :data:`STACKS_SIGNAL`, write every thread's Python stack to ``stacks-{pid}.txt`` in the
    working directory; forked children (DataLoader workers) get a file of their own."""
    stacks = open(f"stacks-{os.getpid()}.txt", "w")  # noqa: SIM115 - open for the process's life
    _OPEN.append(stacks)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True)
    if len(_OPEN) == 1:
        os.register_at_fork(after_in_child=dump_stacks_on_signal)


_OPEN: list[object] = []


def run_in_session(command: list[str], *, env: dict[str, str], cwd: Path, limit: float) -> tuple[str, int]:
    """Run ``command`` in a new session to its end, at most ``limit`` seconds; its output (stdout and stderr)
    and exit code. Past the limit, an ``AssertionError`` with the session's processes and their stacks."""
    process = subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        listing = subprocess.run(
            ["ps", "-o", "pid,ppid,stat,wchan:32,etime,args", "-s", str(process.pid)],
            capture_output=True,
            text=True,
        ).stdout
        for line in listing.splitlines()[1:]:
            try:
                os.kill(int(line.split()[0]), STACKS_SIGNAL)
            except (ValueError, IndexError, ProcessLookupError):
                pass
        time.sleep(2)
        _kill_session(process.pid)
        output, _ = process.communicate()
        stacks = "".join(
            f"-- process {path.stem[7:]}:\n{path.read_text()}"
            for path in sorted(cwd.glob("stacks-*.txt"))
            if path.stat().st_size
        )
        raise AssertionError(
            f"the job's processes outlived {limit:g} s:\n{listing}\n{stacks[-16000:]}\n"
            f"the job's last output:\n{output[-4000:]}"
        ) from None
    finally:
        _kill_session(process.pid)  # a rank left behind, should one outlive the job's first process
    return output, process.returncode


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_python(code: str, *, timeout: float, python: str = "") -> str:
    """Run ``code`` in a new interpreter (``python``, default this one; environment: :func:`job_environment`)
    within ``timeout`` seconds; its output. It must exit 0 (the assertion shows its stderr's tail)."""
    done = subprocess.run(
        [python or sys.executable, "-c", code],
        env=job_environment(python),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
