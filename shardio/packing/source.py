"""Source: one corpus input, and the helpers the corpus readers share to make sources from manifest entries."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import InputError, InputProblem

__all__ = ["Problems", "Source", "manifest_text", "resolve_path", "seconds_field", "segment_keys"]


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
    :func:`shardio.integrations.importers.containers.read_member` reads it; its name ends with the audio's extension."""
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


def manifest_text(path: Path, encoding: str) -> str:
    """A manifest's text; bytes that are not UTF-8 are an :class:`InputError` naming the file and line."""
    data = path.read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError([InputProblem(f"{path}:{line}", "", f"byte {exc.start} of the file is not UTF-8 "
                                       f"({exc.reason}); expected a UTF-8 text manifest")]) from None


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
