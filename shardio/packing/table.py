"""The TSV/CSV corpus reader behind :func:`shardio.packing.corpus.read_table`: a header naming the audio path
column (the delimiter detected), or LJSpeech's headerless ``metadata.csv``."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError, InputProblem
from .source import (
    AUDIO_EXTENSIONS,
    KEY_COLUMNS,
    Problems,
    Source,
    manifest_text,
    resolve_path,
    seconds_field,
    segment_keys,
)

__all__ = ["PATH_COLUMNS", "TEXT_COLUMNS", "table_sources"]

PATH_COLUMNS = ("path", "audio", "audio_path", "audio_filepath", "audio_file", "file")
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence")
_TABLE_DELIMITERS = ("\t", "|", ",", ";")


def _table_layout(table: Path, first_line: str) -> tuple[str, bool]:
    """The delimiter, and whether the first line is a header naming a path column."""
    for delimiter in _TABLE_DELIMITERS:
        header = [name.strip().lower() for name in first_line.rstrip("\r\n").split(delimiter)]
        if any(name in PATH_COLUMNS for name in header):
            return delimiter, True
    fields = first_line.split("|")
    if 2 <= len(fields) <= 3 and any(
        (table.parent / "wavs" / f"{fields[0]}.{e}").exists() for e in AUDIO_EXTENSIONS
    ):
        return "|", False  # LJSpeech's headerless id|text|normalized
    raise InputError(
        [
            InputProblem(
                str(table),
                "",
                "the first line is not a header naming the audio path column "
                f"(expected one of {', '.join(PATH_COLUMNS)}; delimiters tried: tab | , ;)",
            )
        ]
    )


def _unique_columns(table: Path, header: list[str], lowered: list[str]) -> None:
    """Refuse a header naming a column twice (any case): one column's values would
    replace the other's unseen."""
    twice = sorted({name for i, name in enumerate(header) if lowered.index(name.lower()) != i})
    if twice:
        raise InputError(
            [
                InputProblem(
                    f"{table}:1",
                    "",
                    f"the header names the column(s) "
                    f"{', '.join(map(repr, twice))} twice; expected each column once (one "
                    "column's values would replace the other's)",
                )
            ]
        )


def table_sources(table: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A TSV/CSV with a header (path column, text column, others kept), or LJSpeech's ``metadata.csv``."""
    with io.StringIO(manifest_text(table, "utf-8-sig"), newline="") as handle:
        first = handle.readline()
        delimiter, has_header = _table_layout(table, first)
        handle.seek(0)
        quoting: Literal[0, 3] = csv.QUOTE_MINIMAL if delimiter in ",;" else csv.QUOTE_NONE
        rows = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        header = [name.strip() for name in next(rows)] if has_header else ["id", "raw_text", "text"]
        lowered = [name.lower() for name in header]
        _unique_columns(table, header, lowered)
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
                audio = next(
                    (
                        f"wavs/{row[0]}.{e}"
                        for e in AUDIO_EXTENSIONS
                        if (table.parent / "wavs" / f"{row[0]}.{e}").exists()
                    ),
                    f"wavs/{row[0]}.wav",
                )
                meta = {"text": row[2] or row[1], "raw_text": row[1]}
                entries.append(
                    (
                        resolve_path(table.parent, audio),
                        {
                            "where": where,
                            "stem": row[0],
                            "key": row[0],
                            "offset": None,
                            "duration": None,
                            "meta": meta,
                        },
                    )
                )
                continue
            if len(row) != len(header):
                problems.append(InputProblem(where, "", f"{len(row)} fields, the header has {len(header)}"))
                continue
            audio = row[path_column].strip() if path_column is not None else ""
            if not audio:
                problems.append(
                    InputProblem(where, "", f"empty audio path in column {header[path_column or 0]!r}")
                )
                continue
            record = {
                name: value
                for i, (name, value) in enumerate(zip(header, row))
                if i not in (path_column, text_column, key_column)
            }
            try:
                offset = seconds_field(record.pop("offset", None), "offset")
                duration = seconds_field(record.pop("duration", None), "duration")
            except ValueError as exc:
                problems.append(InputProblem(where, "", str(exc)))
                continue
            meta = ({"text": row[text_column]} if text_column is not None else {}) | record
            entry: dict[str, Any] = {
                "where": where,
                "stem": Path(audio).stem,
                "offset": offset,
                "duration": duration if offset is not None else None,
                "meta": meta,
            }
            if key_column is not None and row[key_column].strip():
                entry["key"] = row[key_column].strip()
            entries.append((resolve_path(table.parent, audio), entry))
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
