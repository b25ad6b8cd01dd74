"""Manifest lines: the one bounded reader of JSON-lines manifests, for every command that reads one.

``shardio pack`` (a JSONL or tarred NeMo manifest) and ``shardio index --nemo-manifest`` read their
manifests here, so they agree on what a line may be:

- the manifest must be a regular file (a FIFO would block the read, a device never end): anything else is
  an :class:`~shardio.errors.InputError` saying what it is;
- a line is read no further than :data:`MAX_LINE_BYTES`: a longer one is a problem naming the line, and the
  rest of it is skipped in bounded chunks (never read whole);
- a line must be UTF-8 (a byte order mark on the first line is dropped) and one JSON object, each field
  given once (``json`` alone keeps the last of two, silently), without ``NaN``/``Infinity`` or a number a
  64-bit float cannot hold, and nested at most :data:`MAX_DEPTH` deep.

A line that breaks one of these is an :class:`~shardio.errors.InputProblem` naming ``file:line``; the
readers go on with the next line, so every problem of a manifest is listed at once.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any, Protocol

from ..errors import InputError, InputProblem
from .source import NotRegularFile, Problems, not_regular, open_regular_input, refuse_constant

__all__ = [
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "LineSource",
    "check_manifest_file",
    "json_entry",
    "manifest_lines",
    "numbered_lines",
]

MAX_LINE_BYTES = 1 << 20
"""The most bytes of one manifest line (a transcript and its fields need far less)."""
MAX_DEPTH = 64
"""How deep a line's JSON may nest (objects and lists); deeper is refused before anything recurses over it."""
_SKIP_CHUNK = 1 << 16
_BOM = b"\xef\xbb\xbf"


def check_manifest_file(path: str | os.PathLike[str]) -> None:
    """Refuse a manifest path that exists but is not a regular file (a FIFO, a device, a directory) with an
    :class:`~shardio.errors.InputError` saying what it is; a missing path raises ``FileNotFoundError``."""
    problem = not_regular(os.stat(path).st_mode)
    if problem is not None:
        raise InputError(
            [
                InputProblem(
                    os.fspath(path), "", f"cannot read the manifest: {problem}; expected a manifest file"
                )
            ]
        )


class LineSource(Protocol):
    """What :func:`numbered_lines` reads: a binary file (plain, or a ``GzipFile``)."""

    def readline(self, size: int = -1, /) -> bytes: ...


def numbered_lines(
    handle: LineSource, name: str, problems: Problems, limit: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, str]]:
    """The non-blank lines of ``handle`` (named ``name`` in problems) as ``(line number, text)``; a line
    longer than ``limit`` bytes, or not UTF-8, is a problem naming it instead (see the module docstring)."""
    number = 0
    while raw := handle.readline(limit + 1):
        number += 1
        if len(raw) > limit:
            problems.append(
                InputProblem(
                    f"{name}:{number}",
                    "",
                    f"a line of more than {limit} bytes; expected one manifest entry per line",
                )
            )
            while raw and not raw.endswith(b"\n"):  # the rest of the line, a chunk at a time
                raw = handle.readline(_SKIP_CHUNK)
            continue
        if number == 1:
            raw = raw.removeprefix(_BOM)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(
                InputProblem(
                    f"{name}:{number}",
                    "",
                    f"byte {exc.start} of the line is not UTF-8; expected a UTF-8 JSON line",
                )
            )
            continue
        if text.strip():
            yield number, text


def manifest_lines(
    path: str | os.PathLike[str], problems: Problems, limit: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, str]]:
    """The non-blank lines of the manifest file at ``path`` (see :func:`numbered_lines`); a path that is not a
    regular file is an :class:`~shardio.errors.InputError` (:func:`check_manifest_file`)."""
    try:
        handle = open_regular_input(path)
    except NotRegularFile as exc:
        raise InputError(
            [
                InputProblem(
                    os.fspath(path), "", f"cannot read the manifest: {exc.strerror}; expected a manifest file"
                )
            ]
        ) from None
    with handle:
        yield from numbered_lines(handle, os.fspath(path), problems, limit)


def json_entry(text: str) -> dict[str, Any]:
    """One manifest line's JSON object; a ``ValueError`` saying why when it is not one that every reader takes
    alike (see the module docstring)."""
    try:
        value = json.loads(
            text, object_pairs_hook=_unique_fields, parse_constant=refuse_constant, parse_float=_finite_float
        )
    except RecursionError:
        raise ValueError(f"the JSON is nested more than {MAX_DEPTH} deep") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, found a JSON {type(value).__name__}")
    _check_depth(value)
    return value


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields; a field given twice is a ``ValueError`` (``json`` would
    keep the last, silently)."""
    fields: dict[str, Any] = {}
    for name, value in pairs:
        if name in fields:
            raise ValueError(
                f"the field {name!r} appears twice in one object (a JSON reader keeps one value and "
                "drops the other unseen); expected each field once"
            )
        fields[name] = value
    return fields


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it overflows to infinity (``1e400``)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is beyond the range of a 64-bit float; expected a finite number")
    return value


def _check_depth(value: Any) -> None:
    """A ``ValueError`` when ``value`` nests objects and lists more than :data:`MAX_DEPTH` deep (walked
    without recursion)."""
    level: list[Any] = [value]
    for _ in range(MAX_DEPTH):
        level = [
            child
            for item in level
            if isinstance(item, (dict, list))
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return
    if any(isinstance(item, (dict, list)) for item in level):
        raise ValueError(f"the JSON is nested more than {MAX_DEPTH} deep")
