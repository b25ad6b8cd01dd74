"""The node cache's subcommand of the ``shardio`` command line: ``cache`` (what it holds; ``--prune``).

A pair as in :mod:`shardio.cli.main`: ``add_cache(subparsers)`` builds its parser and sets ``run``.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import OptionError, shown_path
from .argtypes import at_least, non_negative

__all__ = ["add_cache"]


def add_cache(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="the node-local shard cache: what it holds, and --prune",
        description="Report the shard cache under $SHARDIO_CACHE_DIR (default "
        "~/.cache/shardio); --prune removes lock files without an entry, "
        "temporary files of dead fetches, index files (hash markers, "
        "fetched remote index columns) unused for --unused-days, plan "
        "files older than a day and, with "
        "--max-bytes, the least recently used shards beyond that size. "
        "Safe while loaders run.",
    )
    parser.add_argument("--prune", action="store_true", help="remove what is no longer needed (see above)")
    parser.add_argument(
        "--max-bytes",
        type=at_least(0),
        default=None,
        metavar="N",
        help="with --prune: evict entries until the cache holds at most N bytes",
    )
    parser.add_argument(
        "--stale",
        type=non_negative(),
        default=None,
        metavar="SECONDS",
        help="with --prune: temporary files older than this are from dead fetches (default 3600)",
    )
    parser.add_argument(
        "--unused-days",
        type=non_negative(),
        default=None,
        metavar="DAYS",
        help="with --prune: index files untouched this long go (default 7; made again when needed)",
    )
    parser.add_argument(
        "--decoded",
        default=None,
        metavar="DIR",
        help="report the decoded cache in DIR (Reading(decoded_cache=DIR)) instead: its datasets, segments "
        "and bytes; with --clear, remove its segments",
    )
    parser.add_argument("--clear", action="store_true", help="with --decoded: remove every decoded entry")
    parser.set_defaults(run=_run_cache)


def _run_decoded(args: argparse.Namespace) -> int:
    from ..reading import decodedcache

    if args.prune:
        raise OptionError("--prune: not with --decoded (use --clear)")
    removed = decodedcache.clear(args.decoded) if args.clear else 0
    found = decodedcache.report(args.decoded)
    cleared = f"; cleared {removed} segments" if args.clear else ""
    print(
        f"{args.decoded}: {found['namespaces']} datasets, {found['segments']} segments, "
        f"{found['bytes']} bytes{cleared}"
    )
    return 0


def _run_cache(args: argparse.Namespace) -> int:
    if args.decoded is not None:
        return _run_decoded(args)
    if args.clear:
        raise OptionError("--clear: only with --decoded DIR")
    from ..reading.cache import ShardCache
    from ..storage.files import cache_dir

    given = [
        name
        for name, value in (
            ("--max-bytes", args.max_bytes),
            ("--stale", args.stale),
            ("--unused-days", args.unused_days),
        )
        if value is not None
    ]
    if given and not args.prune:
        raise OptionError(f"{', '.join(given)}: only with --prune (without it, cache only reports)")
    stale = 3600.0 if args.stale is None else args.stale
    unused_days = 7.0 if args.unused_days is None else args.unused_days
    directory = os.path.join(cache_dir(), "shards")
    cache = ShardCache(directory, args.max_bytes if args.max_bytes is not None else sys.maxsize)
    removed = 0
    if args.prune:
        from ..runtime import planfiles
        from ..shards import indexcache

        removed = cache.prune(stale) + indexcache.prune(unused_days * 86400, stale) + planfiles.prune()
    try:
        entries = sum(name.endswith(".shard") for name in os.listdir(directory))
    except FileNotFoundError:
        entries = 0
    pruned = f"; pruned {removed} files" if args.prune else ""
    print(f"{shown_path(directory)}: {entries} shards, {cache.used_bytes()} bytes{pruned}")
    return 0
