"""Hugging Face datasets as a corpus: a dataset saved with ``save_to_disk``, or Parquet
files, with an Audio column.

Audio bytes stored in the table are copied as they are (no decoding here; pack validates them); a row whose
Audio value has only a ``path`` names a file (relative paths from the table's folder). The other columns
become metadata; the first of ``text``/``transcript``/``transcription``/``sentence`` is the transcript
(``text``). Keys come from an ``id`` or ``key`` column, else the row's number in the dataset (``000000012``).
Needs ``pyarrow`` (the ``hf`` extra); the ``datasets`` package itself is not needed to read.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import InputProblem, OptionError, shown
from ...packing.source import NotRegularFile, Problems, Source, read_regular_input, resolve_path
from .containers import table_member

__all__ = ["is_hf_dataset", "read_hf"]

_ROWS = 64  # rows made Python objects at once (their audio bytes included): bounded driver memory
_TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence")
_KEY_COLUMNS = ("id", "key")
_MAGIC = ((b"RIFF", "wav"), (b"RF64", "wav"), (b"fLaC", "flac"), (b"OggS", "ogg"), (b"ID3", "mp3"))


def is_hf_dataset(path: Path) -> bool:
    """Whether ``path`` is a saved dataset, a Parquet/Arrow file, or a folder of Parquet files (or ``data/``
    of them, as on the hub)."""
    if path.is_dir():
        return (
            (path / "state.json").is_file() or any(path.glob("*.parquet")) or any(path.glob("data/*.parquet"))
        )
    return path.suffix in (".parquet", ".arrow")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise OptionError("reading Hugging Face datasets needs pyarrow: pip install 'shardio[hf]'") from None
    return pyarrow


def _table_files(path: Path, problems: Problems) -> list[Path]:
    """The data files of the dataset at ``path``: those ``state.json`` lists (each inside the folder), else
    its Parquet files. A ``state.json`` that cannot be read, or that names a file outside the folder, is a
    problem (a hostile dataset must not make pack read other files)."""
    if not path.is_dir():
        return [path]
    state = path / "state.json"
    if not state.is_file():
        return sorted(path.rglob("*.parquet"))
    try:
        listed = json.loads(read_regular_input(state).decode("utf-8")).get("_data_files", [])
        names = [entry["filename"] for entry in listed]
    except (
        NotRegularFile,
        UnicodeDecodeError,
        ValueError,
        AttributeError,
        TypeError,
        KeyError,
        RecursionError,
    ):
        problems.append(
            InputProblem(
                str(state),
                "",
                "not a saved dataset's state: expected a UTF-8 JSON object "
                "whose '_data_files' lists objects with a 'filename'",
            )
        )
        return []
    files = []
    for name in names:
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            problems.append(
                InputProblem(
                    str(state),
                    "",
                    f"the data file {shown(name)} is not a file name inside "
                    "the dataset's folder; expected a relative path without '..'",
                )
            )
            continue
        files.append(path / name)
    return files


def _audio_column(schema: Any) -> str | None:
    features = {}
    metadata = schema.metadata or {}
    if b"huggingface" in metadata:
        features = json.loads(metadata[b"huggingface"]).get("info", {}).get("features", {})
    for name, feature in features.items():
        if isinstance(feature, dict) and feature.get("_type") == "Audio":
            return str(name)
    for field in schema:  # no feature metadata: a struct of bytes and path
        names = (
            {field.type.field(i).name for i in range(field.type.num_fields)}
            if hasattr(field.type, "num_fields")
            else set()
        )
        if {"bytes", "path"} <= names:
            return str(field.name)
    return None


def _batches(file: Path) -> Iterator[Any]:
    pa = _pyarrow()
    if file.suffix == ".parquet":
        yield from pa.parquet.ParquetFile(file).iter_batches(batch_size=_ROWS)
        return
    source = pa.memory_map(str(file))
    try:
        batches: Iterator[Any] = iter(pa.ipc.open_stream(source))
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(source)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    for batch in batches:  # memory-mapped: slices cost nothing until their rows become Python objects
        yield from (batch.slice(start, _ROWS) for start in range(0, batch.num_rows, _ROWS))


def _schema(file: Path) -> Any:
    pa = _pyarrow()
    if file.suffix == ".parquet":
        return pa.parquet.read_schema(file)
    source = pa.memory_map(str(file))
    try:
        return pa.ipc.open_stream(source).schema
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source).schema


_BYTES = object()  # what _plain makes of bytes: left out of the metadata wherever they are nested


def _plain(value: Any) -> Any:
    """A metadata value JSON can hold: bytes (another Audio column's, say) are :data:`_BYTES`, left out by the
    caller and inside lists and dicts, so no file's raw bytes reach the metadata; other
    types become strings."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _BYTES
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [p for p in map(_plain, value) if p is not _BYTES]
    if isinstance(value, dict):
        return {str(k): p for k, v in value.items() if (p := _plain(v)) is not _BYTES}
    return str(value)


def _ext(data: bytes | None, name: str) -> str:
    ext = os.path.splitext(name)[1][1:].lower()
    if ext or not data:
        return ext or "unknown"
    for magic, found in _MAGIC:
        if data.startswith(magic):
            return found
    return "mp3" if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 else "unknown"


def _rows(file: Path, problems: Problems) -> Iterator[dict[str, Any]]:
    """The rows of one data file as dicts; a file that is not a readable table (or stops being one part of
    the way) is a problem naming it."""
    pa = _pyarrow()
    try:
        for batch in _batches(file):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        problems.append(
            InputProblem(
                str(file),
                "",
                f"cannot read the table ({shown(str(exc), 200)}); expected a Parquet or Arrow file",
            )
        )


def _audio_value(value: Any) -> tuple[bytes | None, str] | str:
    """An Audio value as ``(bytes or None, path)``, or why it is not one."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        return f"the Audio value is {type(value).__name__}, expected a struct of 'bytes' and 'path'"
    data, name = value.get("bytes"), value.get("path") or ""
    if not isinstance(data, (bytes, type(None))) or not isinstance(name, str):
        return "the Audio value's 'bytes' or 'path' has the wrong type; expected binary and a string"
    return data, name


def read_hf(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The rows of a Hugging Face dataset (see the module docstring), in file then row order."""
    pa = _pyarrow()
    number = 0
    for file in _table_files(path, problems):
        if not file.is_file():
            problems.append(
                InputProblem(
                    str(file), "", "a data file the dataset lists is missing (or is not a regular file)"
                )
            )
            continue
        try:
            audio = _audio_column(_schema(file))
        except (pa.ArrowException, OSError, ValueError) as exc:
            problems.append(
                InputProblem(
                    str(file),
                    "",
                    f"cannot read the table's schema ({shown(str(exc), 200)}); "
                    "expected a Parquet or Arrow file",
                )
            )
            continue
        if audio is None:
            problems.append(InputProblem(str(file), "", "no Audio column (a struct of 'bytes' and 'path')"))
            continue
        for row, values in enumerate(_rows(file, problems)):
            audio_value = _audio_value(values.pop(audio, None))
            meta = {k: p for k, v in values.items() if (p := _plain(v)) is not _BYTES}
            text = next((meta[c] for c in _TEXT_COLUMNS if isinstance(meta.get(c), str)), None)
            if text is not None:
                meta["text"] = text
            key = next(
                (str(values[c]) for c in _KEY_COLUMNS if values.get(c) not in (None, "")), f"{number:09d}"
            )
            origin = f"{file.name}:row {row}"
            number += 1
            if isinstance(audio_value, str):
                problems.append(InputProblem(f"{file}:row {row}", key, audio_value))
                continue
            data, name = audio_value
            if data:
                member = table_member(audio, row, f"audio.{_ext(data, os.path.basename(name))}")
                yield Source(key, str(file), meta=meta, origin=origin, member=member, size=len(data))
            elif name:
                yield Source(key, resolve_path(file.parent, name), meta=meta, origin=origin)
            else:
                problems.append(
                    InputProblem(f"{file}:row {row}", key, "the Audio value has neither bytes nor a path")
                )
