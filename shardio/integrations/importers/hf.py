"""Hugging Face datasets as a corpus: a dataset saved with ``save_to_disk``, or Parquet files, with an Audio column.

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

from ...errors import InputProblem, OptionError
from ...packing.source import Problems, Source, resolve_path
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
        return (path / "state.json").is_file() or any(path.glob("*.parquet")) or any(path.glob("data/*.parquet"))
    return path.suffix in (".parquet", ".arrow")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise OptionError("reading Hugging Face datasets needs pyarrow: pip install 'shardio[hf]'") from None
    return pyarrow


def _table_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    state = path / "state.json"
    if state.is_file():
        files = json.loads(state.read_text(encoding="utf-8")).get("_data_files", [])
        return [path / entry["filename"] for entry in files]
    return sorted(path.rglob("*.parquet"))


def _audio_column(schema: Any) -> str | None:
    features = {}
    metadata = schema.metadata or {}
    if b"huggingface" in metadata:
        features = json.loads(metadata[b"huggingface"]).get("info", {}).get("features", {})
    for name, feature in features.items():
        if isinstance(feature, dict) and feature.get("_type") == "Audio":
            return str(name)
    for field in schema:  # no feature metadata: a struct of bytes and path
        names = {field.type.field(i).name for i in range(field.type.num_fields)} if hasattr(field.type, "num_fields") \
            else set()
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


def _plain(value: Any) -> Any:
    """A metadata value JSON can hold (bytes are left out by the caller; other types become strings)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _ext(data: bytes | None, name: str) -> str:
    ext = os.path.splitext(name)[1][1:].lower()
    if ext or not data:
        return ext or "unknown"
    for magic, found in _MAGIC:
        if data.startswith(magic):
            return found
    return "mp3" if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 else "unknown"


def read_hf(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The rows of a Hugging Face dataset (see the module docstring), in file then row order."""
    number = 0
    for file in _table_files(path):
        if not file.is_file():
            problems.append(InputProblem(str(file), "", "a data file the dataset lists is missing"))
            continue
        audio = _audio_column(_schema(file))
        if audio is None:
            problems.append(InputProblem(str(file), "", "no Audio column (a struct of 'bytes' and 'path')"))
            continue
        row = 0
        for batch in _batches(file):
            for values in batch.to_pylist():
                value = values.pop(audio) or {}
                data, name = value.get("bytes"), value.get("path") or ""
                meta = {k: _plain(v) for k, v in values.items() if not isinstance(v, bytes)}
                text = next((meta[c] for c in _TEXT_COLUMNS if isinstance(meta.get(c), str)), None)
                if text is not None:
                    meta["text"] = text
                key = next((str(values[c]) for c in _KEY_COLUMNS if values.get(c) not in (None, "")),
                           f"{number:09d}")
                origin = f"{file.name}:row {row}"
                if data:
                    member = table_member(audio, row, f"audio.{_ext(data, os.path.basename(name))}")
                    yield Source(key, str(file), meta=meta, origin=origin, member=member, size=len(data))
                elif name:
                    yield Source(key, resolve_path(file.parent, name), meta=meta, origin=origin)
                else:
                    problems.append(InputProblem(f"{file}:row {row}", key, "the Audio value has neither bytes "
                                                 "nor a path"))
                row += 1
                number += 1
