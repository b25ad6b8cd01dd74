"""``index.json``: the header of a dataset's index made and digested, and read (bounded, from a regular file
under the root or a URL), its format version and the name of its columns file checked (see
:mod:`shardio.shards.index`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError, ReadError, shown_path
from ..storage.files import is_url, read_bytes
from . import indexchecks

__all__ = [
    "FORMAT_VERSION",
    "INDEX_COLUMNS",
    "INDEX_COLUMNS_V1",
    "INDEX_JSON",
    "METADATA_VERSION",
    "READ_VERSIONS",
    "UPGRADED_FROM",
    "check_fingerprint",
    "check_version",
    "columns_file_of",
    "digest",
    "make_header",
    "read_header",
]

FORMAT_VERSION = 2
METADATA_VERSION = 3  # format 2 plus per-sample metadata: a shardio that cannot read it refuses it by version
READ_VERSIONS = (1, 2, 3)
INDEX_JSON = "index.json"
INDEX_COLUMNS = "index.columns"
INDEX_COLUMNS_V1 = "index.npz"
UPGRADED_FROM = "upgraded_from"
"""The key of an upgraded index's header that records the fields its upgrade changed, as they were: with
them, the header is the one its kept fingerprint digests (:func:`check_fingerprint`)."""
UPGRADE_FIELDS = ("version", "columns_file", "columns_sha256", "keys_bytes")
"""The fields a format upgrade changes (and only these may an ``upgraded_from`` record)."""


def make_header(
    *,
    samples: int,
    duration: float,
    formats: list[str],
    columns: Mapping[str, Any],
    columns_sha256: str,
    keys_bytes: int,
    shards: list[dict[str, Any]],
    meta_bytes: int | None,
) -> dict[str, Any]:
    """What ``index.json`` records of an index, but its fingerprint: its counts, the columns file's name,
    dtypes and digest, and every shard's entry (``meta_bytes``: None without per-sample metadata)."""
    return {
        "format": "shardio-index",
        "version": FORMAT_VERSION if meta_bytes is None else METADATA_VERSION,
        "samples": samples,
        "duration": round(duration, 3),
        "formats": formats,
        "columns": {name: np.dtype(dtype).str for name, dtype in columns.items()},
        "columns_file": INDEX_COLUMNS,
        "columns_sha256": columns_sha256,
        "keys_bytes": keys_bytes,
        "shards": shards,
        **({} if meta_bytes is None else {"meta_bytes": meta_bytes}),
    }


def digest(header: Mapping[str, Any]) -> str:
    """The digest of a header made by :func:`make_header` (32 hex digits of the SHA-256 of its canonical
    JSON): an index's fingerprint where it is computed, and its content id."""
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def read_header(root: str, json_path: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The header in ``index.json`` (local under ``root``, or a URL): a JSON object of a shardio index."""
    try:
        raw = (
            read_bytes(json_path, storage_options)
            if is_url(json_path)
            else indexchecks.read_local_index(root, json_path)
        )
    except FileNotFoundError:
        raise FormatError(
            f"{shown_path(json_path)}: no index here; run 'shardio pack' or 'shardio index' first"
        ) from None
    except OSError as exc:
        if isinstance(exc, NotADirectoryError) and os.path.isfile(root):
            raise FormatError(
                f"{shown_path(root)}: a file, not a dataset directory; expected a directory holding "
                f"{INDEX_JSON}, or that {INDEX_JSON}"
            ) from None
        raise ReadError(f"{shown_path(json_path)}: cannot be read ({exc})") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON or UTF-8, an int of 4300+ digits, deep nesting
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise FormatError(f"{shown_path(json_path)}: not a valid index file ({reason})") from None
    if not isinstance(header, dict) or header.get("format") != "shardio-index":
        raise FormatError(f"{shown_path(json_path)}: not a shardio index (no 'format: shardio-index')")
    return header


def check_version(header: dict[str, Any], json_path: str) -> int:
    """The header's format version: one this shardio reads, with ``meta_bytes`` exactly
    where it has metadata."""
    version = header.get("version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise FormatError(
            f"{shown_path(json_path)}: index format version {version!r}; this shardio reads versions "
            f"{', '.join(map(str, READ_VERSIONS))}: rebuild it with 'shardio index'"
        )
    if (version == METADATA_VERSION) != ("meta_bytes" in header):
        raise FormatError(
            f"{shown_path(json_path)}: a version-{version} index "
            f"{'must have' if version == METADATA_VERSION else 'cannot have'} 'meta_bytes' "
            "(per-sample metadata is format 3)"
        )
    return int(version)


def columns_file_of(header: dict[str, Any], version: int, json_path: str) -> str:
    """The columns file's name: a plain name in the root, the one this version's index writes."""
    expected = INDEX_COLUMNS_V1 if version == 1 else INDEX_COLUMNS
    columns_file = indexchecks.check_columns_file(header.get("columns_file", expected), json_path)
    if columns_file != expected:
        raise FormatError(
            f"{shown_path(json_path)}: 'columns_file' is {columns_file!r}; a version-{version} "
            f"index's is {expected!r}"
        )
    return columns_file


def check_fingerprint(header: Mapping[str, Any], json_path: str) -> str:
    """The fingerprint ``index.json`` states, once checked against what it fingerprints: the digest of the
    header as written (without the fingerprint), or, for an index upgraded from format 1, of the header its
    :data:`UPGRADED_FROM` entry restores (only :data:`UPGRADE_FIELDS`). The header records the columns' digest
    (the columns are hashed against it at load) and every shard's size and SHA-256, so a fingerprint that
    checks names this content. O(size of ``index.json``), already parsed.

    Raises:
        FormatError: a fingerprint that is not its header's: copied from another dataset's index, or edited.
    """
    stated = header.get("fingerprint")
    body = {key: value for key, value in header.items() if key not in ("fingerprint", UPGRADED_FROM)}
    before = header.get(UPGRADED_FROM)
    if isinstance(before, Mapping) and set(before) <= set(UPGRADE_FIELDS):
        for key, value in before.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
    elif before is not None:
        raise FormatError(
            f"{shown_path(json_path)}: {UPGRADED_FROM!r} may only record the fields an upgrade changes "
            f"({', '.join(UPGRADE_FIELDS)})"
        )
    found = digest(body)
    if stated != found:
        raise FormatError(
            f"{shown_path(json_path)}: its fingerprint {str(stated)[:40]!r} is not the digest of its header "
            f"({found}): "
            "copied from another dataset's index.json, or the header was edited, so a state saved on another "
            "dataset would resume on this one. Rebuild the index from its shards ('shardio index'; an index "
            "upgraded from format 1 by an older shardio too): it gets its own fingerprint"
        )
    return found
