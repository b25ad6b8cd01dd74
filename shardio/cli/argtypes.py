"""Argument types of the command line (argparse ``type=``): sizes, counts, durations and paths, each refusing
what would be read as something else (an empty path as the current directory, ``nan`` as no limit)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

__all__ = ["PATH_OPTIONS", "at_least", "non_negative", "parse_size", "path", "worker_count"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

PATH_OPTIONS = frozenset({"out", "out_dir", "state", "nemo_manifest", "workdir", "link"})
"""Options (by ``dest``) that name a file or directory; every subcommand's positional arguments do too."""


def parse_size(text: str) -> int:
    """Bytes in a size such as ``256MB``, ``1.5GiB`` or ``4096`` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; expected a number with an optional unit "
            "B, KB, MB, GB, KiB, MiB or GiB (e.g. 256MB)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least 1 byte")
    return size


def at_least(least: int) -> Callable[[str], int]:
    """A whole number of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {least}")
        return value

    return parse


def worker_count(least: int, most: int) -> Callable[[str], int]:
    """A number of workers (``-j``) from ``least`` to ``most``: each is a process or thread with its own
    buffers, so a mistyped ``-j 1000`` would start hundreds of them for no speed."""
    whole = at_least(least)

    def parse(text: str) -> int:
        value = whole(text)
        if value > most:
            raise argparse.ArgumentTypeError(
                f"{text!r} is more workers than the limit of {most}; expected a "
                f"whole number from {least} to {most}"
            )
        return value

    return parse


def non_negative(what: str = "number") -> Callable[[str], float]:
    """A finite number >= 0 (``what`` names it in the error: ``"number of milliseconds"``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} >= 0")
        return value

    return parse


def path(text: str) -> str:
    """A path argument; an empty one (an unset shell variable, ``--out ""``) would mean the current
    directory."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; expected a file or directory name")
    return text
