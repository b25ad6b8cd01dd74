"""Source: one corpus input, and the helpers the corpus readers share to make sources
from manifest entries."""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InputError, InputProblem
from ..storage.localshard import NotRegular, kind, open_regular

__all__ = [
    "AUDIO_EXTENSIONS",
    "KEY_COLUMNS",
    "NotJsonConstant",
    "NotRegularFile",
    "Problems",
    "Source",
    "manifest_text",
    "not_regular",
    "open_regular_input",
    "read_regular_input",
    "refuse_constant",
    "resolve_path",
    "seconds_field",
    "segment_keys",
]


AUDIO_EXTENSIONS = ("wav", "flac", "ogg", "oga", "mp3", "opus")
"""The audio inputs pack takes, by extension."""
KEY_COLUMNS = ("id", "key")
"""A manifest's fields that name a sample's key."""


@dataclass(frozen=True)
class Source:
    """One input sample: an audio file, or a segment of one (``offset``/``duration`` in seconds)."""

    key: str
    audio_path: str
    offset: float | None = None
    duration: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    """Where the entry was listed (``train.jsonl:12``); empty for a file found in a folder."""
    member: str = ""
    """For audio stored inside ``audio_path`` (a Parquet or Arrow table, a tar): where in it, as
    :func:`shardio.integrations.importers.containers.read_member` reads it; its name ends with
    the audio's extension."""
    size: int | None = None
    """The audio's stored bytes, when an importer knows them without a file of their own (plan estimates)."""

    @cached_property
    def ext(self) -> str:
        """The audio's extension (of the member when there is one), lower case, without the dot."""
        name = os.path.basename(self.member or self.audio_path)
        return os.path.splitext(name)[1][1:].lower()

    @property
    def where(self) -> str:
        """The audio file (and member), and the manifest line that listed it, for messages."""
        file = f"{self.audio_path}:{self.member}" if self.member else self.audio_path
        return f"{file} ({self.origin})" if self.origin else file


Problems = list[InputProblem]
"""Where the readers put entries that cannot become sources (see :mod:`shardio.packing.corpus`)."""


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a socket, a directory): reading a FIFO blocks
    until a writer comes, and ``/dev/zero`` never ends, so an input must be a regular file. ``strerror`` says
    what the path is."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` (``st_mode``) cannot be read as an input (``it is a FIFO, ...``), or None when
    it is a regular file."""
    if stat.S_ISREG(mode):
        return None
    return f"it is {kind(mode)}, not a regular file: reading it could block or never end"


def open_regular_input(path: str | os.PathLike[str]) -> BinaryIO:
    """The regular file at ``path`` (symlinks followed) opened for reading; :class:`NotRegularFile` for
    anything else (:func:`shardio.storage.localshard.open_regular`: a device is not
    opened, a FIFO not read)."""
    name = os.fspath(path)
    try:
        fd, _ = open_regular(name)
    except NotRegular as exc:
        raise NotRegularFile(
            0, f"it is {exc}, not a regular file: reading it could block or never end", name
        ) from None
    return os.fdopen(fd, "rb")


def read_regular_input(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file at ``path`` (see :func:`open_regular_input`)."""
    with open_regular_input(path) as handle:
        return handle.read()


def manifest_text(path: Path, encoding: str) -> str:
    """A manifest's text; bytes that are not UTF-8 are an :class:`InputError` naming the file and line, and so
    is a path that is not a regular file (a FIFO would block the read)."""
    try:
        data = read_regular_input(path)
    except NotRegularFile as exc:
        raise InputError(
            [
                InputProblem(
                    str(path), "", f"cannot read the manifest: {exc.strerror}; expected a manifest file"
                )
            ]
        ) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            [
                InputProblem(
                    f"{path}:{line}",
                    "",
                    f"byte {exc.start} of the file is not UTF-8 "
                    f"({exc.reason}); expected a UTF-8 text manifest",
                )
            ]
        ) from None


class NotJsonConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a manifest line: Python's JSON reader
    takes them, JSON does not."""


def refuse_constant(name: str) -> Any:
    """``json.loads``' ``parse_constant`` hook: :class:`NotJsonConstant`, since metadata must stay JSON for
    every reader."""
    raise NotJsonConstant(f"{name} is not a JSON value; expected a finite number, or null")


def resolve_path(base: Path, audio: str) -> str:
    path = Path(audio).expanduser()
    return str(path if path.is_absolute() else base / path)


def seconds_field(value: Any, name: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"field {name!r} is {value!r}, expected a number of seconds") from None
    if not number >= 0:
        raise ValueError(f"field {name!r} is {value!r}, expected a number of seconds >= 0")
    return number


def segment_keys(entries: list[tuple[str, dict[str, Any]]]) -> None:
    """Give segments of one audio file distinct keys: ``{stem}_{offset in ms}``."""
    counts = Counter(path for path, entry in entries if "key" not in entry)
    for path, entry in entries:
        if "key" not in entry and counts[path] > 1 and entry.get("offset") is not None:
            entry["key"] = f"{entry['stem']}_{round(entry['offset'] * 1000):08d}"
