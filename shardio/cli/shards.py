"""The dataset's subcommands of the ``shardio`` command line: ``inspect``, ``verify`` and ``index``.

Each is a pair as in :mod:`shardio.cli.main`: ``add_NAME(subparsers)`` builds its parser and sets ``run``.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import OptionError, shown_path

__all__ = ["add_index", "add_inspect", "add_verify"]


# -- inspect -----------------------------------------------------------------------------------------


def _allow_outside_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-outside-root",
        action="store_true",
        help="take shard names outside the dataset directory (a trusted index written with "
        "'shardio index --out' elsewhere)",
    )


def add_inspect(subparsers: argparse._SubParsersAction) -> None:
    """``shardio inspect``: summarise a dataset from its index."""
    parser = subparsers.add_parser(
        "inspect",
        help="summarise a dataset from its index",
        description="Summarise a dataset from its index alone (no shard is read): shards, "
        "samples, hours, codecs, formats, sample rates and a duration "
        "histogram.",
    )
    parser.add_argument("directory", help="the dataset directory")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    _allow_outside_root(parser)
    parser.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from ..packing.inspection import inspect_dataset, render_report

    report = inspect_dataset(args.directory, allow_outside_root=args.allow_outside_root)
    print(json.dumps(report, indent=1) if args.json else render_report(report))
    return 0


# -- verify ------------------------------------------------------------------------------------------


def add_verify(subparsers: argparse._SubParsersAction) -> None:
    """``shardio verify``: check shards against the index."""
    parser = subparsers.add_parser(
        "verify",
        help="check shards against the index (exit 1 on problems)",
        description="Check every shard's size and SHA-256 against the index, parse "
        "every sample at its indexed offsets and check its audio's structure as "
        "pack --validate structure does (with --decode, decode its audio too); "
        "list every problem and exit 1 if there is any.",
    )
    parser.add_argument("directory", help="the dataset directory")
    parser.add_argument("--decode", action="store_true", help="also decode every sample's audio")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _allow_outside_root(parser)
    parser.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    from ..packing.verification import verify_dataset

    problems = verify_dataset(
        args.directory,
        decode=args.decode,
        allow_outside_root=args.allow_outside_root,
        progress=not args.no_progress,
    )
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{shown_path(args.directory)}: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"{shown_path(args.directory)}: OK")
    return 0


# -- index -------------------------------------------------------------------------------------------


def add_index(subparsers: argparse._SubParsersAction) -> None:
    """``shardio index``: build an index for existing shards."""
    parser = subparsers.add_parser(
        "index",
        help="build an index for existing WebDataset-style shards",
        description="Build a shardio index for shards written by other tools "
        "(webdataset, WeNet, tar + zstd): samples are grouped by key, "
        "audio facts read from each sample's audio member.",
    )
    parser.add_argument(
        "shards",
        nargs="*",
        help=".tar, .tar.gz, .tar.zst or .tar.bz2 shards (with --upgrade: dataset directories; "
        "none with --wenet-list)",
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="where to write the index (default: next to the shards)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an index already there")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--nemo-manifest",
        default=None,
        metavar="MANIFEST",
        help="index a NeMo tarred dataset in place: the one directory given holds its "
        "audio_{shard_id}.tar (or give their pattern, DIR/audio__OP_0..N_CL_.tar: those shards only), "
        "MANIFEST is its tarred_audio_manifest.json or the pattern of its sharded manifests "
        "(DIR/sharded_manifests/manifest__OP_0..N_CL_.json); text and other fields are kept in the "
        "index; '-sub' repeats read the first copy",
    )
    parser.add_argument(
        "--wenet-list",
        default=None,
        metavar="LIST",
        help="index in place the tar shards a WeNet shard list (data.list, one shard a line) names: "
        "the index goes into --out (default: the list's directory), which every shard must lie under",
    )
    parser.add_argument(
        "--upgrade",
        action="store_true",
        help="rewrite the format-1 index of each dataset directory given as the current format "
        "(same content and fingerprint, so saved loader states still resume)",
    )
    parser.set_defaults(run=_run_index)


def _run_index(args: argparse.Namespace) -> int:
    from ..packing.indexer import build_index, upgrade_index

    if args.upgrade:
        stray = [
            name
            for name, given in (
                ("--out", args.out is not None),
                ("--overwrite", args.overwrite),
                ("--nemo-manifest", args.nemo_manifest is not None),
                ("--wenet-list", args.wenet_list is not None),
            )
            if given
        ]
        if stray or not args.shards:
            raise OptionError(
                "--upgrade needs the dataset directories to upgrade"
                if not stray
                else f"--upgrade rewrites each directory's index in place: not with {', '.join(stray)}"
            )
        for directory in args.shards:
            upgraded = upgrade_index(directory)
            print(f"{shown_path(directory)}: index format {upgraded}")
        return 0
    if args.wenet_list is not None:
        from ..integrations.importers.wenet_index import index_wenet

        if args.shards or args.nemo_manifest is not None:
            raise OptionError(
                "--wenet-list reads the shards from the list: give no shards, no --nemo-manifest"
            )
        index = index_wenet(
            args.wenet_list, args.out, overwrite=args.overwrite, progress=not args.no_progress
        )
    elif not args.shards:
        raise OptionError("shardio index needs shards (or --wenet-list LIST)")
    elif args.nemo_manifest is None and any("_OP_" in shard for shard in args.shards):
        raise OptionError(
            "a NeMo brace pattern (audio__OP_0..N_CL_.tar) is indexed with --nemo-manifest MANIFEST"
        )
    elif args.nemo_manifest is not None:
        from ..integrations.importers.nemo_index import index_nemo

        if len(args.shards) != 1 or args.out is not None:
            raise OptionError(
                "--nemo-manifest takes one directory (the one holding audio_{shard_id}.tar, or "
                "their pattern) and writes the index there: no --out"
            )
        index = index_nemo(
            args.shards[0], args.nemo_manifest, overwrite=args.overwrite, progress=not args.no_progress
        )
    else:
        index = build_index(
            args.shards, out_dir=args.out, overwrite=args.overwrite, progress=not args.no_progress
        )
    print(
        f"indexed {len(index)} samples ({index.total_duration / 3600:.3f} h) in {len(index.shards)} shards "
        f"({', '.join(sorted({s.codec for s in index.shards}))}); index written to {shown_path(index.root)}"
    )
    return 0
