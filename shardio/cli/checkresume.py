"""``shardio check-resume``: run a user's training command straight, then killed with SIGKILL and
restarted, and compare what each trained on (their yield logs, :mod:`shardio.runtime.yieldlog`; the
comparison: :mod:`shardio.cli.resumecompare`).

A pair as in :mod:`shardio.cli.main`: ``add_check_resume(subparsers)`` builds its parser and sets ``run``.
Everything it writes is in ``--workdir``: ``straight/`` and ``resumed/`` (the command's working directories,
where its checkpoints land), ``logs/`` (the yield logs and each run's output), each marked as ours; an entry
of those names that we did not make is refused, never deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..errors import OptionError, OutputError, shown
from ..runtime.yieldlog import ENV, KEYS_ENV, read_log
from .argtypes import at_least, non_negative
from .jobruns import Ending, run_part
from .resumecompare import compare_runs

__all__ = ["CHECK_EXIT_CODES", "STEPS_ENV", "add_check_resume"]

STEPS_ENV = "SHARDIO_STEPS"
"""The environment variable that carries ``--steps`` to the user's job (its scripts stop after that many)."""

MARK = ".shardio-check-resume"
"""The file that marks a directory as check-resume's own (the only kind it removes)."""

CHECK_EXIT_CODES = {
    0: "exact: the restarted run trained on what the straight run did",
    1: "the runs differ (the first difference is reported)",
    4: "the job failed on its own (exited with an error, or outlived --timeout), not a difference",
    5: "nothing to check: the job ended before the kill, or yielded no batch with the yield log on",
}
"""``check-resume``'s own exit codes (2 and 3 as every subcommand's)."""


def add_check_resume(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-resume",
        help="check that a training command resumes exactly after a SIGKILL",
        description="Run COMMAND straight, then again killed with SIGKILL (every process of it) and "
        "restarted --resumes times, with the yield log on; compare the batches each trained on, rank by "
        "rank, step by step. Exit: "
        + "; ".join(f"{code} {meaning}" for code, meaning in CHECK_EXIT_CODES.items()),
    )
    kill = parser.add_mutually_exclusive_group()
    kill.add_argument(
        "--kill-at", type=at_least(1), metavar="STEP", help="kill once rank 0 has yielded STEP batches"
    )
    kill.add_argument("--kill-after", type=non_negative(), metavar="SECONDS", help="kill after SECONDS")
    parser.add_argument("--resumes", type=at_least(1), default=1, metavar="N", help="restarts (default 1)")
    parser.add_argument(
        "--workdir", default=None, metavar="DIR", help="where the runs work (default: a temporary one)"
    )
    parser.add_argument(
        "--link", action="append", default=[], metavar="PATH", help="link PATH into each run's directory"
    )
    parser.add_argument("--steps", type=at_least(1), default=None, metavar="N", help=f"export {STEPS_ENV}=N")
    parser.add_argument(
        "--world", type=at_least(1), default=1, metavar="W", help="{world} in COMMAND (default 1)"
    )
    parser.add_argument(
        "--resume-world", type=at_least(1), default=None, metavar="W2", help="{world} after the first kill"
    )
    parser.add_argument("--timeout", type=non_negative(), default=3600.0, metavar="SECONDS", help="per run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workdir")
    parser.add_argument(
        "job", nargs=argparse.REMAINDER, type=str, metavar="COMMAND", help="-- then the training command"
    )
    parser.set_defaults(run=_run_check_resume)


def _own_dir(path: Path) -> Path:
    """``path`` made empty and marked ours; an entry there that is not ours is refused."""
    if path.is_symlink() or (path.exists() and not (path / MARK).is_file()):
        raise OutputError(
            f"{shown(str(path))} exists and was not made by check-resume: choose another --workdir"
        )
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARK).touch()
    return path


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise OptionError(
            "give the training command after --: shardio check-resume --kill-at 5 -- python train.py"
        )
    if args.kill_at is None and args.kill_after is None:
        raise OptionError("give --kill-at STEP or --kill-after SECONDS")
    if args.resume_world is not None and not any("{world}" in part for part in command):
        raise OptionError(
            "--resume-world needs {world} in the command (torchrun --nproc_per_node={world} ...)"
        )
    return command


def _with_world(command: list[str], world: int) -> list[str]:
    return [part.replace("{world}", str(world)) for part in command]


def _tail(path: Path, lines: int = 12) -> str:
    text = path.read_bytes()[-8000:].decode("utf-8", "replace")
    return "\n".join("  | " + line for line in text.splitlines()[-lines:])


def _died(name: str, ending: Ending, output: Path) -> int:
    how = (
        f"outlived --timeout ({ending.seconds:.0f} s) and was killed"
        if ending.timed_out
        else f"exited with code {ending.code} on its own (not killed by check-resume)"
    )
    print(
        f"the {name} run {how}, after {ending.steps} batches on rank 0: the job fails by itself, not a "
        f"resume difference; its last output ({output}):\n{_tail(output)}"
    )
    return 4


def _run_check_resume(args: argparse.Namespace) -> int:
    command = _command(args)
    links = [Path(p).absolute() for p in args.link]
    for link in links:
        if not link.exists():
            raise OptionError(f"--link {shown(str(link))} does not exist")
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="shardio-check-resume-") if temporary else args.workdir).absolute()
    try:
        return _check(args, command, workdir, links)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif temporary:
            print(f"the runs are kept in {workdir}")


def _check(args: argparse.Namespace, command: list[str], workdir: Path, links: list[Path]) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    logs = _own_dir(workdir / "logs")
    base = dict(os.environ)
    base.pop(ENV, None)
    if args.steps is not None:
        base[STEPS_ENV] = str(args.steps)
    if args.resume_world is not None:
        base[KEYS_ENV] = "1"

    def part(name: str, world: int, kill: bool, cwd: Path) -> Ending:
        env = {**base, ENV: str(logs / name), "SHARDIO_CHECK_RESUME_RUN": name}
        return run_part(
            _with_world(command, world),
            cwd=cwd,
            env=env,
            output=logs / f"{name}.out",
            log=logs / name,
            kill_at=args.kill_at if kill else None,
            kill_after=args.kill_after if kill else None,
            limit=args.timeout,
        )

    runs = {}
    for name in ("straight", "resumed"):
        runs[name] = _own_dir(workdir / name)
        for link in links:
            (runs[name] / link.name).symlink_to(link)
    print(f"straight run: {' '.join(_with_world(command, args.world))}", flush=True)
    straight = part("straight", args.world, False, runs["straight"])
    if straight.killed or straight.code != 0:
        return _died("straight", straight, logs / "straight.out")
    names = [f"resumed-{n}" for n in range(args.resumes + 1)]
    for number, name in enumerate(names):
        world = args.world if number == 0 or args.resume_world is None else args.resume_world
        last = number == len(names) - 1
        ending = part(name, world, not last, runs["resumed"])
        if not ending.killed and ending.code != 0 or ending.timed_out:
            return _died(name, ending, logs / f"{name}.out")
        if not last and not ending.killed:
            print(
                f"the {name} run ended by itself after {ending.steps} batches on rank 0, before the kill: "
                f"nothing to check (give a smaller --kill-at or --kill-after)"
            )
            return 5
        what = "killed (SIGKILL) after" if ending.killed else "ended after"
        on = f" (world {world})" if args.resume_world is not None else ""
        print(f"{name} run{on}: {what} {ending.steps} batches on rank 0", flush=True)
    verdict = compare_runs(
        read_log(str(logs / "straight")),
        [read_log(str(logs / name)) for name in names],
        exactly_once=args.resume_world is not None,
    )
    print("\n".join(verdict.lines))
    sys.stdout.flush()
    return 0 if verdict.exact else 5 if verdict.kind == "nothing" else 1
