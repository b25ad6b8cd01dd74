"""The ``shardio pack`` subcommand: its parser (the corpus kinds' keys and metadata in its epilog) and its
run, in one process or in partitions run by an engine (``--engine``)."""

from __future__ import annotations

import argparse
import os

from ..errors import OptionError, shown_path
from ..packing.structure import DEFAULT_VALIDATE, VALIDATE_LEVELS
from .argtypes import at_least, parse_size, worker_count

__all__ = ["PACK_EPILOG", "PACK_MAX_WORKERS", "add_pack"]

_POSITIVE = at_least(1)
PACK_MAX_WORKERS = 256
"""The most ``-j`` workers ``shardio pack`` takes (threads, or processes of ``--engine local``)."""

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


def add_pack(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pack``'s parser to ``subparsers``; its ``run`` packs (see :mod:`shardio.packing`)."""
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
        "--validate",
        choices=VALIDATE_LEVELS,
        default=DEFAULT_VALIDATE,
        help="structure: every file's container, sizes and checksums (FLAC frame CRCs, Ogg page CRCs), "
        "frames from the headers where exact, no decoding of FLAC or WAV; decode: those checks, then every "
        "file decoded (default %(default)s; docs/guides/packing.md)",
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
        help="threads reading and validating the inputs (default: one per CPU core; 1: the writing "
        f"thread reads them too; at most {PACK_MAX_WORKERS})",
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
        validate=args.validate,
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
        rejected = shown_path(os.path.join(args.out_dir, REJECTED_FILE))
        print(f"rejected {len(summary.rejected)} inputs: see {rejected}")
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
        validate=args.validate,
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
        rejected = shown_path(os.path.join(args.out_dir, REJECTED_FILE))
        print(f"rejected {len(summary.rejected)} inputs: see {rejected}")
    return 0
