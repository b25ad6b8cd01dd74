"""A saved state's file, read as untrusted data: a regular file, bounded in size, nesting and values.

``shardio trace``, ``quarantine`` and ``remix`` read ``--state`` files. A file is opened without blocking and
checked on its descriptor, so a FIFO is not waited on and a device (``/dev/zero``) is not read; its size is
bounded before a byte is read (:data:`MAX_STATE_FILE_BYTES`), and its JSON's nesting and count of values are
bounded before it is parsed (:data:`MAX_STATE_FILE_DEPTH`, :data:`MAX_STATE_FILE_VALUES`), by one scan of the
bytes (about as long as parsing them). So what parsing allocates is bounded by the file's bytes (measured:
under 20 bytes of Python objects per byte of JSON; a 128 MiB file of 2^23 short strings peaks at 0.9 GB), and
nothing hangs.
The fields of the state parsed from it are then bounded as any state's (:mod:`shardio.checks.states`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import ShardioError, StateError, shown
from .localshard import NotRegular, open_regular

__all__ = [
    "MAX_STATE_FILE_BYTES",
    "MAX_STATE_FILE_DEPTH",
    "MAX_STATE_FILE_VALUES",
    "load_state_file",
    "parse_state_json",
    "read_state_bytes",
]

MAX_STATE_FILE_BYTES = 1 << 27
"""The largest state file read (128 MiB). A state is kilobytes; quarantine entries (a key, an id and a few
flags per sample) and a ``StatefulDataLoader``'s per-worker copies grow it: 128 MiB holds a quarantine of a
million keys in each of a few workers' states."""
MAX_STATE_FILE_DEPTH = 64
"""The deepest nesting of arrays and objects in a state file: a state's ``options`` and ``extra`` are at most
:data:`~shardio.checks.states.MAX_DEPTH` deep, inside a state inside a checkpoint's few levels."""
MAX_STATE_FILE_VALUES = 1 << 23
"""The most JSON values (arrays, objects, and the items in them) in a state file: above what a state's
``options`` and ``extra`` may hold (:data:`~shardio.checks.states.MAX_NODES`), with room for a checkpoint."""

_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_MARKS = np.zeros(256, dtype=bool)
_MARKS[[ord(c) for c in '"[]{},']] = True
_CHUNK = 1 << 20


def read_state_bytes(
    path: str,
    most: int = MAX_STATE_FILE_BYTES,
    *,
    what: str = "loader state",
    error: type[ShardioError] = StateError,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``most`` of them.

    Args:
        path: the state file (symlinks followed).
        most: the largest size read.
        what: what the file holds, for messages (another small JSON file shardio wrote, read as untrusted
            data the same way: a partitioned pack's plan and reports).
        error: the error raised.

    Returns:
        The file's bytes.

    Raises:
        StateError: (or ``error``) where ``path`` cannot be opened, is not a regular file (a FIFO, a device, a
            directory, a socket: none is opened for reading, so none blocks), or holds more than ``most``
            bytes.
    """
    try:
        fd, size = open_regular(path)
    except NotRegular as exc:
        raise error(
            f"{shown(path, 200)}: it is {exc}, not a regular file: a {what} is read from a regular file only"
        ) from None
    except OSError as exc:
        raise error(
            f"{shown(path, 200)}: cannot read a {what} ({exc.__class__.__name__}: "
            f"{shown(exc.strerror or str(exc), 200)})"
        ) from None
    try:
        if size > most:
            raise error(f"{shown(path, 200)}: {size} bytes, more than the {most} a {what} file may hold")
        parts, got = [], 0
        while got <= most:
            part = os.read(fd, min(1 << 20, most + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    except OSError as exc:
        raise error(
            f"{shown(path, 200)}: cannot read a {what} ({exc.__class__.__name__}: "
            f"{shown(exc.strerror or str(exc), 200)})"
        ) from None
    finally:
        os.close(fd)
    if got > most:
        raise error(
            f"{shown(path, 200)}: more than the {most} bytes a {what} file may hold (it grew while read)"
        )
    return b"".join(parts)


def _shape(data: bytes) -> tuple[int, int]:
    """The deepest nesting of arrays and objects in JSON text ``data``, and about how many values it holds
    (each array and object, one more per ``,``: within one of the count, an empty one counted twice), outside
    strings; one linear scan, in chunks."""
    # escapes are read left to right: drop every escaped backslash, then every escaped quote; each '"' left
    # opens or closes a string
    bare = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    deepest = depth = values = quotes = 0
    for start in range(0, bare.shape[0], _CHUNK):
        codes = bare[start : start + _CHUNK]
        marks = codes[_MARKS[codes]]  # the few bytes that matter, in order: '"', brackets, ','
        quoted = marks == ord('"')
        outside = (np.cumsum(quoted, dtype=np.int64) + quotes) % 2 == 0
        quotes += int(np.count_nonzero(quoted))
        structure = marks[outside & ~quoted]
        steps = _STEP[structure]
        values += int(np.count_nonzero(steps == 1)) + int(np.count_nonzero(structure == ord(",")))
        if steps.shape[0]:
            levels = np.cumsum(steps, dtype=np.int64) + depth
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
    return deepest, values


def load_state_file(path: str, *, what: str = "loader state", error: type[ShardioError] = StateError) -> Any:
    """The JSON document in the state file at ``path``, read by :func:`read_state_bytes` and parsed by
    :func:`parse_state_json`.

    Args:
        path: the state file.
        what: what the file holds, for messages (see :func:`read_state_bytes`).
        error: the error raised.

    Returns:
        The parsed document (whether it is a state is :func:`shardio.state.job_state`'s to say).

    Raises:
        StateError: (or ``error``) the file is not a regular file, is too large, nested too deep, holds too
            many values, or is not JSON text.
    """
    return parse_state_json(read_state_bytes(path, what=what, error=error), path, what=what, error=error)


def parse_state_json(
    data: bytes, where: str, *, what: str = "loader state", error: type[ShardioError] = StateError
) -> Any:
    """The JSON document in ``data`` (read from ``where``, a path or URL), parsed only when its nesting and
    values are within :data:`MAX_STATE_FILE_DEPTH` and :data:`MAX_STATE_FILE_VALUES`.

    Args:
        data: the file's bytes.
        where: the file, for messages.
        what: what the file holds, for messages.
        error: the error raised.

    Returns:
        The parsed document.

    Raises:
        StateError: (or ``error``) ``data`` is nested too deep, holds too many values, or is not JSON text.
    """
    depth, values = _shape(data)
    if depth > MAX_STATE_FILE_DEPTH:
        raise error(f"{shown(where, 200)}: JSON nested more than {MAX_STATE_FILE_DEPTH} deep: not a {what}")
    if values > MAX_STATE_FILE_VALUES:
        raise error(
            f"{shown(where, 200)}: about {values} JSON values, more than the "
            f"{MAX_STATE_FILE_VALUES} a {what} file may hold"
        )
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # ValueError: UnicodeDecodeError and JSONDecodeError
        raise error(
            f"{shown(where, 200)}: cannot read a JSON {what} ({exc.__class__.__name__}: "
            f"{shown(str(exc), 200)})"
        ) from None
