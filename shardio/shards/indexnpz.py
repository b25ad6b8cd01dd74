"""The index's format-1 columns file, ``index.npz``: read whole (with a size bound), hashed, and its arrays'
shapes checked before numpy allocates them; ``shardio index --upgrade`` rewrites it as format 2
(:mod:`shardio.shards.indexfile`)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError, shown_path
from . import indexchecks
from .indexchecks import shown_name
from .keys import Keys

__all__ = ["check_npz", "read_format1"]


def read_format1(
    payload: bytes, columns_path: str, digest: Any, dtypes: Mapping[str, Any], samples: int
) -> tuple[dict[str, np.ndarray], Keys]:
    """A format-1 ``index.npz``'s columns and keys from its bytes (read with a size bound by the caller),
    hashed against ``digest`` and its arrays' shapes checked against their bytes and the ``samples`` that
    ``index.json`` declares before numpy allocates them (``shardio index --upgrade`` turns it into a mapped
    format-2 file)."""
    limits = {f"{name}.npy": samples * np.dtype(dtype).itemsize for name, dtype in dtypes.items()}
    limits.update(
        {"keys_end.npy": 8 * samples, "keys_blob.npy": indexchecks.columns_size_bound(samples, columns_path)}
    )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise FormatError(
            f"{shown_path(columns_path)}: SHA-256 {hashlib.sha256(payload).hexdigest()}, but index.json "
            f"records {digest!r}: the index files do not belong together "
            "or one is damaged; rebuild the index"
        )
    try:
        archive = np.load(io.BytesIO(payload))
        check_npz(archive.zip, columns_path, limits, f"that index.json's {samples} samples allow")
        columns = {name: archive[name] for name in dtypes}
        keys = Keys(archive["keys_blob"].tobytes(), archive["keys_end"].astype(np.uint64), columns_path)
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy and zipfile raise many types for a damaged archive
        raise FormatError(
            f"{shown_path(columns_path)}: unreadable index columns ({type(exc).__name__}: {exc})"
        ) from None
    return columns, keys


def check_npz(
    archive: zipfile.ZipFile, where: str, limits: Mapping[str, int] | None = None, basis: str = ""
) -> None:
    """Every ``.npy`` member of a columns file holds as many bytes as its header's shape claims, and a member
    named in ``limits`` claims at most that many bytes (what ``basis``, such as the header's sample count,
    allows), so that numpy, which allocates the claimed array before reading, allocates no more than the file
    holds and the index justifies. Only each member's first 64 KiB are decompressed here: a deflated member
    may declare any size."""
    limits = limits or {}
    for info in archive.infolist():
        try:
            with archive.open(info) as member:
                handle = io.BytesIO(member.read(1 << 16))  # an .npy header is at most a few KiB
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(handle)
            header = handle.tell()
        except Exception as exc:  # noqa: BLE001 - zipfile and numpy raise many types for a damaged archive
            raise FormatError(
                f"{shown_path(where)}: member {shown_name(info.filename)} is not a numpy array "
                f"({type(exc).__name__})"
            ) from None
        claimed = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize if shape else 0
        if dtype.hasobject or claimed > info.file_size - header:
            raise FormatError(
                f"{shown_path(where)}: member {shown_name(info.filename)} claims an array of "
                f"shape {shape} and "
                f"type {dtype} ({claimed} bytes) in {info.file_size - header} bytes"
            )
        limit = limits.get(info.filename)
        if limit is not None and claimed > limit:
            raise FormatError(
                f"{shown_path(where)}: member {shown_name(info.filename)} claims an array of "
                f"shape {shape} and "
                f"type {dtype} ({claimed} bytes), more than the {limit} bytes {basis}"
            )
