"""The dataset index: one per dataset, columnar, versioned and fingerprinted.

On disk a dataset directory holds its shards plus two index files, written last and atomically:

- ``index.json``: the format version, the shard table (name, bytes, sha256, samples, duration, codec),
  the audio format names, the size of the keys, the columns file's digest and the fingerprint (checked);
- ``index.columns`` (format 2): every column (:mod:`shardio.shards.columns`) and the keys (a UTF-8 blob plus
  end offsets; with per-sample metadata, :mod:`shardio.shards.metadata`, its JSON blob plus end offsets too),
  uncompressed and aligned, mapped read-only by every process that reads it (:mod:`shardio.shards.indexfile`):
  the page cache holds one copy per node, and keys decode one at a time. Format 1 kept them in ``index.npz``
  (still read; ``shardio index --upgrade`` rewrites it as format 2). A remote index's columns file is fetched
  once per node into the local cache and mapped from there.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError, shown_path
from ..storage.files import is_url, joiner, write_atomic
from . import indexchecks, indexfile, indexheader
from .columns import COLUMNS, STREAM_CODECS
from .indexfile import ColumnsFile
from .indexheader import INDEX_COLUMNS, INDEX_COLUMNS_V1, INDEX_JSON
from .indexload import check_loaded, read_index
from .keys import Keys
from .metadata import Metadata
from .shardtable import CODECS, ShardInfo, ShardTable

__all__ = ["CODECS", "COLUMNS", "INDEX_COLUMNS_V1", "STREAM_CODECS", "Index", "ShardInfo", "ShardTable"]


@dataclass
class Index:
    """A dataset's index: the shard table and the per-sample columns and keys (mapped read-only from the
    columns file when loaded from disk, so every process on a node shares one copy).

    Args:
        root: The dataset's directory or URL (shard names are relative to it).
        shards: The shard table: any sequence of `ShardInfo`, kept as a few arrays (not an object a shard).
        formats: The audio extensions the `format` column numbers.
        columns: Per-sample arrays (`shard`, offsets, sizes, `num_frames`, `sample_rate`, ...).
        fingerprint: What a saved state records to name the dataset.
        columns_sha256: The digest of the columns file.
        storage_options: fsspec options (endpoint, credentials) for a remote `root`; shards open with them.
        loaded_ns: When it was loaded (`time.time_ns()`, or its `index.json`'s later ctime): a local shard
            whose status changed after then was replaced under the run (`ShardChanged`).
    """

    root: str
    shards: Sequence[ShardInfo]
    formats: list[str]
    columns: dict[str, np.ndarray]
    fingerprint: str = ""
    columns_sha256: str = ""
    _keys: Keys | None = field(default=None, repr=False)
    storage_options: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _file: ColumnsFile | None = field(default=None, repr=False, compare=False)  # mapped (None: in memory)
    _meta: Metadata | None = field(default=None, repr=False, compare=False)  # None: in ``{key}.json`` members
    _digested: bool = field(default=False, repr=False, compare=False)  # see :attr:`fingerprinted`
    _content_id: str = field(default="", repr=False, compare=False)
    loaded_ns: int = field(default_factory=time.time_ns, repr=False, compare=False)
    _join: Callable[[str], str] = field(init=False, repr=False, compare=False)  # a name's path or URL
    remote: bool = field(init=False, repr=False, compare=False)
    """Whether any shard is a remote object (HTTP, S3, fsspec), not a local file: the root is a URL."""

    def __post_init__(self) -> None:
        self._join, self.remote = joiner(self.root), is_url(self.root)
        try:
            self.shards = ShardTable.of(self.shards, self.root or "index")
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{self.root or 'index'}: a malformed shard entry ({exc})") from None
        if self._keys is not None and not isinstance(self._keys, Keys):  # keys given as a list of strings
            self._keys = Keys.of(self._keys)

    def __len__(self) -> int:
        return int(self.columns["shard"].shape[0])

    @property
    def table(self) -> ShardTable:
        """The shard table, with its column accessors (``index.shards`` is the same table, as a sequence)."""
        if not isinstance(self.shards, ShardTable):  # a list assigned after construction
            self.shards = ShardTable.of(self.shards, self.root or "index")
        return self.shards

    def share_tables(self, convert: Callable[[ShardTable], ShardTable]) -> None:
        """Replace the shard table by `convert(table)`, in place (a dataset pickled for workers shares it).

        Args:
            convert: Makes the new table from the current one.
        """
        self.shards = convert(self.table)

    @property
    def fingerprinted(self) -> bool:
        """Whether :attr:`fingerprint` digests this content (loaded or saved): only then are plans shared."""
        return self._digested

    @property
    def content_id(self) -> str:
        """A digest of what this index holds: its header as shardio writes it, which records the digest of its
        columns (checked when they are loaded) and every shard's size and hash. Unlike :attr:`fingerprint`,
        which ``index.json`` states (and an upgraded index keeps), it cannot be copied from another dataset,
        so data derived from an index and shared between processes (the node's plan files) is keyed by it."""
        if not self._content_id:
            self._content_id = indexheader.digest(self._header())
        return self._content_id

    @property
    def durations(self) -> np.ndarray:
        """Seconds per sample (float64), derived from frames and sample rate: computed on each use (8 bytes a
        sample), not kept, so that a process's private memory does not grow with the corpus."""
        return self.durations_of(slice(None))

    def durations_of(self, ids: np.ndarray | slice) -> np.ndarray:
        """Seconds of some samples (float64), derived for those samples only.

        Args:
            ids: Sample numbers (an array or a slice).
        """
        rate = np.maximum(self.columns["sample_rate"][ids], 1).astype(np.float64)
        return self.columns["num_frames"][ids].astype(np.float64) / rate

    @property
    def shard_ids(self) -> np.ndarray:
        """The shard number of every sample."""
        return self.columns["shard"]

    @property
    def total_duration(self) -> float:
        """Seconds of audio in the whole dataset."""
        return float(self.durations.sum())

    @property
    def keys(self) -> Keys:
        """Every sample's key, in index order: a read-only sequence that decodes each key when asked."""
        if self._keys is None:
            raise FormatError(f"{self.root}: this index has no keys")
        return self._keys

    def key(self, sample: int) -> str:
        """A sample's key.

        Args:
            sample: The sample's number.
        """
        return self.keys.key(sample)

    @property
    def has_metadata(self) -> bool:
        """Whether the index keeps per-sample metadata (an index made in place for a NeMo tarred dataset)."""
        return self._meta is not None

    def metadata(self, sample: int) -> dict[str, Any]:
        """The metadata fields the index keeps for a sample (empty when it keeps none).

        Args:
            sample: The sample's number.
        """
        return {} if self._meta is None else self._meta.fields(sample)

    def member_key(self, sample: int) -> str:
        """The key of the tar members a sample reads: its own key, or, for a sample that reads another's
        members (a NeMo `-sub` repeat), that one's (only an index with metadata has such).

        Args:
            sample: The sample's number.
        """
        alias = None if self._meta is None else self._meta.member_key(sample)
        return self.key(sample) if alias is None else alias

    def lookup(self, key: str) -> int:
        """The number of the first sample with a key, without a table of every key.

        Args:
            key: The sample's key.

        Raises:
            KeyError: No sample has the key.
        """
        found = self.keys.find(key)
        if found is None:
            raise KeyError(key)
        return found

    def is_remote(self, shard: int) -> bool:
        """Whether a shard is a remote object rather than a local file.

        Args:
            shard: The shard's number.

        Returns:
            Whether :meth:`shard_path` gives a URL.
        """
        return self.remote

    def shard_path(self, shard: int) -> str:
        """A shard's local path or URL.

        Args:
            shard: The shard's number.

        Returns:
            What `storage.files.join` makes of the root and the shard's name.
        """
        return self._join(self.table.name(shard))

    def shard_options(self, shard: int) -> dict[str, Any] | None:
        """The fsspec options to open a shard with (the index's `storage_options`).

        Args:
            shard: The shard's number.
        """
        return self.storage_options

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self._file is not None:  # the mapped file travels by reference: nothing of size N is pickled
            state.update(columns=None, _keys=None, _meta=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if isinstance(self._file, indexfile.Unreadable):  # raised at first use (see Unreadable)
            self.columns = self._keys = self._meta = self._file
        elif self._file is not None:
            self.columns, self._keys, self._meta = (
                self._file.columns(),
                self._file.keys(),
                self._file.metadata(),
            )

    # -- persistence -----------------------------------------------------------------------------

    def save(self, directory: str | None = None, *, keep_fingerprint: bool = False) -> None:
        """Write `index.columns` then `index.json` (each atomically): the JSON last marks completion.

        Args:
            directory: Where to write (default: `root`).
            keep_fingerprint: Keep the fingerprint (an upgrade's: `upgrade_index` records what checks it).
        """
        directory = directory or self.root
        payload, self.columns_sha256 = indexfile.encode(self.columns, COLUMNS, self.keys, self._meta)
        header = self._header()  # O(samples + shards): made once
        if not (keep_fingerprint and self.fingerprint):
            self.fingerprint, self._digested = indexheader.digest(header), True
        self._content_id = ""
        write_atomic(os.path.join(directory, INDEX_COLUMNS), payload)
        header["fingerprint"] = self.fingerprint
        write_atomic(os.path.join(directory, INDEX_JSON), json.dumps(header, indent=1).encode())

    def _header(self) -> dict[str, Any]:
        return indexheader.make_header(
            samples=len(self),
            duration=self.total_duration,
            formats=self.formats,
            columns=COLUMNS,
            columns_sha256=self.columns_sha256,
            keys_bytes=len(self.keys.blob),
            shards=self.table.entries(),
            meta_bytes=None if self._meta is None else len(self._meta.blob),
        )

    @classmethod
    def load(
        cls,
        location: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        allow_outside_root: bool = False,
    ) -> Index:
        """Load a dataset's index. The columns file must carry the digest `index.json` records, and its
        content is hashed against it here, once (DataLoader workers receive the mapped file and check only its
        size and header). A remote columns file is fetched into the node's cache once and mapped from there.

        Args:
            location: The dataset's directory or URL, or its `index.json`.
            storage_options: fsspec options (endpoint, credentials, ...) for a URL; they stay with the index
                for reading its shards. Remote reads are retried.
            allow_outside_root: Also take shard names with `..` parts, absolute paths and symlinks that leave
                the root (default: plain relative paths only): only for a trusted dataset whose shards really
                live elsewhere (`shardio index --out` to another directory writes such names).

        Raises:
            OptionError: A location or options of the wrong type.
            FormatError: An index that is not a shardio index, or is damaged.
            ReadError: An index that cannot be read.
        """
        parts = read_index(location, storage_options, COLUMNS)
        try:
            index = cls(
                root=parts.root,
                shards=parts.shards,
                formats=[str(f) for f in parts.header["formats"]],
                columns=parts.columns,
                fingerprint=str(parts.header["fingerprint"]),
                columns_sha256=str(parts.header["columns_sha256"]),
                _keys=parts.keys,
                storage_options=storage_options,
                _file=parts.mapped,
                _meta=parts.meta,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"{shown_path(parts.json_path)}: index header has a missing or malformed field ({exc})"
            ) from None
        check_loaded(index, parts, allow_outside_root)
        index._digested = True
        if not is_url(parts.json_path):  # a file server's clock ahead of ours: shards predate index.json
            index.loaded_ns = max(index.loaded_ns, os.stat(parts.json_path).st_ctime_ns)
        return index

    def validate(self, where: str) -> None:
        """Cheap structural checks, so a damaged index fails here rather than mid-epoch (columns, shard and
        format numbers, codecs and per-shard counts).

        Args:
            where: What messages name as the index (its file).

        Raises:
            FormatError: A damaged index.
        """
        indexchecks.check_structure(self.columns, COLUMNS, self.formats, self.table, where)
