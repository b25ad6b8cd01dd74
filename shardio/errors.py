"""The shardio error tree.

Every error shardio raises on bad input, bad data or a bad state is a :class:`ShardioError`::

    ShardioError
    ├── OptionError        an argument or option combination that cannot work (also a ValueError)
    ├── InputError         pack: corpus inputs that failed validation (lists every failing input)
    ├── FormatError        shard or index bytes that are not what the format promises
    │   └── IntegrityError a shard whose size or hash differs from the index
    ├── ReadError          a shard that cannot be read (missing, or remote retries spent)
    │   ├── RangeNotSupported an HTTP server that ignores Range requests (fails the dataset)
    │   └── ShardChanged   a shard replaced while the run reads it (ETag or date; a local file's ctime)
    ├── DecodeError        a member whose audio cannot be decoded, or is empty or non-finite
    ├── OutputError        an output directory that cannot be written (a file, read-only, locked by a run)
    └── StateError         a saved loader state that does not fit this dataset or options

Messages say what went wrong, where (file, shard, key, offset) and what was expected; a value that comes from
the input appears in them through :func:`shown` (bounded, escaped).
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ShardioError",
    "OptionError",
    "InputError",
    "InputProblem",
    "FormatError",
    "IntegrityError",
    "ReadError",
    "RangeNotSupported",
    "ShardChanged",
    "DecodeError",
    "OutputError",
    "StateError",
    "shown",
    "shown_path",
]


class ShardioError(Exception):
    """Base class of every error shardio raises on purpose."""


class OptionError(ShardioError, ValueError):
    """An argument, or a combination of arguments, that cannot work."""


@dataclass(frozen=True)
class InputProblem:
    """One corpus input that failed validation while packing.

    Args:
        source: The input file (or manifest line) the problem is about.
        key: The sample key it would have had (`""` when none could be made).
        reason: What is wrong, and what was expected.
    """

    source: str
    key: str
    reason: str

    def __str__(self) -> str:
        source = shown_path(self.source)
        where = f"{source} (key {self.key!r})" if self.key else source
        return f"{where}: {_escaped(self.reason)}"


class InputError(ShardioError):
    """Corpus inputs that failed validation; `problems` lists every one.

    Args:
        problems: Every input that failed.
        limit: The most problems the message lists (all stay in `problems`).
    """

    def __init__(self, problems: Sequence[InputProblem], *, limit: int = 20) -> None:
        self.problems = list(problems)
        shown = "\n".join(f"  - {p}" for p in self.problems[:limit])
        more = len(self.problems) - limit
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{len(self.problems)} input(s) failed validation:\n{shown}{tail}")


class FormatError(ShardioError):
    """Shard or index bytes that are not what the shardio/WebDataset format promises."""


class IntegrityError(FormatError):
    """A shard whose size or content hash differs from what the index recorded."""


class ReadError(ShardioError):
    """A shard or member that could not be read (missing file, I/O error, retries spent)."""


class RangeNotSupported(ReadError):
    """An HTTP server that answers ranged requests with the whole file, so no sample can be read by range.
    Not skipped under ``on_error="skip"``: it fails the dataset, since every sample would fail the same
    way."""


class ShardChanged(ReadError):
    """A remote shard whose object changed (another ETag or Last-Modified, or a ``412 Precondition Failed``)
    since this process first read it, or a local shard file rewritten or replaced after its index was loaded
    (its status-change time): replaced while the run reads it. Not retried, since every later read would get
    the new version and mix it with the old."""


class DecodeError(ShardioError):
    """Audio bytes that could not be decoded, or decoded to empty or non-finite samples."""


class OutputError(ShardioError):
    """An output location that cannot be written: not a directory, read-only, or held by another run."""


class StateError(ShardioError):
    """A loader state that cannot be applied: another index, seed or batching, or a bad version."""


class _Short(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        bits = x.bit_length()
        return repr(x) if bits <= 128 else f"<an integer of {bits} bits>"  # repr of >4300 digits raises


_SHORT = _Short()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel = 3


def _escaped(text: str) -> str:
    """``text`` with each character that is not printable as its escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(value: object, limit: int = 100) -> str:
    """``value`` for a message: a bounded repr (:mod:`reprlib`), non-printable characters escaped, at most
    about ``limit`` characters."""
    text = _escaped(_SHORT.repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_path(path: object, limit: int = 1024) -> str:
    """A path (or URL) for a message: as it is where every character is printable, else quoted and escaped
    as keys are (its repr: ``'a\\nb'``), so that a name holding a newline, an escape sequence, a NUL or a bidi
    control (U+202E) cannot forge, hide or reverse a line; cut after ``limit`` characters."""
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    cut = "..." if len(text) > limit else ""
    return text[:limit] + cut if text.isprintable() else repr(text[:limit]) + cut
