"""The ``shardio`` command line: ``pack``, ``inspect``, ``verify``, ``index``, ``demo``, ``bench``, ``trace``,
``quarantine``, ``remix``, ``cache``, ``check-resume``.

Each subcommand is two small functions: ``_add_NAME(subparsers)`` builds its parser and sets ``run`` to
``_run_NAME(args) -> exit code``. To add one, write the pair and list the first in :data:`SUBCOMMANDS`
(``pack`` lives in :mod:`shardio.cli.pack`, the dataset's ``inspect``, ``verify`` and ``index`` in
:mod:`shardio.cli.shards`, the data ledger's in :mod:`shardio.cli.ledger` and :mod:`shardio.cli.remix`,
``cache`` in :mod:`shardio.cli.cache`, ``check-resume`` in :mod:`shardio.cli.checkresume`). Exit codes
(:data:`EXIT_CODES`): 0 success, 1 ``verify`` found problems (``check-resume``: the runs differ), 2 bad usage
or a :class:`~shardio.errors.ShardioError` (bad options, inputs, missing or unreadable ones too, or dataset),
3 an output that cannot be written (:class:`~shardio.errors.OutputError`), or the system's own error, 4 and 5
``check-resume``'s job failing by itself or ending before the kill, 130 interrupted, 141 stdout closed early
(``| head``; no message). Every error is one line
on stderr (an :class:`~shardio.errors.InputError` adds one line per input), no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..errors import OutputError, ShardioError, shown_path
from .argtypes import PATH_OPTIONS, at_least, non_negative, parse_size, path, worker_count
from .cache import add_cache
from .checkresume import CHECK_EXIT_CODES, add_check_resume
from .demo import MAX_WORKERS as MAX_DEMO_WORKERS
from .ledger import add_quarantine, add_trace
from .pack import add_pack
from .remix import add_remix
from .shards import add_index, add_inspect, add_verify

__all__ = ["EXIT_CODES", "SUBCOMMANDS", "build_parser", "main", "parse_size"]

EXIT_CODES = {
    0: "success",
    1: "verify found problems; check-resume: the runs differ",
    2: "bad usage, options, inputs or dataset",
    3: "an output cannot be written (or another run holds it), or a system error",
    4: "check-resume: " + CHECK_EXIT_CODES[4],
    5: "check-resume: " + CHECK_EXIT_CODES[5],
    130: "interrupted",
    141: "stdout was closed early (a pipe into head)",
}
"""What each exit status of ``shardio`` means."""

_POSITIVE = at_least(1)


# -- demo --------------------------------------------------------------------------------------------


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job on a built-in synthetic corpus",
        description="Make a small synthetic speech corpus, pack it, read one epoch back "
        "through ShardDataset, interrupt and resume it, print a summary.",
    )
    parser.add_argument("out_dir", nargs="?", default="demo-out", help="where to write (default: demo-out)")
    parser.add_argument("--files", type=_POSITIVE, default=200, help="utterances to make (default 200)")
    parser.add_argument(
        "-j",
        "--workers",
        type=worker_count(0, MAX_DEMO_WORKERS),
        default=2,
        help=f"loader and pack workers, 0 to {MAX_DEMO_WORKERS} (default 2)",
    )
    parser.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    summary = run_demo(args.out_dir, num_files=args.files, workers=args.workers)
    print(
        f"corpus:   {summary['files']} synthetic utterances, {summary['hours'] * 60:.1f} min, in "
        f"{shown_path(summary['corpus_dir'])} ({summary['synth_seconds']:.1f} s)"
    )
    print(
        f"packed:   {summary['shards']} zstd shards, {summary['bytes'] / 1e6:.1f} MB, in "
        f"{shown_path(summary['dataset_dir'])} ({summary['pack_seconds']:.1f} s)"
    )
    print(
        f"read:     {summary['read_back_samples']} samples in {summary['read_back_batches']} batches "
        f"(max 30 padded seconds each) through ShardDataset + ShardLoader({args.workers} workers)"
    )
    print(
        f"resumed:  interrupted at batch {summary['resumed_at_batch']}, resumed from the saved state: "
        f"the same keys as an uninterrupted epoch ({summary['read_back_seconds']:.1f} s)"
    )
    print(f"next:     shardio inspect {shown_path(summary['dataset_dir'])}")
    return 0


# -- bench -------------------------------------------------------------------------------------------


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="read throughput against WebDataset and the decoder floors",
        description="Measure shardio end to end (0/1/2 workers) against WebDataset, the "
        "soundfile and numpy floors, shard compressions, resume latency, "
        "rank balance and training-loop stalls; write JSON, Markdown, PNG.",
    )
    parser.add_argument("dataset", nargs="?", help="a shardio dataset directory (default: generate corpora)")
    parser.add_argument("--out-dir", default="bench-out", help="corpora, datasets and bench.json/.md/.png")
    parser.add_argument(
        "--quick", action="store_true", help="tiny corpora, 2 rounds: a smoke test, not figures"
    )
    parser.add_argument("--reps", type=_POSITIVE, default=None, help="timed rounds (default 5)")
    parser.add_argument("--batch-size", type=_POSITIVE, default=16)
    parser.add_argument(
        "--step-ms",
        type=non_negative("number of milliseconds"),
        default=10.0,
        help="training step of the stall figure (ms)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from ..bench import run_bench

    command = "shardio bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "shardio bench"
    run_bench(
        args.dataset,
        out_dir=args.out_dir,
        quick=args.quick,
        reps=args.reps,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        progress=not args.no_progress,
        command=command,
    )
    print(f"results: {shown_path(os.path.join(args.out_dir, 'bench.json'))}, bench.md, bench.png")
    return 0


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_pack,
    add_inspect,
    add_verify,
    add_index,
    _add_demo,
    _add_bench,
    add_trace,
    add_quarantine,
    add_remix,
    add_cache,
    add_check_resume,
]
"""The functions that add each subcommand's parser, in the order ``--help`` lists them."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error in one line (argparse prints the whole usage block first); the
    subcommands' parsers are of this class too (``add_subparsers`` makes them of its parser's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``shardio`` argument parser with every subcommand in :data:`SUBCOMMANDS`."""
    from ..version import __version__

    codes = "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
    parser = _Parser(
        prog="shardio",
        description="Pack, index, inspect, verify and benchmark audio shards.",
        epilog=f"exit codes: {codes}",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"shardio {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    for sub in subparsers.choices.values():  # -v after the subcommand too; SUPPRESS keeps one given before it
        sub.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help="more log output (-vv for debug)",
        )
        for action in sub._actions:  # every path argument refuses an empty string
            if (
                action.type is None
                and action.nargs != 0
                and (not action.option_strings or action.dest in PATH_OPTIONS)
            ):
                action.type = path
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardio`` command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # a closed pipe shows here (handled below), not as an error at exit
        return code
    except OutputError as exc:
        _error(f"shardio {args.command}: error: {exc}")
        return 3
    except ShardioError as exc:
        _error(f"shardio {args.command}: error: {exc}")
        return 2
    except OSError as exc:  # the system's own error names the file: one line, not a traceback
        if isinstance(exc, BrokenPipeError) and _stdout_gone():  # `shardio trace ... | head`: stop quietly
            return 141
        where = shown_path(exc.filename) if exc.filename is not None else ""
        _error(f"shardio {args.command}: error: {exc.strerror or exc}: {where}".rstrip(": "))
        return 3
    except KeyboardInterrupt:
        print(f"shardio {args.command}: interrupted", file=sys.stderr)
        return 130


def _error(line: str) -> None:
    """Print an error line on stderr; a name's bytes that are not UTF-8 (lone surrogates) as ``\\udcff``,
    whatever stderr's error handler."""
    print(line.encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe its reader closed; if so it now points at /dev/null, so that flushing it at
    exit does not raise the broken pipe again (a broken pipe elsewhere is an error to report)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return True
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return False
