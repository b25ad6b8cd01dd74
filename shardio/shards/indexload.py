"""Reading a dataset's index from its location: ``index.json``, then its columns file (mapped where it is
local, else fetched), checked against the header's digest and size bound; :meth:`shardio.Index.load` builds
the index from these parts and checks them against each other."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from ..errors import FormatError, OptionError, shown, shown_path
from ..storage.files import is_url, join
from . import indexchecks, indexfile
from .indexfile import ColumnsFile
from .indexheader import INDEX_JSON, check_fingerprint, check_version, columns_file_of, read_header
from .keys import Keys
from .metadata import Metadata
from .shardtable import ShardTable

__all__ = ["IndexParts", "check_loaded", "read_index"]


class IndexParts(NamedTuple):
    """What an index is made of, as read from its location."""

    root: str
    json_path: str
    columns_path: str
    header: dict[str, Any]
    shards: ShardTable
    columns: dict[str, np.ndarray]
    keys: Keys
    meta: Metadata | None
    mapped: ColumnsFile | None


def read_index(
    location: str | os.PathLike[str], storage_options: dict[str, Any] | None, columns_spec: dict[str, type]
) -> IndexParts:
    """The parts of the index at ``location`` (a directory, URL, or its ``index.json``), read with
    ``storage_options``; ``columns_spec``: the columns' names and dtypes."""
    if not isinstance(location, (str, os.PathLike)) or (
        storage_options is not None and not isinstance(storage_options, dict)
    ):
        raise OptionError(
            f"Index.load takes a dataset's location (a path or URL) and a dict of fsspec "
            f"options, not {shown(location)} and {shown(storage_options)}"
        )
    location = os.fspath(location)
    if location.startswith("file://"):  # read as the local path it names (links resolved against that)
        location = location.removeprefix("file://").removeprefix("localhost")
        if not location.startswith("/"):
            raise OptionError(
                f"{shown_path('file://' + location)}: a file URL names a path on this machine (file:///path)"
            )
    root = location[: -len(INDEX_JSON) - 1] if location.endswith("/" + INDEX_JSON) else location
    json_path = join(root, INDEX_JSON)
    header = read_header(root, json_path, storage_options)
    version = check_version(header, json_path)
    columns_file = columns_file_of(header, version, json_path)
    columns_path = join(root, columns_file)
    bound = indexchecks.columns_size_bound(header.get("samples"), json_path, header.get("meta_bytes"))
    mapped = None
    if version == 1:
        payload = indexchecks.read_columns(root, columns_path, bound, storage_options)
        columns, keys = indexfile.read_format1(
            payload, columns_path, header.get("columns_sha256"), columns_spec, header["samples"]
        )  # checked by the bound
        meta = None
    else:
        if not is_url(columns_path):
            indexchecks.check_local_columns(root, columns_path, bound, columns_path)
        mapped = indexfile.map_columns(columns_path, header, columns_spec, json_path, storage_options)
        columns, keys, meta = mapped.columns(), mapped.keys(), mapped.metadata()
    try:
        entries = header["shards"]
        if not isinstance(entries, list):
            raise TypeError(f"'shards' must be a list, not {type(entries).__name__}")
        shards = ShardTable.of(entries, json_path)
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(
            f"{shown_path(json_path)}: index header has a missing or malformed field ({exc})"
        ) from None
    return IndexParts(root, json_path, columns_path, header, shards, columns, keys, meta, mapped)


def check_loaded(index: Any, parts: IndexParts, allow_outside_root: bool) -> None:
    """A :class:`FormatError` where the index made of ``parts`` does not hold together: shard names outside
    the root (unless allowed), a damaged structure, counts that differ from the header, frames a format cannot
    have, keys for other samples, or a fingerprint that is not its header's digest."""
    json_path = parts.json_path
    names = index.table.names()
    indexchecks.check_names(index.root, names, json_path, allow_outside_root)  # before messages name them
    index.validate(json_path)
    if parts.header.get("samples") != len(index):
        raise FormatError(
            f"{shown_path(json_path)}: 'samples' is {parts.header.get('samples')!r}, the columns "
            f"hold {len(index)}"
        )
    indexchecks.check_frames(index.columns, index.formats, names, json_path, index.key)
    if len(parts.keys) != len(index):
        raise FormatError(f"{parts.columns_path}: {len(parts.keys)} keys for {len(index)} samples")
    check_fingerprint(parts.header, json_path)  # last: a damaged index is named by what is damaged
