"""The index's columns file (format 2): every column and the keys in one file, mapped read-only.

Layout: a 64-byte header (``MAGIC``, then the SHA-256 of everything after the header), then one section
per column of :data:`~shardio.shards.index.COLUMNS` in that order, then the keys' end offsets (``uint64``) and
the keys' UTF-8 blob, and, only in an index with per-sample metadata (``meta_bytes`` in ``index.json``),
the metadata's end offsets and JSON blob (:mod:`shardio.shards.metadata`). Every section is little-endian,
uncompressed and starts at a multiple of :data:`ALIGN` bytes, so its place follows from the sample count and
the blob's size alone (both in ``index.json``) and each column is a ``numpy`` view of one shared memory map:
the page cache holds one copy however many processes on the node read it, and a process's private
memory does not grow with it.

Integrity, in two strengths. Every time the file is mapped (every process, every worker) its size must be
the one the layout gives and its header must carry the digest ``index.json`` records: a columns file of
another index, or a truncated one, is refused with :class:`FormatError` for the cost of one 64-byte read.
:meth:`ColumnsFile.verify` hashes the whole content against that digest; :meth:`Index.load
<shardio.shards.index.Index.load>` does it in the process that loads the index, never in DataLoader workers
(which receive the mapped file by reference, see :meth:`ColumnsFile.__reduce__`), and once per file per node:
a file that matched leaves a marker in the node cache naming its device, inode, size and times (only when its
last change is a few seconds old, so that any later change shows in its times), and the same file is not
hashed again (markers: :mod:`shardio.shards.indexcache`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import FormatError, ReadError, shown_path
from ..storage.files import is_url
from ..storage.nodecache import fetch_to_cache
from . import indexcache
from .indexnpz import read_format1
from .keys import Keys
from .metadata import Metadata, check_size

__all__ = [
    "ALIGN",
    "MAGIC",
    "ColumnsFile",
    "Unreadable",
    "columns_bytes",
    "encode",
    "layout",
    "map_columns",
    "read_format1",
]

MAGIC = b"SHARDIO-COLUMNS2"
HEADER = 64
ALIGN = 4096  # mmap's granularity: the key blob gets a map of its own, which `find` searches in C
_KEY_ENDS, _KEY_BLOB = "keys_end", "keys_blob"
_META_ENDS, _META_BLOB = "meta_end", "meta_blob"


def _up(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def layout(
    columns: Mapping[str, Any], samples: int, key_bytes: int, meta_bytes: int | None = None
) -> dict[str, tuple[np.dtype, int, int]]:
    """``{section: (little-endian dtype, byte offset, count)}`` for ``samples`` samples whose keys take
    ``key_bytes`` (and metadata ``meta_bytes``; None: the index has none); ``columns`` maps column names to
    dtypes, in file order. The last section ends the file."""
    sections: dict[str, tuple[np.dtype, int, int]] = {}
    offset = HEADER
    types = [*((name, np.dtype(dtype)) for name, dtype in columns.items()), (_KEY_ENDS, np.dtype(np.uint64))]
    for name, dtype in types:
        offset = _up(offset)
        sections[name] = (dtype.newbyteorder("<"), offset, samples)
        offset += dtype.itemsize * samples
    sections[_KEY_BLOB] = (np.dtype(np.uint8), _up(offset), key_bytes)
    if meta_bytes is not None:
        offset = _up(_up(offset) + key_bytes)
        sections[_META_ENDS] = (np.dtype(np.uint64).newbyteorder("<"), offset, samples)
        sections[_META_BLOB] = (np.dtype(np.uint8), _up(offset + 8 * samples), meta_bytes)
    return sections


def columns_bytes(
    columns: Mapping[str, Any], samples: int, key_bytes: int, meta_bytes: int | None = None
) -> int:
    """The size of a columns file for ``samples`` samples, ``key_bytes`` of keys and ``meta_bytes`` of
    metadata (None: none)."""
    _, offset, count = list(layout(columns, samples, key_bytes, meta_bytes).values())[-1]
    return offset + count


def encode(
    columns: Mapping[str, np.ndarray], dtypes: Mapping[str, Any], keys: Keys, meta: Metadata | None = None
) -> tuple[bytes, str]:
    """The columns file for ``columns``, ``keys`` and ``meta``, and its digest (the
    SHA-256 after the header)."""
    samples = len(keys)
    meta_bytes = None if meta is None else len(meta.blob)
    sections = layout(dtypes, samples, len(keys.blob), meta_bytes)
    body = bytearray(columns_bytes(dtypes, samples, len(keys.blob), meta_bytes) - HEADER)
    arrays = {**columns, _KEY_ENDS: keys.ends, **({} if meta is None else {_META_ENDS: meta.ends})}
    blobs = {_KEY_BLOB: keys.blob, **({} if meta is None else {_META_BLOB: meta.blob})}
    for name, (dtype, offset, _count) in sections.items():
        data = (
            bytes(blobs[name]) if name in blobs else np.ascontiguousarray(arrays[name], dtype=dtype).tobytes()
        )
        body[offset - HEADER : offset - HEADER + len(data)] = data
    digest = hashlib.sha256(body).hexdigest()
    header = MAGIC + bytes.fromhex(digest)
    return header + bytes(HEADER - len(header)) + bytes(body), digest


class Unreadable:
    """What an index's columns, keys and metadata are in a process that unpickled it when its columns file no
    longer passed the checks (replaced between epochs, say): each use raises ``error``. Unpickling itself
    must not raise: a spawned DataLoader worker that fails there dies before it can report anything but
    "exited unexpectedly", while an error raised as it reads reaches the training process, message and all."""

    def __init__(self, error: FormatError | ReadError) -> None:
        self.error = error

    def _raise(self, *args: object) -> Any:
        raise type(self.error)(str(self.error))

    __getitem__ = __len__ = __iter__ = __contains__ = columns = keys = metadata = _raise

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._raise()


def _reopened(*args: Any) -> ColumnsFile | Unreadable:
    """A pickled :class:`ColumnsFile` mapped again, or, when it fails its checks now,
    an :class:`Unreadable`."""
    try:
        return ColumnsFile(*args)
    except (FormatError, ReadError) as exc:
        return Unreadable(exc)


class ColumnsFile:
    """A columns file mapped read-only: ``path`` must hold ``size`` bytes and carry ``digest``.

    Pickles as its path, size and digest (not its content): the receiving process maps the file again and
    repeats the cheap checks.
    """

    def __init__(
        self,
        path: str,
        dtypes: Mapping[str, Any],
        samples: int,
        key_bytes: int,
        digest: str,
        where: str | None = None,
        meta_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.dtypes = dict(dtypes)
        self.samples = samples
        self.key_bytes = key_bytes
        self.meta_bytes = meta_bytes
        self.digest = digest
        self.where = where or path
        self.size = columns_bytes(self.dtypes, samples, key_bytes, meta_bytes)
        self._map, self._blob = self._open()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reopened, (
            self.path,
            self.dtypes,
            self.samples,
            self.key_bytes,
            self.digest,
            self.where,
            self.meta_bytes,
        )

    def _open(self) -> tuple[Any, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO fails the size check: no block
        except FileNotFoundError:
            raise FormatError(f"{self.where}: the index columns file is missing") from None
        except OSError as exc:
            raise ReadError(f"{self.where}: cannot be read ({exc})") from None
        try:
            actual = os.fstat(fd).st_size
            if actual != self.size:
                raise FormatError(
                    f"{self.where}: {actual} bytes, but index.json describes {self.samples} samples "
                    f"and {self.key_bytes} bytes of keys ({self.size} bytes): the index files do "
                    "not belong together or one is damaged; rebuild the index"
                )
            header = os.pread(fd, HEADER, 0)
            if header[: len(MAGIC)] != MAGIC or header[len(MAGIC) : len(MAGIC) + 32].hex() != self.digest:
                raise FormatError(
                    f"{self.where}: its header does not carry the digest index.json records "
                    f"({self.digest[:16]}...): the index files do not belong together or one is "
                    "damaged; rebuild the index"
                )
            _, blob_offset, blob_size = self._layout()[_KEY_BLOB]
            try:
                whole: Any = mmap.mmap(fd, self.size, prot=mmap.PROT_READ)
                blob: Any = (
                    mmap.mmap(fd, blob_size, prot=mmap.PROT_READ, offset=blob_offset) if blob_size else b""
                )
            except (OSError, ValueError):  # a file system that cannot map files: read it into this process
                whole = _read_all(fd, self.size, self.where)
                blob = whole[blob_offset : blob_offset + blob_size]
        finally:
            os.close(fd)
        return whole, blob

    def _layout(self) -> dict[str, tuple[np.dtype, int, int]]:
        return layout(self.dtypes, self.samples, self.key_bytes, self.meta_bytes)

    def columns(self) -> dict[str, np.ndarray]:
        """Every column: a read-only view of the map."""
        sections = self._layout()
        return {
            name: np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).view(
                np.dtype(self.dtypes[name])
            )
            for name, (dtype, offset, count) in sections.items()
            if name in self.dtypes
        }

    def keys(self) -> Keys:
        """The keys, decoded on demand from the mapped blob."""
        dtype, offset, count = self._layout()[_KEY_ENDS]
        ends = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).view(np.uint64)
        return Keys(self._blob, ends, self.where)

    def metadata(self) -> Metadata | None:
        """The per-sample metadata, decoded on demand from the map (None when the index has none)."""
        if self.meta_bytes is None:
            return None
        sections = self._layout()
        dtype, offset, count = sections[_META_ENDS]
        ends = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).view(np.uint64)
        _, blob_offset, blob_size = sections[_META_BLOB]
        return Metadata(memoryview(self._map)[blob_offset : blob_offset + blob_size], ends, self.where)

    def verify(self) -> None:
        """Hash the whole content against the digest (:class:`FormatError` when a byte differs)."""
        digest = hashlib.sha256(memoryview(self._map)[HEADER:]).hexdigest()
        if digest != self.digest:
            raise FormatError(
                f"{self.where}: SHA-256 {digest}, but index.json records {self.digest}: the index "
                "files do not belong together or one is damaged; rebuild the index"
            )


def _read_all(fd: int, size: int, where: str) -> bytes:
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 26), offset)
        if not chunk:
            raise FormatError(
                f"{shown_path(where)}: the file shrank while it was read ({offset} of {size} bytes)"
            )
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _count(header: dict[str, Any], name: str, json_path: str) -> int:
    value = header.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FormatError(f"{shown_path(json_path)}: {name!r} must be a non-negative integer, not {value!r}")
    return value


def map_columns(
    columns_path: str,
    header: dict[str, Any],
    dtypes: Mapping[str, Any],
    json_path: str,
    storage_options: dict[str, Any] | None,
) -> ColumnsFile:
    """The format-2 columns file mapped (fetched into the node's cache first when remote) and hashed."""
    samples, key_bytes = _count(header, "samples", json_path), _count(header, "keys_bytes", json_path)
    meta_bytes = None if "meta_bytes" not in header else check_size(samples, header["meta_bytes"], json_path)
    digest = header.get("columns_sha256")
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise FormatError(
            f"{shown_path(json_path)}: 'columns_sha256' must be a SHA-256 in hex, not {digest!r}"
        )
    size = columns_bytes(dtypes, samples, key_bytes, meta_bytes)
    local = columns_path
    if is_url(columns_path):
        try:
            local = fetch_to_cache(
                columns_path,
                f"index-{digest}.columns",
                size,
                storage_options,
                lambda path: _fits(path, digest),
            )
        except FileNotFoundError:
            raise FormatError(f"{shown_path(columns_path)}: index columns file is missing") from None
    mapped = ColumnsFile(local, dtypes, samples, key_bytes, digest, where=columns_path, meta_bytes=meta_bytes)
    if local != columns_path:
        indexcache.touch(local)
    marker = indexcache.verified_marker(local, digest)
    if marker is None or not os.path.exists(marker):
        mapped.verify()
        indexcache.mark_verified(marker)
    else:
        indexcache.touch(marker)
    return mapped


def _fits(path: str, digest: str) -> bool:
    """Whether the cached file at ``path`` carries ``digest`` in its header (its size is
    checked by the cache)."""
    with open(path, "rb") as handle:
        head = handle.read(len(MAGIC) + 32)
    return head == MAGIC + bytes.fromhex(digest)
