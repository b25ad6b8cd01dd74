"""The ``shardio`` command line: the parser and its exit codes (``main``), argument types, and each group of
subcommands (``shards``: inspect, verify, index; ``ledger``: trace, quarantine, remix;
``cache``; ``demo``)."""

from .argtypes import parse_size
from .main import EXIT_CODES, build_parser, main

__all__ = ["EXIT_CODES", "build_parser", "main", "parse_size"]
