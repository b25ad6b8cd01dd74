"""NeMo's shard patterns: the ``audio__OP_0..N_CL_.tar`` and ``manifest__OP_0..N_CL_.json`` a NeMo config
names (``tarred_audio_filepaths``, and ``manifest_filepath`` for the sharded manifests that NeMo's converter
writes into ``sharded_manifests/``), for an index in place (:mod:`shardio.integrations.importers.nemo_index`).

NeMo expands them with ``braceexpand`` after reading ``_OP_``, ``(``, ``[`` and ``<`` as ``{`` and ``_CL_``,
``)``, ``]`` and ``>`` as ``}``. shardio reads the one form its converter's shards take: a file name with one
range of shard numbers ``{first..last}``, without leading zeros, in a directory named without a pattern.
Anything else (a list ``{a,b}``, two ranges, a pattern in a directory name) is an
:class:`~shardio.errors.OptionError` naming it, never a guess.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ...errors import OptionError, shown_path

__all__ = ["ShardPattern", "is_pattern", "parse_pattern"]

_OPEN = ("_OP_", "(", "[", "<", "{")
_CLOSE = ("_CL_", ")", "]", ">", "}")
_NUMBER = r"(?:0|[1-9][0-9]{0,9})"
_RANGE = re.compile(rf"([^{{}}]*)\{{({_NUMBER})\.\.({_NUMBER})\}}([^{{}}]*)", re.ASCII)


@dataclass(frozen=True)
class ShardPattern:
    """A file name with one range of shard numbers: ``directory/{head}{n}{tail}`` for ``n`` from ``first`` to
    ``last``.

    Args:
        given: The pattern as given (for messages).
        directory: The directory of the files.
        head: The file name before the number.
        tail: The file name after it.
        first: The first shard number.
        last: The last one.
    """

    given: str
    directory: str
    head: str
    tail: str
    first: int
    last: int

    @property
    def numbers(self) -> range:
        """The shard numbers, in order."""
        return range(self.first, self.last + 1)

    def path(self, number: int) -> str:
        """The file of shard ``number``."""
        return os.path.join(self.directory, f"{self.head}{number}{self.tail}")


def is_pattern(path: str) -> bool:
    """Whether ``path`` holds one of NeMo's brace marks (``_OP_``, ``{``, ...)."""
    return any(mark in path for mark in (*_OPEN, *_CLOSE))


def parse_pattern(path: str, what: str) -> ShardPattern:
    """The range of files ``path`` names (see the module docstring).

    Args:
        path: The pattern, as a NeMo config gives it.
        what: What it names, for messages (``"the tars"``).

    Returns:
        The pattern.

    Raises:
        OptionError: Not a pattern shardio reads; a range whose last number is before its first; more
            files than the directory holds (they cannot all exist).
    """
    directory, name = os.path.split(path)
    if is_pattern(directory):
        raise OptionError(
            f"{shown_path(path)}: {what}: only the file name may hold a NeMo brace pattern, not its directory"
        )
    braced = name
    for opening in _OPEN:
        braced = braced.replace(opening, "{")
    for closing in _CLOSE:
        braced = braced.replace(closing, "}")
    match = _RANGE.fullmatch(braced)
    if match is None:
        raise OptionError(
            f"{shown_path(path)}: {what}: expected a file name with one range of shard numbers, "
            "as NeMo's converter names its files (audio__OP_0..N_CL_.tar, manifest__OP_0..N_CL_.json; "
            "no leading zeros, no lists)"
        )
    head, first, last, tail = match[1], int(match[2]), int(match[3]), match[4]
    if last < first:
        raise OptionError(f"{shown_path(path)}: {what}: the range ends ({last}) before it starts ({first})")
    directory = directory or "."
    if not os.path.isdir(directory):
        raise OptionError(f"{shown_path(path)}: {what}: {shown_path(directory)} is not a directory")
    held = len(os.listdir(directory))
    if last - first + 1 > held:
        raise OptionError(
            f"{shown_path(path)}: {what}: the pattern names {last - first + 1} files and "
            f"{shown_path(directory)} holds {held} entries"
        )
    return ShardPattern(path, os.path.abspath(directory), head, tail, first, last)
