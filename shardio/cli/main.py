"""The ``shardio`` command line: ``pack``, ``inspect``, ``verify``, ``index``, ``demo``, ``bench``, ``trace``,
``quarantine``, ``remix``.

Each subcommand is two small functions: ``_add_NAME(subparsers)`` builds its parser and sets ``run`` to
``_run_NAME(args) -> exit code``. To add one, write the pair and list the first in :data:`SUBCOMMANDS`
(the dataset's ``inspect``, ``verify`` and ``index`` live in :mod:`shardio.cli.shards`, the data ledger's
in :mod:`shardio.cli.ledger`, ``cache`` in :mod:`shardio.cli.cache`).
Exit codes (:data:`EXIT_CODES`): 0 success, 1 ``verify`` found problems, 2 bad usage or a
:class:`~shardio.errors.ShardioError` (bad options, inputs, missing or unreadable ones too, or dataset), 3 an
output that cannot be written (:class:`~shardio.errors.OutputError`), or the system's own error, 130
interrupted, 141 stdout closed early (``| head``; no message). Every error is one line on stderr (an
:class:`~shardio.errors.InputError` adds one line per input), no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ..errors import OptionError, OutputError, ShardioError
from .argtypes import PATH_OPTIONS, at_least, non_negative, parse_size, path, worker_count
from .cache import add_cache
from .demo import MAX_WORKERS as MAX_DEMO_WORKERS
from .ledger import add_quarantine, add_remix, add_trace
from .shards import add_index, add_inspect, add_verify

__all__ = ["EXIT_CODES", "SUBCOMMANDS", "build_parser", "main", "parse_size"]

EXIT_CODES = {
    0: "success",
    1: "verify found problems",
    2: "bad usage, options, inputs or dataset",
    3: "an output cannot be written (or another run holds it), or a system error",
    130: "interrupted",
    141: "stdout was closed early (a pipe into head)",
}
"""What each exit status of ``shardio`` means."""

_POSITIVE = at_least(1)
PACK_MAX_WORKERS = 256
"""The most ``-j`` workers ``shardio pack`` takes (threads, or processes of ``--engine local``)."""

# -- pack --------------------------------------------------------------------------------------------

PACK_EPILOG = """\
keys and metadata (docs/guides/packing.md):
  folder      each audio file (sub-folders too), its transcript in a .txt of the same name beside it;
              key: the path under the folder without its extension (a/b/utt1.wav -> a/b/utt1)
  .jsonl      one JSON object a line:
                audio_filepath  required: the file, absolute or relative to the manifest's folder
                offset, duration  optional, seconds: a segment of the file
                id or key       optional: the key; default the file's stem without folders (a/b/utt1.wav ->
                                utt1; segments: {stem}_{offset in ms, 8 digits}); same stems collide: give ids
                anything else   metadata (text: the transcript; speaker, lang, ...), kept and in each batch
shard size: any number of shards serves any number of ranks x workers (samples are read by their offsets,
  every rank gets the same number of batches); the size changes shuffling windows and remote caching only
  (docs/guides/formats.md)."""


def _add_pack(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pack",
        help="pack a corpus into shards and an index",
        description="Pack an audio folder, JSONL manifest, Kaldi data dir or TSV/CSV "
        "into WebDataset-style shards plus a shardio index.",
        epilog=PACK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "input", help="the corpus: a folder, a .jsonl manifest, a Kaldi data dir or a .tsv/.csv"
    )
    parser.add_argument(
        "out_dir", help="the dataset directory to write (must not hold a dataset yet, unless --overwrite)"
    )
    parser.add_argument(
        "--kind",
        choices=("folder", "jsonl", "kaldi", "tsv", "csv", "hf", "lhotse", "nemo"),
        help="the corpus kind (default: detected from the input)",
    )
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="roll to a new shard after this many tar bytes (default 256MB unless "
        "--samples-per-shard is given)",
    )
    parser.add_argument(
        "--samples-per-shard",
        type=_POSITIVE,
        default=None,
        metavar="N",
        help="roll to a new shard after this many samples (default: no limit)",
    )
    parser.add_argument(
        "--compression",
        choices=("none", "zstd"),
        default="none",
        help="shard compression: none (.tar) or zstd (.tar.zst, seekable frames) (default %(default)s)",
    )
    parser.add_argument(
        "--zstd-level",
        type=int,
        default=None,
        metavar="LEVEL",
        help="zstd level, -7 to 22, with --compression zstd (default 3)",
    )
    parser.add_argument(
        "--transcode",
        choices=("flac", "wav"),
        default=None,
        help="re-encode the audio (default: keep the original bytes)",
    )
    parser.add_argument(
        "--shuffle", action="store_true", help="shuffle the samples (by --seed) before packing"
    )
    parser.add_argument(
        "--seed", type=at_least(0), default=0, help="the seed of --shuffle (default %(default)s)"
    )
    parser.add_argument(
        "-j",
        "--workers",
        type=worker_count(1, PACK_MAX_WORKERS),
        default=None,
        help="threads reading and validating the inputs (default: one per CPU core but one, "
        f"for the writing; 1: the writing thread reads them too; at most {PACK_MAX_WORKERS})",
    )
    parser.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="raise: stop and list every bad input (default); skip: pack the rest and list "
        "the bad ones in rejected.jsonl",
    )
    parser.add_argument("--require-text", action="store_true", help="reject inputs without a transcript")
    parser.add_argument(
        "--rewrite-keys",
        action="store_true",
        help="rewrite keys that break the {key}.{ext} rule (dots in names) instead of rejecting",
    )
    parser.add_argument("--prefix", default="shard", help="shard file name prefix (default 'shard')")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset (or shard files of this prefix) already in OUT_DIR",
    )
    parser.add_argument(
        "--engine",
        choices=("local", "ray"),
        default=None,
        help="pack in partitions run by this engine: local (-j processes) or ray (tasks on the "
        "cluster at --address, or a local one of -j CPUs); see shardio.packing.engines",
    )
    parser.add_argument("--address", default=None, help="the Ray cluster to use ('auto': the running one)")
    parser.add_argument(
        "--partition-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="input bytes per partition with --engine (default 2GB)",
    )
    parser.set_defaults(run=_run_pack)


def _run_pack(args: argparse.Namespace) -> int:
    from ..packing.pack import REJECTED_FILE, describe_left_out, pack

    kind = "tsv" if args.kind == "csv" else args.kind
    if args.zstd_level is not None and args.compression != "zstd":
        raise OptionError(
            f"--zstd-level {args.zstd_level} needs --compression zstd (without it the shards are "
            "not compressed)"
        )
    if args.address is not None and args.engine != "ray":
        raise OptionError("--address names the Ray cluster of --engine ray")
    args.zstd_level = 3 if args.zstd_level is None else args.zstd_level
    if args.engine is not None or args.partition_size is not None:
        return _run_partitioned(args, kind)
    summary = pack(
        args.input,
        args.out_dir,
        kind=kind,
        samples_per_shard=args.samples_per_shard,
        shard_bytes=args.shard_size,
        compression=args.compression,
        zstd_level=args.zstd_level,
        transcode=args.transcode,
        shuffle=args.shuffle,
        seed=args.seed,
        workers=args.workers,
        on_error=args.on_error,
        require_text=args.require_text,
        rewrite_keys=args.rewrite_keys,
        prefix=args.prefix,
        progress=not args.no_progress,
        overwrite=args.overwrite,
    )
    print(
        f"packed {summary.samples} samples ({summary.hours:.3f} h) into {summary.shards} shards, "
        f"{summary.bytes / 1e6:.1f} MB, in {summary.seconds:.1f} s ({summary.mb_per_s:.1f} MB/s of input)"
    )
    if summary.rejected:
        print(f"rejected {len(summary.rejected)} inputs: see {args.out_dir}/{REJECTED_FILE}")
    if summary.left_out:
        print(f"left out: {describe_left_out(summary.left_out)}")
    return 0


def _run_partitioned(args: argparse.Namespace, kind: str | None) -> int:
    from ..packing.engines import pack_partitioned
    from ..packing.pack import REJECTED_FILE
    from ..packing.partitions import DEFAULT_PARTITION_BYTES

    if args.overwrite:
        raise OptionError("--overwrite does not apply to partitioned packing (--engine): use a new directory")
    summary = pack_partitioned(
        args.input,
        args.out_dir,
        engine=args.engine or "local",
        workers=args.workers,
        address=args.address,
        kind=kind,
        partition_bytes=args.partition_size or DEFAULT_PARTITION_BYTES,
        samples_per_shard=args.samples_per_shard,
        shard_bytes=args.shard_size,
        compression=args.compression,
        zstd_level=args.zstd_level,
        transcode=args.transcode,
        shuffle=args.shuffle,
        seed=args.seed,
        on_error=args.on_error,
        require_text=args.require_text,
        rewrite_keys=args.rewrite_keys,
        prefix=args.prefix,
        progress=not args.no_progress,
    )
    print(
        f"packed {summary.samples} samples ({summary.hours:.3f} h) into {summary.shards} shards, "
        f"{summary.bytes / 1e6:.1f} MB, in {summary.seconds:.1f} s ({summary.mb_per_s:.1f} MB/s of input)"
    )
    if summary.rejected:
        print(f"rejected {len(summary.rejected)} inputs: see {args.out_dir}/{REJECTED_FILE}")
    return 0


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
        f"{summary['corpus_dir']} ({summary['synth_seconds']:.1f} s)"
    )
    print(
        f"packed:   {summary['shards']} zstd shards, {summary['bytes'] / 1e6:.1f} MB, in "
        f"{summary['dataset_dir']} ({summary['pack_seconds']:.1f} s)"
    )
    print(
        f"read:     {summary['read_back_samples']} samples in {summary['read_back_batches']} batches "
        f"(max 30 padded seconds each) through ShardDataset + ShardLoader({args.workers} workers)"
    )
    print(
        f"resumed:  interrupted at batch {summary['resumed_at_batch']}, resumed from the saved state: "
        f"the same keys as an uninterrupted epoch ({summary['read_back_seconds']:.1f} s)"
    )
    print(f"next:     shardio inspect {summary['dataset_dir']}")
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
    print(f"results: {args.out_dir}/bench.json, bench.md, bench.png")
    return 0


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_pack,
    add_inspect,
    add_verify,
    add_index,
    _add_demo,
    _add_bench,
    add_trace,
    add_quarantine,
    add_remix,
    add_cache,
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
        _error(f"shardio {args.command}: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
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
