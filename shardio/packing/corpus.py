"""Corpus readers: an audio folder, a JSONL manifest, a Kaldi data dir or a TSV/CSV
table, as :class:`Source` s.

Every reader yields its sources in a deterministic order (sorted paths for a folder, file order for the
manifests). An entry that cannot become a source (a malformed line, a piped ``wav.scp`` command, a row
without a path) is an :class:`~shardio.errors.InputProblem` naming the file and line: readers append it to
the ``problems`` list they are given, or raise :class:`~shardio.errors.InputError` listing them all at the
end when they are given none. Nothing here opens the audio; :func:`shardio.packing.pack.pack` validates it.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError, InputProblem, OptionError, shown_path
from ..integrations.importers.kinds import IMPORTED_KINDS, detect_imported, imported_reader
from .folder import walk_folder
from .kaldi import kaldi_sources
from .manifestlines import json_entry, manifest_lines
from .source import (
    AUDIO_EXTENSIONS,
    KEY_COLUMNS,
    Problems,
    Source,
    not_regular,
    read_regular_input,
    resolve_path,
    seconds_field,
    segment_keys,
)
from .table import table_sources

__all__ = [
    "KINDS",
    "Source",
    "detect_kind",
    "read_corpus",
    "read_folder",
    "read_jsonl",
    "read_kaldi",
    "read_table",
]

logger = logging.getLogger(__name__)

KINDS = ("folder", "jsonl", "kaldi", "tsv", *IMPORTED_KINDS)


_Reader = Callable[[str | os.PathLike[str], Problems | None, Counter[str] | None], Iterator[Source]]


def detect_kind(path: str | os.PathLike[str]) -> str:
    """Which of :data:`KINDS` the corpus at ``path`` is, from its layout and file name."""
    location = Path(path)
    imported = detect_imported(location) if location.exists() else None
    if imported is not None:
        return imported
    if location.is_dir():
        return "kaldi" if (location / "wav.scp").is_file() else "folder"
    if not location.exists():
        raise OptionError(f"{shown_path(location)}: no such corpus file or directory")
    if location.name == "wav.scp":
        return "kaldi"
    suffix = location.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".tsv", ".csv", ".psv", ".txt"):
        return "tsv"
    raise OptionError(
        f"{shown_path(location)}: cannot tell the corpus kind from the name; pass a kind, one of {KINDS}"
    )


def read_corpus(
    path: str | os.PathLike[str],
    kind: str | None = None,
    *,
    problems: Problems | None = None,
    left_out: Counter[str] | None = None,
    listed: Callable[[int], object] | None = None,
) -> Iterator[Source]:
    """The sources of the corpus at ``path`` (its kind detected unless given), in a deterministic order.

    Files a folder holds that are not inputs are counted in ``left_out`` (by extension) when given. A corpus
    path that is neither a directory nor a regular file (a FIFO, a device) is an :class:`InputError`:
    detecting its kind would read it, and a FIFO blocks. ``listed`` (a progress counter's ``update``) is
    called with the count of each batch of files found as the listing goes: a folder's files as its walk meets
    them (before the first source), a manifest's sources as they come."""
    _check_corpus_path(Path(path))
    kind = {"csv": "tsv", "table": "tsv"}.get(kind or "", kind) or detect_kind(path)
    if kind not in _READERS:
        raise OptionError(f"unknown corpus kind {kind!r}; expected one of {KINDS}")
    location = Path(path)
    if not location.exists():
        raise OptionError(f"{shown_path(location)}: no such corpus file or directory")
    if kind == "kaldi" and location.name == "wav.scp":
        location = location.parent
    if listed is None:
        return _READERS[kind](location, problems, left_out)
    if kind == "folder":  # counted by its walk, which finds every file before the first source
        return _collected(lambda root, found, counts: _read_folder(root, found, counts, listed))(
            location, problems, left_out
        )
    return _counted(_READERS[kind](location, problems, left_out), listed)


def _counted(sources: Iterator[Source], listed: Callable[[int], object]) -> Iterator[Source]:
    for source in sources:
        listed(1)
        yield source


def _check_corpus_path(location: Path) -> None:
    """Refuse a corpus path that exists but is neither a directory nor a regular file (see
    :func:`read_corpus`)."""
    try:
        mode = os.stat(location).st_mode
    except OSError:
        return  # missing or unreadable: the callers say so
    problem = None if stat.S_ISDIR(mode) else not_regular(mode)
    if problem is not None:
        raise InputError(
            [
                InputProblem(
                    str(location),
                    "",
                    f"cannot read the corpus: {problem}; expected a corpus directory or manifest file",
                )
            ]
        )


def _collected(reader: Callable[[Path, Problems, Counter[str]], Iterator[Source]]) -> _Reader:
    """Give ``reader`` the public contract: append problems to the caller's list, or raise them at the end."""

    def public(
        path: str | os.PathLike[str], problems: Problems | None = None, left_out: Counter[str] | None = None
    ) -> Iterator[Source]:
        collected: Problems = [] if problems is None else problems
        yield from reader(Path(path), collected, Counter() if left_out is None else left_out)
        if problems is None and collected:
            raise InputError(collected)

    public.__name__ = reader.__name__.lstrip("_")
    public.__doc__ = reader.__doc__
    return public


def _read_folder(
    root: Path, problems: Problems, left_out: Counter[str], listed: Callable[[int], object] | None = None
) -> Iterator[Source]:
    """Audio files under a folder (recursive, sorted, through symlinked sub-directories); a ``.txt`` (else
    ``.lab``) sidecar of the same name is the transcript. Files of other formats, and sidecars no sample uses,
    are counted in ``left_out`` (see :mod:`shardio.packing.folder`)."""
    audio, transcripts = walk_folder(root, AUDIO_EXTENSIONS, left_out, listed)
    for name in audio:
        stem = name.rpartition(".")[0]
        meta: dict[str, Any] = {}
        sidecar = transcripts.get(name)
        if sidecar is not None:
            try:
                meta["text"] = read_regular_input(root / sidecar).decode("utf-8").strip()
            except OSError as exc:
                problems.append(
                    InputProblem(
                        str(root / sidecar),
                        stem,
                        f"cannot read the transcript ({exc.strerror or exc}); the sample is left out",
                    )
                )
                continue
            except UnicodeDecodeError as exc:
                problems.append(
                    InputProblem(
                        str(root / sidecar),
                        stem,
                        "the transcript is not UTF-8 (byte "
                        f"{exc.start} cannot be decoded); the sample is left out",
                    )
                )
                continue
        yield Source(key=stem, audio_path=str(root / name), meta=meta)


def _read_jsonl(manifest: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A NeMo-style JSONL manifest: ``audio_filepath``, ``duration``, ``text``, optional ``offset``."""
    entries: list[tuple[str, dict[str, Any]]] = []
    for number, line in manifest_lines(manifest, problems):
        where = f"{manifest}:{number}"
        try:
            record = json_entry(line)
            audio = record.pop("audio_filepath", None)
            if not isinstance(audio, str) or not audio:
                raise ValueError("no 'audio_filepath' string")
            offset = seconds_field(record.pop("offset", None), "offset")
            duration = seconds_field(record.pop("duration", None), "duration")
        except ValueError as exc:
            problems.append(InputProblem(where, "", f"not a valid manifest line: {exc}"))
            continue
        path = resolve_path(manifest.parent, audio)
        entry: dict[str, Any] = {
            "where": where,
            "stem": Path(audio).stem,
            "offset": offset,
            "duration": duration if offset is not None else None,
        }
        for name in KEY_COLUMNS:
            if record.get(name) not in (None, ""):
                entry["key"] = str(record.pop(name))
                break
        entry["meta"] = record
        entries.append((path, entry))
    segment_keys(entries)
    for path, entry in entries:
        yield Source(
            key=entry.get("key", entry["stem"]),
            audio_path=path,
            offset=entry["offset"],
            duration=entry["duration"],
            meta=entry["meta"],
            origin=entry["where"],
        )


read_folder = _collected(_read_folder)
read_jsonl = _collected(_read_jsonl)
read_kaldi = _collected(kaldi_sources)
read_table = _collected(table_sources)
_READERS: dict[str, _Reader] = {
    "folder": read_folder,
    "jsonl": read_jsonl,
    "kaldi": read_kaldi,
    "tsv": read_table,
    **{kind: _collected(imported_reader(kind)) for kind in IMPORTED_KINDS},
}
