"""Corpus readers: an audio folder, a JSONL manifest, a Kaldi data dir or a TSV/CSV table, as :class:`Source` s.

Every reader yields its sources in a deterministic order (sorted paths for a folder, file order for the
manifests). An entry that cannot become a source (a malformed line, a piped ``wav.scp`` command, a row
without a path) is an :class:`~shardio.errors.InputProblem` naming the file and line: readers append it to
the ``problems`` list they are given, or raise :class:`~shardio.errors.InputError` listing them all at the
end when they are given none. Nothing here opens the audio; :func:`shardio.packing.pack.pack` validates it.
"""

from __future__ import annotations

from typing import Literal

import csv
import io
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError, InputProblem, OptionError
from ..integrations.importers.kinds import IMPORTED_KINDS, detect_imported, imported_reader
from .folder import walk_folder
from .source import Problems, Source, manifest_text, resolve_path, seconds_field, segment_keys

__all__ = ["AUDIO_EXTENSIONS", "KINDS", "Source", "detect_kind", "read_corpus", "read_folder", "read_jsonl",
           "read_kaldi", "read_table"]

logger = logging.getLogger(__name__)

AUDIO_EXTENSIONS = ("wav", "flac", "ogg", "oga", "mp3", "opus")
KINDS = ("folder", "jsonl", "kaldi", "tsv", *IMPORTED_KINDS)
PATH_COLUMNS = ("path", "audio", "audio_path", "audio_filepath", "audio_file", "file")
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence")
KEY_COLUMNS = ("id", "key")
_TABLE_DELIMITERS = ("\t", "|", ",", ";")


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
        raise OptionError(f"{location}: no such corpus file or directory")
    if location.name == "wav.scp":
        return "kaldi"
    suffix = location.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".tsv", ".csv", ".psv", ".txt"):
        return "tsv"
    raise OptionError(f"{location}: cannot tell the corpus kind from the name; pass a kind, one of {KINDS}")


def read_corpus(path: str | os.PathLike[str], kind: str | None = None, *,
                problems: Problems | None = None, left_out: Counter[str] | None = None) -> Iterator[Source]:
    """The sources of the corpus at ``path`` (its kind detected unless given), in a deterministic order.

    Files a folder holds that are not inputs are counted in ``left_out`` (by extension) when given."""
    kind = {"csv": "tsv", "table": "tsv"}.get(kind or "", kind) or detect_kind(path)
    if kind not in _READERS:
        raise OptionError(f"unknown corpus kind {kind!r}; expected one of {KINDS}")
    location = Path(path)
    if not location.exists():
        raise OptionError(f"{location}: no such corpus file or directory")
    if kind == "kaldi" and location.name == "wav.scp":
        location = location.parent
    return _READERS[kind](location, problems, left_out)


def _collected(reader: Callable[[Path, Problems, Counter[str]], Iterator[Source]]) -> _Reader:
    """Give ``reader`` the public contract: append problems to the caller's list, or raise them at the end."""

    def public(path: str | os.PathLike[str], problems: Problems | None = None,
               left_out: Counter[str] | None = None) -> Iterator[Source]:
        collected: Problems = [] if problems is None else problems
        yield from reader(Path(path), collected, Counter() if left_out is None else left_out)
        if problems is None and collected:
            raise InputError(collected)

    public.__name__ = reader.__name__.lstrip("_")
    public.__doc__ = reader.__doc__
    return public


def _read_folder(root: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """Audio files under a folder (recursive, sorted, through symlinked sub-directories); a ``.txt`` (else
    ``.lab``) sidecar of the same name is the transcript. Files of other formats, and sidecars no sample uses,
    are counted in ``left_out`` (see :mod:`shardio.packing.folder`)."""
    audio, transcripts = walk_folder(root, AUDIO_EXTENSIONS, left_out)
    for name in audio:
        stem = name.rpartition(".")[0]
        meta: dict[str, Any] = {}
        sidecar = transcripts.get(name)
        if sidecar is not None:
            try:
                meta["text"] = (root / sidecar).read_bytes().decode("utf-8").strip()
            except OSError as exc:
                problems.append(InputProblem(str(root / sidecar), stem, "cannot read the transcript "
                                             f"({exc.strerror or exc}); the sample is left out"))
                continue
            except UnicodeDecodeError as exc:
                problems.append(InputProblem(str(root / sidecar), stem, "the transcript is not UTF-8 (byte "
                                             f"{exc.start} cannot be decoded); the sample is left out"))
                continue
        yield Source(key=stem, audio_path=str(root / name), meta=meta)


def _read_jsonl(manifest: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A NeMo-style JSONL manifest: ``audio_filepath``, ``duration``, ``text``, optional ``offset``."""
    entries: list[tuple[str, dict[str, Any]]] = []
    with io.StringIO(manifest_text(manifest, "utf-8-sig")) as handle:
        for number, line in enumerate(handle, 1):
            where = f"{manifest}:{number}"
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("expected a JSON object")
                audio = record.pop("audio_filepath", None)
                if not isinstance(audio, str) or not audio:
                    raise ValueError("no 'audio_filepath' string")
                offset = seconds_field(record.pop("offset", None), "offset")
                duration = seconds_field(record.pop("duration", None), "duration")
            except ValueError as exc:
                problems.append(InputProblem(where, "", f"not a valid manifest line: {exc}"))
                continue
            path = resolve_path(manifest.parent, audio)
            entry: dict[str, Any] = {"where": where, "stem": Path(audio).stem, "offset": offset,
                                     "duration": duration if offset is not None else None}
            for name in KEY_COLUMNS:
                if record.get(name) not in (None, ""):
                    entry["key"] = str(record.pop(name))
                    break
            entry["meta"] = record
            entries.append((path, entry))
    segment_keys(entries)
    for path, entry in entries:
        yield Source(key=entry.get("key", entry["stem"]), audio_path=path, offset=entry["offset"],
                     duration=entry["duration"], meta=entry["meta"], origin=entry["where"])


def _kaldi_table(path: Path, problems: Problems, fields: int) -> dict[str, tuple[list[str], str]]:
    """``{first field: (the other fields, 'file:line')}``; the last of ``fields`` takes the rest of the line."""
    table: dict[str, tuple[list[str], str]] = {}
    if not path.is_file():
        return table
    with io.StringIO(manifest_text(path, "utf-8")) as handle:
        for number, line in enumerate(handle, 1):
            parts = line.strip().split(maxsplit=fields - 1)
            if not parts:
                continue
            where = f"{path}:{number}"
            if len(parts) < fields and not (fields == 2 and path.name == "text"):
                problems.append(InputProblem(where, parts[0], f"expected {fields} fields, found {len(parts)}"))
                continue
            if parts[0] in table:
                problems.append(InputProblem(where, parts[0], f"{parts[0]!r} is listed twice in {path.name} "
                                             f"(first at {table[parts[0]][1]})"))
                continue
            table[parts[0]] = (parts[1:], where)
    return table


def _read_kaldi(data_dir: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A Kaldi data dir: ``wav.scp`` (plain paths), ``text``, optional ``utt2spk`` and ``segments``. Lines of
    ``text`` and ``utt2spk`` whose id is no utterance's are counted in ``left_out``."""
    if not (data_dir / "wav.scp").is_file():
        raise InputError([InputProblem(str(data_dir), "", "not a Kaldi data dir: no wav.scp")])
    recordings = _kaldi_table(data_dir / "wav.scp", problems, 2)
    texts = _kaldi_table(data_dir / "text", problems, 2)
    speakers = _kaldi_table(data_dir / "utt2spk", problems, 2)
    paths: dict[str, str] = {}
    for rec, ([command], where) in recordings.items():
        if command.endswith("|"):
            problems.append(InputProblem(where, rec, f"wav.scp entry is a piped command ({command!r}); only "
                                         "plain file paths are supported: write the audio to files first"))
            continue
        resolved = Path(resolve_path(data_dir, command))
        # Kaldi paths are relative to the recipe directory the tools run in, usually the cwd.
        paths[rec] = str(resolved if resolved.exists() or Path(command).is_absolute() else Path(command).resolve())
    segments = _kaldi_table(data_dir / "segments", problems, 4)
    if segments:
        items = [(utt, fields, where) for utt, (fields, where) in segments.items()]
    else:
        items = [(rec, [rec], where) for rec, (_, where) in recordings.items()]
    for utt, fields, where in items:
        rec = fields[0]
        if rec not in paths:
            if rec not in recordings:
                problems.append(InputProblem(where, utt, f"recording {rec!r} is not in wav.scp"))
            continue
        offset = duration = None
        meta: dict[str, Any] = {}
        if segments:
            try:
                start, end = float(fields[1]), float(fields[2])
            except ValueError:
                problems.append(InputProblem(where, utt, f"segment times {fields[1:]} are not numbers"))
                continue
            if start < 0 or (end >= 0 and end <= start):
                problems.append(InputProblem(where, utt, f"segment [{start}, {end}] is empty or negative"))
                continue
            offset, duration = start, (end - start if end >= 0 else None)
            meta["recording"] = rec
        if utt in texts:
            meta["text"] = texts[utt][0][0] if texts[utt][0] else ""
        if utt in speakers:
            meta["speaker"] = speakers[utt][0][0]
        yield Source(key=utt, audio_path=paths[rec], offset=offset, duration=duration, meta=meta, origin=where)
    utterances = {utt for utt, _, _ in items}
    for name, table in (("text", texts), ("utt2spk", speakers)):
        stray = len(table.keys() - utterances)  # keyed by recording where segments name utterances, say
        if stray:
            left_out[f"{name} lines naming no utterance"] += stray


def _table_layout(table: Path, first_line: str) -> tuple[str, bool]:
    """The delimiter, and whether the first line is a header naming a path column."""
    for delimiter in _TABLE_DELIMITERS:
        header = [name.strip().lower() for name in first_line.rstrip("\r\n").split(delimiter)]
        if any(name in PATH_COLUMNS for name in header):
            return delimiter, True
    fields = first_line.split("|")
    if 2 <= len(fields) <= 3 and any((table.parent / "wavs" / f"{fields[0]}.{e}").exists() for e in AUDIO_EXTENSIONS):
        return "|", False  # LJSpeech's headerless id|text|normalized
    raise InputError([InputProblem(str(table), "", "the first line is not a header naming the audio path column "
                                   f"(expected one of {', '.join(PATH_COLUMNS)}; delimiters tried: tab | , ;)")])


def _read_table(table: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A TSV/CSV with a header (path column, text column, others kept), or LJSpeech's ``metadata.csv``."""
    with io.StringIO(manifest_text(table, "utf-8-sig"), newline="") as handle:
        first = handle.readline()
        delimiter, has_header = _table_layout(table, first)
        handle.seek(0)
        quoting: Literal[0, 3] = csv.QUOTE_MINIMAL if delimiter in ",;" else csv.QUOTE_NONE
        rows = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        header = [name.strip() for name in next(rows)] if has_header else ["id", "raw_text", "text"]
        lowered = [name.lower() for name in header]
        path_column = next((lowered.index(c) for c in PATH_COLUMNS if c in lowered), None)
        text_column = next((lowered.index(c) for c in TEXT_COLUMNS if c in lowered), None)
        key_column = next((lowered.index(c) for c in KEY_COLUMNS if c in lowered), None)
        entries: list[tuple[str, dict[str, Any]]] = []
        for number, row in enumerate(rows, 2 if has_header else 1):
            where = f"{table}:{number}"
            if not any(cell.strip() for cell in row):
                continue
            if not has_header:
                row = row + [""] * (3 - len(row))
                audio = next((f"wavs/{row[0]}.{e}" for e in AUDIO_EXTENSIONS
                              if (table.parent / "wavs" / f"{row[0]}.{e}").exists()), f"wavs/{row[0]}.wav")
                meta = {"text": row[2] or row[1], "raw_text": row[1]}
                entries.append((resolve_path(table.parent, audio), {"where": where, "stem": row[0], "key": row[0],
                                "offset": None, "duration": None, "meta": meta}))
                continue
            if len(row) != len(header):
                problems.append(InputProblem(where, "", f"{len(row)} fields, the header has {len(header)}"))
                continue
            audio = row[path_column].strip() if path_column is not None else ""
            if not audio:
                problems.append(InputProblem(where, "", f"empty audio path in column {header[path_column or 0]!r}"))
                continue
            record = {name: value for i, (name, value) in enumerate(zip(header, row))
                      if i not in (path_column, text_column, key_column)}
            try:
                offset = seconds_field(record.pop("offset", None), "offset")
                duration = seconds_field(record.pop("duration", None), "duration")
            except ValueError as exc:
                problems.append(InputProblem(where, "", str(exc)))
                continue
            meta = ({"text": row[text_column]} if text_column is not None else {}) | record
            entry: dict[str, Any] = {"where": where, "stem": Path(audio).stem, "offset": offset,
                                     "duration": duration if offset is not None else None, "meta": meta}
            if key_column is not None and row[key_column].strip():
                entry["key"] = row[key_column].strip()
            entries.append((resolve_path(table.parent, audio), entry))
    segment_keys(entries)
    for path, entry in entries:
        yield Source(key=entry.get("key", entry["stem"]), audio_path=path, offset=entry["offset"],
                     duration=entry["duration"], meta=entry["meta"], origin=entry["where"])


read_folder = _collected(_read_folder)
read_jsonl = _collected(_read_jsonl)
read_kaldi = _collected(_read_kaldi)
read_table = _collected(_read_table)
_READERS: dict[str, _Reader] = {
    "folder": read_folder, "jsonl": read_jsonl, "kaldi": read_kaldi, "tsv": read_table,
    **{kind: _collected(imported_reader(kind)) for kind in IMPORTED_KINDS}}
