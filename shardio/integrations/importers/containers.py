"""Reading audio stored inside another file: a row of a Parquet or Arrow table, a member of a tar.

A :class:`~shardio.packing.source.Source` with a ``member`` names such audio; :func:`read_member` returns its
bytes as they are stored. A pack worker reads the members of one partition in order, so the last few row
groups, tables and tar listings it opened are kept (a bounded cache per process); Arrow
files are memory-mapped.
"""

from __future__ import annotations

import functools
import tarfile
from typing import Any

from ...packing.source import open_regular_input

__all__ = ["read_member", "table_member"]

_CACHED = 4


def table_member(column: str, row: int, name: str) -> str:
    """The member string of row ``row``'s audio in ``column`` (``name`` ends with the audio's extension)."""
    return f"{column}/{row}/{name}"


def read_member(path: str, member: str) -> bytes:
    """The stored bytes of ``member`` of the file at ``path`` (``.parquet``, ``.arrow``, ``.tar``).

    Raises :class:`KeyError` for a member that is not there, :class:`ValueError` for one without audio bytes.
    """
    if path.endswith(".tar"):
        offset, size = _tar_listing(path)[member]
        with open_regular_input(path) as handle:  # a FIFO put in the tar's place is refused, not read
            handle.seek(offset)
            return handle.read(size)
    column, row_text, _ = member.split("/", 2)
    row = int(row_text)
    if path.endswith(".parquet"):
        groups = _parquet_groups(path)
        group = next((i for i, (start, stop) in enumerate(groups) if start <= row < stop), None)
        if group is None:
            raise KeyError(f"row {row} is past the table's {groups[-1][1] if groups else 0} rows")
        value = _parquet_group(path, group, column)[row - groups[group][0]].as_py()
    elif path.endswith(".arrow"):
        table = _arrow_table(path)
        if row >= table.num_rows:
            raise KeyError(f"row {row} is past the table's {table.num_rows} rows")
        value = table.column(column)[row].as_py()
    else:
        raise ValueError(f"{path}: not a Parquet, Arrow or tar file")
    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, bytes):
        raise ValueError(f"row {row} of column {column!r} holds no audio bytes")
    return data


@functools.lru_cache(maxsize=_CACHED)
def _parquet_groups(path: str) -> list[tuple[int, int]]:
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(path).metadata
    bounds, start = [], 0
    for i in range(metadata.num_row_groups):
        stop = start + metadata.row_group(i).num_rows
        bounds.append((start, stop))
        start = stop
    return bounds


@functools.lru_cache(maxsize=_CACHED)
def _parquet_group(path: str, group: int, column: str) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read_row_group(group, columns=[column]).column(column)


@functools.lru_cache(maxsize=_CACHED)
def _arrow_table(path: str) -> Any:
    import pyarrow as pa

    source = pa.memory_map(path)
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source).read_all()


@functools.lru_cache(maxsize=_CACHED)
def _tar_listing(path: str) -> dict[str, tuple[int, int]]:
    with open_regular_input(path) as raw, tarfile.open(fileobj=raw, mode="r:") as archive:
        return {info.name: (info.offset_data, info.size) for info in archive if info.isfile()}
