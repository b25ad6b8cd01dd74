"""ShardTable: the index's shard table (name, bytes, sha256, samples, duration, codec) as a few numpy arrays.

A list of one :class:`ShardInfo` a shard costs about 500 bytes a shard as Python objects in every process that
holds it, and a DataLoader worker started by ``spawn`` or ``forkserver`` receives it pickled: at 360k shards,
about 180 MB in each worker. The table keeps names and SHA-256s as UTF-8 blobs plus end offsets
(:mod:`shardio.shards.spans`, ``int64`` ends), sizes and sample counts as ``int64``, durations as ``float64``
and codecs as ``uint8`` numbers into :data:`CODECS`; it pickles as those arrays, or, once a dataset has put
them in shared memory for its workers (:func:`shardio.runtime.sharing.shared_table`), as the objects that
carry them there.

It is a read-only ``Sequence[ShardInfo]``: ``table[i]`` builds one :class:`ShardInfo` when asked, and the
per-sample read paths use the column accessors (:meth:`ShardTable.bytes_of`, :meth:`ShardTable.codec_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, overload

import numpy as np

from ..errors import FormatError, shown, shown_path
from .spans import Spans, join_spans

__all__ = ["CODECS", "ShardInfo", "ShardTable"]

CODECS = ("none", "zstd", "zstd-stream", "gzip", "bz2")
_LIMIT = 1 << 63  # sizes and counts are int64


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index records it.

    Args:
        name: Its file name, relative to the dataset's root.
        bytes: Its size in bytes.
        sha256: The SHA-256 of its bytes (hex).
        samples: The samples it holds.
        duration: Their seconds of audio.
        codec: `"none"` (plain tar), or the codec of its compressed form (`"zstd"`).
    """

    name: str
    bytes: int
    sha256: str
    samples: int
    duration: float
    codec: str = "none"


_FIELDS = tuple(f.name for f in fields(ShardInfo))
_ARRAYS: dict[str, Any] = {
    "name_blob": np.uint8,
    "name_ends": np.int64,
    "sha256_blob": np.uint8,
    "sha256_ends": np.int64,
    "bytes": np.int64,
    "samples": np.int64,
    "duration": np.float64,
    "codec": np.uint8,
}


class _Texts(Spans):
    """Strings as a UTF-8 blob (a ``uint8`` array) plus end offsets; lone surrogates (file names that are not
    UTF-8, as Python decodes them) pass through, so every ``str`` comes back as it went in."""

    _what = "shard {}'s text"

    def text(self, i: int) -> str:
        start, end = self._span(i)
        return bytes(self._blob[start:end]).decode("utf-8", "surrogatepass")


def _texts(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    blob, ends = join_spans([v.encode("utf-8", "surrogatepass") for v in values])
    # int64 ends: torch pickles no unsigned type wider than a byte (a plain pickle of the shared table)
    return np.frombuffer(blob, np.uint8) if blob else np.zeros(0, np.uint8), ends.astype(np.int64)


def _checked(entry: Any, where: str) -> tuple[str, int, str, int, float, int]:
    """One shard entry (an ``index.json`` object or a :class:`ShardInfo`), its field types checked:
    ``TypeError``/``ValueError`` naming the shard and field, :class:`FormatError` for an unknown codec."""
    if isinstance(entry, ShardInfo):
        values = dict(
            zip(_FIELDS, (entry.name, entry.bytes, entry.sha256, entry.samples, entry.duration, entry.codec))
        )
    elif isinstance(entry, dict):
        values = {"codec": "none", **entry}
        unknown, missing = (
            sorted(set(values) - set(_FIELDS), key=str),
            [f for f in _FIELDS if f not in values],
        )
        if unknown or missing:
            raise TypeError(
                f"a shard entry has fields {shown(sorted(map(str, values)))}, expected {list(_FIELDS)} "
                "(codec optional)"
            )
    else:
        raise TypeError(f"a shard entry must be an object, not {shown(entry)}")
    name, codec = values["name"], values["codec"]
    if not isinstance(name, str) or not name:
        raise TypeError(f"shard name {shown(name)} is not a file name")
    size, samples = (_count(name, field, values[field]) for field in ("bytes", "samples"))
    if not isinstance(values["sha256"], str):
        raise TypeError(
            f"shard {shown(name)}: sha256 must be a string, not {type(values['sha256']).__name__}"
        )
    duration = values["duration"]
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"shard {shown(name)}: duration must be a number, not {type(duration).__name__}")
    try:
        seconds = float(duration)
    except OverflowError:
        raise ValueError(f"shard {shown(name)}: duration {shown(duration)} is beyond a float") from None
    if not isinstance(codec, str):
        raise TypeError(f"shard {shown(name)}: codec must be a string, not {shown(codec)}")
    if codec not in CODECS:
        raise FormatError(f"{shown_path(where)}: shard {shown(name)} has unknown codec {shown(codec)}")
    return name, size, values["sha256"], samples, seconds, CODECS.index(codec)


def _count(name: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"shard {shown(name)}: {field} must be a non-negative integer, not {shown(value)}")
    if value >= _LIMIT:
        raise ValueError(f"shard {shown(name)}: {field} must be below 2**63, not {shown(value)}")
    return value


class ShardTable(Sequence[ShardInfo]):
    """A read-only sequence of :class:`ShardInfo` over columns (see the module). Make one with :meth:`of`
    (entries) or :meth:`from_arrays`; ``carriers`` (optional) are what it pickles as instead of its arrays:
    objects, one per array, that ``numpy.asarray`` turns back into the same array (shared-memory tensors)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], carriers: Mapping[str, Any] | None = None) -> None:
        self._arrays = {name: np.asarray(arrays[name]) for name in _ARRAYS}
        self._carriers = None if carriers is None else dict(carriers)
        self._names = _Texts(self._arrays["name_blob"], self._arrays["name_ends"], "shard table")
        self._sha256 = _Texts(self._arrays["sha256_blob"], self._arrays["sha256_ends"], "shard table")
        self._bytes, self._samples = self._arrays["bytes"], self._arrays["samples"]
        self._codecs = self._arrays["codec"]
        n = len(self._names)
        for name, dtype in _ARRAYS.items():
            array = self._arrays[name]
            if (
                array.dtype != np.dtype(dtype)
                or array.ndim != 1
                or (not name.endswith("_blob") and array.shape[0] != n)
            ):
                raise FormatError(
                    f"shard table: array {name!r} has dtype {array.dtype} and shape {array.shape}, "
                    f"expected {np.dtype(dtype)} and ({n},)"
                )

    @classmethod
    def of(cls, entries: Iterable[ShardInfo | Mapping[str, Any]], where: str = "index") -> ShardTable:
        """The table of ``entries``: :class:`ShardInfo` objects or ``index.json`` shard objects, each checked
        (``TypeError``/``ValueError`` for a malformed field; :class:`FormatError` naming ``where`` for an
        unknown codec). A table is returned as it is."""
        if isinstance(entries, ShardTable):
            return entries
        rows = [_checked(entry, where) for entry in entries]
        columns = list(zip(*rows)) if rows else [()] * len(_FIELDS)
        names, sha256 = _texts(columns[0]), _texts(columns[2])
        return cls(
            {
                "name_blob": names[0],
                "name_ends": names[1],
                "sha256_blob": sha256[0],
                "sha256_ends": sha256[1],
                "bytes": np.array(columns[1], np.int64),
                "samples": np.array(columns[3], np.int64),
                "duration": np.array(columns[4], np.float64),
                "codec": np.array(columns[5], np.uint8),
            }
        )

    @classmethod
    def from_arrays(cls, carriers: Mapping[str, Any]) -> ShardTable:
        """The table whose arrays are ``numpy.asarray(carrier)`` (views: for a CPU tensor, of its memory), and
        which pickles as ``carriers`` (or as its arrays, when every carrier is a numpy array already)."""
        arrays = {name: np.asarray(carrier) for name, carrier in carriers.items()}
        plain = all(isinstance(c, np.ndarray) for c in carriers.values())
        return cls(arrays, None if plain else carriers)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array of the table, by name (read them, do not write them)."""
        return dict(self._arrays)

    @property
    def carriers(self) -> dict[str, Any] | None:
        """What the table pickles as instead of its arrays (None: the arrays themselves)."""
        return self._carriers

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return ShardTable.from_arrays, (self._carriers if self._carriers is not None else self._arrays,)

    # -- columns -----------------------------------------------------------------------------------

    @property
    def bytes(self) -> np.ndarray:
        """Each shard's file size (``int64``)."""
        return self._bytes

    @property
    def samples(self) -> np.ndarray:
        """Each shard's sample count (``int64``)."""
        return self._samples

    @property
    def durations(self) -> np.ndarray:
        """Each shard's seconds of audio (``float64``)."""
        return self._arrays["duration"]

    @property
    def codecs(self) -> np.ndarray:
        """Each shard's codec, as its number in :data:`CODECS` (``uint8``)."""
        return self._codecs

    def name(self, shard: int) -> str:
        """The file name of shard number ``shard``."""
        return self._names.text(shard)

    def names(self) -> list[str]:
        """Every shard's file name."""
        return [self._names.text(i) for i in range(len(self))]

    def bytes_of(self, shard: int) -> int:
        """The file size of shard number ``shard``."""
        return int(self._bytes[shard])

    def codec_of(self, shard: int) -> str:
        """The codec of shard number ``shard`` (one of :data:`CODECS`)."""
        return CODECS[self._codecs[shard]]

    def sha256_of(self, shard: int) -> str:
        """The SHA-256 (hex) the index records for shard number ``shard``."""
        return self._sha256.text(shard)

    def entries(self) -> list[dict[str, Any]]:
        """Every shard as the ``index.json`` object it is written as (the fields of :class:`ShardInfo`, in
        order)."""
        columns = (
            self.names(),
            self._bytes.tolist(),
            [self._sha256.text(i) for i in range(len(self))],
            self._samples.tolist(),
            self.durations.tolist(),
            [CODECS[c] for c in self._codecs.tolist()],
        )
        return [dict(zip(_FIELDS, row)) for row in zip(*columns)]

    # -- the sequence ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._names)

    def info(self, shard: int) -> ShardInfo:
        """Shard number ``shard`` as a :class:`ShardInfo` (made for this call)."""
        return ShardInfo(
            self._names.text(shard),
            int(self._bytes[shard]),
            self._sha256.text(shard),
            int(self._samples[shard]),
            float(self.durations[shard]),
            CODECS[self._codecs[shard]],
        )

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...

    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self.info(j) for j in range(*i.indices(len(self)))]
        n, i = len(self), int(i)
        if not -n <= i < n:
            raise IndexError(f"shard {i} of {n}")
        return self.info(i % n)

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self.info(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardTable):
            return all(
                np.array_equal(a, other._arrays[name], equal_nan=name == "duration")
                for name, a in self._arrays.items()
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(self._names.text(i)) for i in range(min(len(self), 3)))
        return f"ShardTable([{head}{', ...' if len(self) > 3 else ''}], {len(self)} shards)"
