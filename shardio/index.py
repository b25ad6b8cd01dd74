"""The dataset index: one per dataset, columnar, versioned and fingerprinted.

On disk a dataset directory holds its shards plus two index files, written last and atomically:

- ``index.json``: the format version, the shard table (name, bytes, sha256, samples, duration, codec),
  the audio format names, the SHA-256 of the columns file and the index fingerprint;
- ``index.npz``: one uncompressed numpy array per column (34 bytes a sample) and the keys, stored as one
  UTF-8 blob plus end offsets so that they load only when asked for.

Per sample the columns say where its tar bytes are: ``frame_offset``/``frame_size`` locate the bytes to
read from the shard file (a zstd frame, or the sample's own tar bytes in a plain ``.tar``), and
``member_offset``/``member_size`` locate the sample's members inside those bytes once decompressed.
Shards with a stream codec (``gzip``, ``bz2``, ``zstd-stream``: shards from other tools that cannot be
seeked) use ``frame_offset`` as the offset in the decompressed tar and are read as a whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from . import indexchecks
from .errors import FormatError, OptionError, ReadError
from .storage import is_url, join, read_bytes, write_atomic

__all__ = ["FORMAT_VERSION", "INDEX_JSON", "INDEX_COLUMNS", "COLUMNS", "CODECS", "ShardInfo", "Index",
           "IndexBuilder"]

FORMAT_VERSION = 1
INDEX_JSON = "index.json"
INDEX_COLUMNS = "index.npz"
COLUMNS: dict[str, type] = {
    "shard": np.uint32,
    "frame_offset": np.uint64,
    "frame_size": np.uint32,
    "member_offset": np.uint32,
    "member_size": np.uint32,
    "num_frames": np.uint32,
    "sample_rate": np.uint32,
    "channels": np.uint8,
    "format": np.uint8,
}
T = TypeVar("T")
CODECS = ("none", "zstd", "zstd-stream", "gzip", "bz2")
STREAM_CODECS = frozenset({"zstd-stream", "gzip", "bz2"})


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index records it."""

    name: str
    bytes: int
    sha256: str
    samples: int
    duration: float
    codec: str = "none"


@dataclass
class Index:
    """A dataset's index: the shard table and the per-sample columns, plus lazily loaded keys."""

    root: str
    shards: list[ShardInfo]
    formats: list[str]
    columns: dict[str, np.ndarray]
    fingerprint: str = ""
    columns_sha256: str = ""
    _keys: list[str] | None = field(default=None, repr=False)
    storage_options: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    """fsspec options (endpoint, credentials) for a remote ``root``; the reader opens shards with them."""

    def __len__(self) -> int:
        return int(self.columns["shard"].shape[0])

    @cached_property
    def durations(self) -> np.ndarray:
        """Seconds per sample (float64), derived from frames and sample rate."""
        rate = np.maximum(self.columns["sample_rate"], 1).astype(np.float64)
        return self.columns["num_frames"].astype(np.float64) / rate

    @property
    def shard_ids(self) -> np.ndarray:
        """The shard number of every sample."""
        return self.columns["shard"]

    @property
    def total_duration(self) -> float:
        """Seconds of audio in the whole dataset."""
        return float(self.durations.sum())

    @property
    def keys(self) -> list[str]:
        """Every sample's key, in index order (loaded on first use)."""
        if self._keys is None:
            path = join(self.root, INDEX_COLUMNS)
            samples = sum(shard.samples for shard in self.shards)  # a mix's parts keep no columns
            payload = indexchecks.read_columns(self.root, path, indexchecks.columns_size_bound(samples, path),
                                               self.storage_options)
            if self.columns_sha256 and hashlib.sha256(payload).hexdigest() != self.columns_sha256:
                raise FormatError(f"{path}: changed since the index was loaded (its SHA-256 differs)")
            keys = _unpack(payload, path, _load_keys)
            if len(keys) != samples:
                raise FormatError(f"{path}: {len(keys)} keys for {samples} samples")
            self._keys = keys
        return self._keys

    def shard_path(self, shard: int) -> str:
        """The local path or URL of shard number ``shard``."""
        return join(self.root, self.shards[shard].name)

    def shard_options(self, shard: int) -> dict[str, Any] | None:
        """The fsspec options to open shard number ``shard`` with (the index's ``storage_options``)."""
        return self.storage_options

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("durations", None)
        return state

    # -- persistence -----------------------------------------------------------------------------

    def save(self, directory: str | None = None) -> None:
        """Write ``index.npz`` then ``index.json`` (each atomically): the JSON last marks completion."""
        directory = directory or self.root
        blob, ends = _encode_keys(self.keys)
        payload = _npz_bytes({**self.columns, "keys_blob": blob, "keys_end": ends})
        self.columns_sha256 = hashlib.sha256(payload).hexdigest()
        self.fingerprint = self._compute_fingerprint()
        write_atomic(os.path.join(directory, INDEX_COLUMNS), payload)
        write_atomic(os.path.join(directory, INDEX_JSON), self._header_json().encode())

    def _header(self) -> dict[str, Any]:
        return {
            "format": "shardio-index",
            "version": FORMAT_VERSION,
            "samples": len(self),
            "duration": round(self.total_duration, 3),
            "formats": self.formats,
            "columns": {name: np.dtype(dtype).str for name, dtype in COLUMNS.items()},
            "columns_file": INDEX_COLUMNS,
            "columns_sha256": self.columns_sha256,
            "shards": [asdict(s) for s in self.shards],
        }

    def _compute_fingerprint(self) -> str:
        canonical = json.dumps(self._header(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def _header_json(self) -> str:
        return json.dumps({**self._header(), "fingerprint": self.fingerprint}, indent=1)

    @classmethod
    def load(cls, location: str | os.PathLike[str], storage_options: dict[str, Any] | None = None, *,
             allow_outside_root: bool = False) -> Index:
        """Load the index of the dataset at ``location`` (a directory, URL, or its ``index.json``).

        ``storage_options`` (endpoint, credentials, ...) go to fsspec for a URL, and stay with the index for
        reading its shards. Remote reads are retried (see :mod:`shardio.storage`); the columns file must
        match the SHA-256 that ``index.json`` records. A remote index's keys are kept from this one read.

        Shard names must be plain relative paths under the dataset root (see :mod:`shardio.indexchecks`);
        ``allow_outside_root=True`` also takes ``..`` parts, absolute paths and symlinks that leave the root:
        only for a trusted dataset whose shards really live elsewhere (``shardio index --out`` to another
        directory writes such names).
        """
        location = os.fspath(location)
        root = location[: -len(INDEX_JSON) - 1] if location.endswith("/" + INDEX_JSON) else location
        json_path = join(root, INDEX_JSON)
        try:
            header = json.loads(read_bytes(json_path, storage_options))
        except FileNotFoundError:
            raise FormatError(f"{json_path}: no index here; run 'shardio pack' or 'shardio index' first") from None
        except OSError as exc:
            raise ReadError(f"{json_path}: cannot be read ({exc})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(f"{json_path}: not a valid index file ({exc})") from None
        if not isinstance(header, dict) or header.get("format") != "shardio-index":
            raise FormatError(f"{json_path}: not a shardio index (no 'format: shardio-index')")
        if header.get("version") != FORMAT_VERSION:
            raise FormatError(f"{json_path}: index format version {header.get('version')!r}; this shardio "
                              f"reads version {FORMAT_VERSION}: rebuild it with 'shardio index'")
        columns_file = indexchecks.check_columns_file(header.get("columns_file", INDEX_COLUMNS), json_path)
        if columns_file != INDEX_COLUMNS:  # the keys are read from it later, by that name
            raise FormatError(f"{json_path}: 'columns_file' is {columns_file!r}; this shardio reads "
                              f"{INDEX_COLUMNS!r}")
        columns_path = join(root, columns_file)
        bound = indexchecks.columns_size_bound(header.get("samples"), json_path)
        payload = indexchecks.read_columns(root, columns_path, bound, storage_options)
        if hashlib.sha256(payload).hexdigest() != header.get("columns_sha256"):
            raise FormatError(f"{columns_path}: SHA-256 {hashlib.sha256(payload).hexdigest()}, but {json_path} "
                              f"records {header.get('columns_sha256')!r}: the index files do not belong together "
                              "or one is damaged; rebuild the index")
        columns, keys = _unpack(payload, columns_path, lambda archive: (
            {name: archive[name] for name in COLUMNS}, _load_keys(archive) if is_url(root) else None))
        try:
            shards = [_shard_info(entry) for entry in header["shards"]]
            index = cls(root=root, shards=shards, formats=[str(f) for f in header["formats"]], columns=columns,
                        fingerprint=str(header["fingerprint"]), columns_sha256=str(header["columns_sha256"]),
                        _keys=keys, storage_options=storage_options)
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{json_path}: index header has a missing or malformed field ({exc})") from None
        index.validate(json_path)
        if header.get("samples") != len(index):
            raise FormatError(f"{json_path}: 'samples' is {header.get('samples')!r}, the columns hold "
                              f"{len(index)}")
        indexchecks.check_names(index.root, [s.name for s in index.shards], json_path, allow_outside_root)
        indexchecks.check_frames(index.columns, index.formats, [s.name for s in index.shards], json_path,
                                 lambda sample: index.keys[sample])
        if keys is not None and len(keys) != len(index):
            raise FormatError(f"{columns_path}: {len(keys)} keys for {len(index)} samples")
        return index

    def validate(self, where: str) -> None:
        """Cheap structural checks, so a damaged index fails here rather than mid-epoch."""
        n = len(self)
        for name, dtype in COLUMNS.items():
            column = self.columns[name]
            if column.dtype != np.dtype(dtype) or column.shape != (n,):
                raise FormatError(f"{where}: column {name!r} has dtype {column.dtype} and shape {column.shape}, "
                                  f"expected {np.dtype(dtype)} and ({n},)")
        if n and int(self.columns["shard"].max()) >= len(self.shards):
            raise FormatError(f"{where}: a sample names shard {int(self.columns['shard'].max())}, "
                              f"but the index lists {len(self.shards)} shards")
        if n and int(self.columns["format"].max()) >= len(self.formats):
            raise FormatError(f"{where}: a sample names an audio format the index does not list")
        counts = np.bincount(self.columns["shard"], minlength=len(self.shards))
        for number, shard in enumerate(self.shards):
            if shard.codec not in CODECS:
                raise FormatError(f"{where}: shard {shard.name} has unknown codec {shard.codec!r}")
            if counts[number] != shard.samples:
                raise FormatError(f"{where}: shard {shard.name} lists {shard.samples} samples, "
                                  f"the columns hold {counts[number]}")


def _unpack(payload: bytes, path: str, take: Callable[[Any], T]) -> T:
    """``take(archive)`` of the columns file ``payload``, its arrays' claimed shapes checked against their
    bytes first; any failure of a damaged archive is a :class:`FormatError`."""
    try:
        archive = np.load(io.BytesIO(payload))
        indexchecks.check_npz(archive.zip, path)
        return take(archive)
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy and zipfile raise many types for a damaged archive
        raise FormatError(f"{path}: unreadable index columns ({type(exc).__name__}: {exc})") from None


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` with fixed timestamps, so the same index gives the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(member, "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _encode_keys(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [k.encode("utf-8") for k in keys]
    ends = np.cumsum([len(e) for e in encoded], dtype=np.uint64) if encoded else np.zeros(0, np.uint64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends


def _load_keys(archive: Any) -> list[str]:
    blob = archive["keys_blob"].tobytes()
    ends = archive["keys_end"].tolist()
    starts = [0, *ends[:-1]]
    return [blob[s:e].decode("utf-8") for s, e in zip(starts, ends)]


def _shard_info(entry: Any) -> ShardInfo:
    """A shard table entry of ``index.json``, with its field types checked (TypeError/ValueError otherwise)."""
    if not isinstance(entry, dict):
        raise TypeError(f"a shard entry must be an object, not {entry!r}")
    info = ShardInfo(**entry)
    if not isinstance(info.name, str) or not info.name:
        raise TypeError(f"shard name {info.name!r} is not a file name")
    for name in ("bytes", "samples"):
        value = getattr(info, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"shard {info.name}: {name} must be a non-negative integer, not {value!r}")
    if not isinstance(info.codec, str):
        raise TypeError(f"shard {info.name}: codec must be a string, not {info.codec!r}")
    return info


class IndexBuilder:
    """Accumulates shards and samples in write order, then makes an :class:`Index`."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.shards: list[ShardInfo] = []
        self.formats: list[str] = []
        self._rows: dict[str, list[int]] = {name: [] for name in COLUMNS}
        self._keys: list[str] = []

    def format_id(self, ext: str) -> int:
        """The number of audio format ``ext`` in this index's format table."""
        if ext not in self.formats:
            if len(self.formats) >= 255:
                raise OptionError("more than 255 distinct audio formats in one dataset")
            self.formats.append(ext)
        return self.formats.index(ext)

    def add_sample(self, key: str, *, shard: int, frame_offset: int, frame_size: int, member_offset: int,
                   member_size: int, num_frames: int, sample_rate: int, channels: int, audio_ext: str) -> None:
        """Record one sample of shard number ``shard`` (shards are numbered in the order they are added)."""
        values = dict(shard=shard, frame_offset=frame_offset, frame_size=frame_size, member_offset=member_offset,
                      member_size=member_size, num_frames=num_frames, sample_rate=sample_rate,
                      channels=channels, format=self.format_id(audio_ext))
        for name, value in values.items():
            self._rows[name].append(value)
        self._keys.append(key)

    def add_shard(self, info: ShardInfo) -> int:
        """Record a finished shard; returns its number."""
        self.shards.append(info)
        return len(self.shards) - 1

    def build(self) -> Index:
        """The finished index (not yet saved)."""
        columns: dict[str, np.ndarray] = {name: np.asarray(values, dtype=COLUMNS[name])
                                          for name, values in self._rows.items()}
        index = Index(root=self.root, shards=list(self.shards), formats=list(self.formats), columns=columns,
                      _keys=list(self._keys))
        index.validate(self.root)
        return index
