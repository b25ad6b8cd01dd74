"""Load-time checks that keep a dataset's index from reaching outside its root or sizing huge allocations.

An ``index.json`` is input like any other: it may come with a downloaded dataset. These checks run in
:meth:`shardio.shards.index.Index.load`, each on its own, so that they survive changes of the on-disk layout:

- shard names are plain relative paths under the dataset root (no ``..``, no absolute paths, no URL schemes,
  and for a local root no symlink that leads out of it), unless the caller opts in with
  ``allow_outside_root=True`` (what an index written by ``shardio index --out`` elsewhere needs);
- ``columns_file`` is a plain file name in the root, a regular file, whose size is checked against a bound
  from the sample count before it is read (:func:`columns_size_bound`);
- every sample's ``num_frames`` is checked against its member's size (:func:`check_frames`), since the
  loader sizes each batch's audio from it before decoding;
- the structure (:func:`check_structure`, also run on an index built or merged in memory): column dtypes and
  lengths, shard and format numbers in range, known codecs, and per-shard sample counts.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import FormatError, ReadError, shown_path
from ..storage.files import escapes_root, file_size, is_url, read_bytes
from ..storage.localshard import NotRegular, open_regular
from .metadata import check_size
from .names import has_hidden
from .shardtable import CODECS, ShardTable

__all__ = [
    "COLUMNS_BYTES_PER_SAMPLE",
    "COLUMNS_OVERHEAD",
    "FRAMES_PER_BYTE",
    "check_columns_file",
    "check_columns_size",
    "check_confined",
    "check_frames",
    "check_local_columns",
    "check_names",
    "check_shard_name",
    "check_structure",
    "columns_size_bound",
    "read_columns",
    "read_local_index",
    "shown_name",
]

COLUMNS_OVERHEAD = 1 << 20
"""Bytes of ``index.npz`` allowed beyond the per-sample bound (array and zip headers)."""
COLUMNS_BYTES_PER_SAMPLE = 34 + 8 + 1024
"""Bytes of ``index.npz`` allowed per sample: 34 of columns, 8 of key offset, 1 KiB of key on average."""
FRAMES_PER_BYTE = {"wav": 64}
"""The most audio samples (``num_frames * channels``) one byte of a member may hold, by format: 64 for WAV
(PCM holds at most 1, ADPCM 2, GSM 6.10 about 5, MPEG in WAV at low bit rates up to about 16);
:data:`COMPRESSED_FRAMES_PER_BYTE` for every other format."""
COMPRESSED_FRAMES_PER_BYTE = 8192
"""For compressed formats: digital silence in FLAC with 64k-frame blocks reaches a few thousand (libsndfile's
4096-frame blocks: about 550; Opus about 400, Vorbis 250, MP3 30)."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # a colon alone is a file name character
_NAME_LIMIT = 4096


def shown_name(name: str) -> str:
    """A name from an index for a message: its repr, cut at 200 characters."""
    return repr(name if len(name) <= 200 else name[:200] + "...")


def check_shard_name(name: str, where: str, *, allow_outside_root: bool) -> None:
    """A shard name must be a plain relative path under the root: no empty, ``.`` or ``..`` parts (nor
    percent-escapes of them), not absolute, no URL scheme, no control characters or bidi controls (which
    messages would print). With ``allow_outside_root``,
    ``..`` parts and absolute local paths are taken too (never a URL scheme)."""
    problem = None
    parts = name.replace("\\", "/").split("/")
    if not name or len(name) > _NAME_LIMIT:
        problem = "is not a file name"
    elif has_hidden(name):
        problem = "contains a control character or a bidi control (such as a right-to-left override)"
    elif _SCHEME.match(name):
        problem = "has a URL scheme; shard names are relative to the dataset's root"
    elif allow_outside_root:
        return
    elif name.startswith(("/", "\\")) or os.path.isabs(name):
        problem = "is an absolute path"
    elif any(part in ("", ".", "..") for part in parts):
        problem = "has '..', '.' or empty path parts"
    elif "%" in name and escapes_root(name):  # an HTTP client decodes them, and leaves the root
        problem = "has percent-escapes that decode to '/', '\\', '.' or '..' path parts"
    if problem is not None:
        hint = (
            ""
            if problem.startswith(("is not", "has a URL", "contains"))
            else (
                "; shard names must be plain relative paths under the dataset root (load it with "
                "allow_outside_root=True, or --allow-outside-root, if you trust this dataset and it really "
                "spans directories)"
            )
        )
        raise FormatError(f"{shown_path(where)}: shard name {shown_name(name)} {problem}{hint}")


def check_confined(root: str, names: list[str], where: str) -> None:
    """For a local root: every shard path, symlinks resolved, lies inside the root. One directory scan finds
    the links among plain names; only those, and names with sub-directories, are resolved."""
    try:
        with os.scandir(root) as entries:
            links = {entry.name for entry in entries if entry.is_symlink()}
    except OSError:
        links = set()
    base = os.path.realpath(root)
    for name in names:
        if "/" not in name and "\\" not in name and name not in links:
            continue
        resolved = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([base, resolved]) != base:
            raise FormatError(
                f"{shown_path(where)}: shard {shown_name(name)} resolves (through a symbolic link) to a file "
                "outside the dataset root; load it with allow_outside_root=True if you trust "
                "this dataset"
            )


def check_columns_file(name: object, where: str) -> str:
    """The ``columns_file`` of ``index.json``: a plain file name in the dataset root."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or _SCHEME.match(name)
        or any(ord(ch) < 32 for ch in name)
        or len(name) > 255
    ):
        shown = shown_name(name) if isinstance(name, str) else type(name).__name__
        raise FormatError(
            f"{shown_path(where)}: 'columns_file' must be a plain file name in the dataset root, not {shown}"
        )
    return name


def columns_size_bound(samples: object, where: str, meta_bytes: object = None) -> int:
    """The most bytes the columns file of an index of ``samples`` samples (the header's count) may have, with
    ``meta_bytes`` of per-sample metadata (the header's claim, itself bounded by the sample count)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples < 1 << 40:
        raise FormatError(
            f"{shown_path(where)}: 'samples' must be a non-negative integer, not {type(samples).__name__} "
            f"{samples if isinstance(samples, int) else ''}".rstrip()
        )
    meta = 0 if meta_bytes is None else 8 * samples + check_size(samples, meta_bytes, where)
    return COLUMNS_OVERHEAD + samples * COLUMNS_BYTES_PER_SAMPLE + meta


def check_local_columns(root: str, path: str, bound: int, where: str) -> None:
    """A local columns file must be a regular file inside ``root`` of at most ``bound`` bytes (checked
    before it is read: ``/dev/zero`` or a huge file is refused, not read)."""
    try:
        info = os.stat(path)
    except OSError:
        return  # the read reports it
    if _outside(root, path):
        raise FormatError(
            f"{shown_path(where)}: the columns file resolves (through a symbolic link) to a file "
            "outside the dataset root"
        )
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(f"{shown_path(where)}: the columns file is not a regular file")
    check_columns_size(info.st_size, bound, where)


def _outside(root: str, path: str) -> bool:
    base, resolved = os.path.realpath(root), os.path.realpath(path)
    return os.path.commonpath([base, resolved]) != base


def read_local_index(root: str, path: str) -> bytes:
    """A local ``index.json``'s bytes, checked as :func:`check_local_columns` checks the columns file: a
    regular file inside ``root``. It is opened without blocking (a FIFO would block a plain open) and checked
    before it is read (``/dev/zero`` is refused, not read). ``OSError`` where it cannot be opened or read."""
    return _read_regular(root, path, "the dataset's index")


def _read_regular(root: str, path: str, expected: str, bound: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` inside ``root``, of at most ``bound`` bytes: checked on the
    descriptor that is read, so the file cannot be swapped for a FIFO or a device between check and read."""
    try:
        fd, size = open_regular(path)
    except NotRegular as exc:
        raise FormatError(f"{shown_path(path)}: not a regular file ({exc}); expected {expected}") from None
    try:
        if _outside(root, path):
            raise FormatError(
                f"{shown_path(path)}: resolves (through a symbolic link) to a file outside the dataset root"
            )
        if bound is not None:
            check_columns_size(size, bound, path)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read() if bound is None else handle.read(bound + 1)
    finally:
        os.close(fd)


def check_columns_size(size: int, bound: int, where: str) -> None:
    """A columns file of ``size`` bytes, at most ``bound``."""
    if size > bound:
        raise FormatError(
            f"{shown_path(where)}: the columns file has {size} bytes, more than the {bound} that the "
            "sample count in index.json allows"
        )


def check_frames(
    columns: dict[str, np.ndarray],
    formats: list[str],
    shards: list[str],
    where: str,
    key: Callable[[int], str] = str,
) -> None:
    """Every sample's ``num_frames * channels`` at most :data:`FRAMES_PER_BYTE` (by format) times its member
    size, so that no batch is sized beyond what the bytes can hold. ``key(sample)`` names a sample."""
    num_frames, channels, member_size = columns["num_frames"], columns["channels"], columns["member_size"]
    ratios = np.array(
        [FRAMES_PER_BYTE.get(name, COMPRESSED_FRAMES_PER_BYTE) for name in formats] or [1], np.uint64
    )
    claimed = num_frames.astype(np.uint64) * np.maximum(channels, 1).astype(np.uint64)
    allowed = member_size.astype(np.uint64) * ratios[np.minimum(columns["format"], len(ratios) - 1)]
    bad = np.flatnonzero(claimed > allowed)
    if bad.size:
        first = int(bad[0])
        shard = shards[int(columns["shard"][first])]
        try:
            name = shown_name(key(first))
        except FormatError:  # the keys cannot be read either
            name = str(first)
        raise FormatError(
            f"{shown_path(where)}: sample {name} (shard {shown_name(shard)}; {bad.size - 1} more like it) "
            f"claims {int(num_frames[first])} frames x {int(channels[first])} channels in a "
            f"member of {int(member_size[first])} bytes, more than its format can hold"
        )


def read_columns(root: str, path: str, bound: int, storage_options: dict[str, Any] | None) -> bytes:
    """The columns file's bytes, its kind and size checked (against ``bound``) before it is read."""
    try:
        if is_url(path):
            check_columns_size(file_size(path, storage_options), bound, path)
            payload = read_bytes(path, storage_options)
        else:
            payload = _read_regular(root, path, "the index's columns file", bound)
    except FileNotFoundError:
        raise FormatError(f"{shown_path(path)}: index columns file is missing") from None
    except OSError as exc:
        raise ReadError(f"{shown_path(path)}: cannot be read ({exc})") from None
    check_columns_size(len(payload), bound, path)
    return payload


def check_names(root: str, names: list[str], where: str, allow_outside_root: bool) -> None:
    """Every shard name (see :func:`check_shard_name`), and for a local root, where its symlinks lead."""
    for name in names:
        check_shard_name(name, where, allow_outside_root=allow_outside_root)
    if not allow_outside_root and not is_url(root):
        check_confined(root, names, where)


def check_structure(
    columns: Mapping[str, np.ndarray],
    dtypes: Mapping[str, type],
    formats: list[str],
    table: ShardTable,
    where: str,
) -> None:
    """The index's structure: every column of ``dtypes`` with its dtype and one entry a sample, shard and
    format numbers within the shard table and ``formats``, known codecs, and each shard's sample
    count as the table says."""
    n = int(columns["shard"].shape[0])
    for name, dtype in dtypes.items():
        column = columns[name]
        if column.dtype != np.dtype(dtype) or column.shape != (n,):
            raise FormatError(
                f"{shown_path(where)}: column {name!r} has dtype {column.dtype} and shape {column.shape}, "
                f"expected {np.dtype(dtype)} and ({n},)"
            )
    if n and int(columns["shard"].max()) >= len(table):
        raise FormatError(
            f"{shown_path(where)}: a sample names shard {int(columns['shard'].max())}, "
            f"but the index lists {len(table)} shards"
        )
    if n and int(columns["format"].max()) >= len(formats):
        raise FormatError(f"{shown_path(where)}: a sample names an audio format the index does not list")
    if len(table) and int(table.codecs.max()) >= len(CODECS):
        raise FormatError(
            f"{shown_path(where)}: shard {table.name(int(table.codecs.argmax()))} has an unknown codec"
        )
    counts = np.bincount(columns["shard"], minlength=len(table))
    wrong = np.flatnonzero(counts != table.samples)
    if wrong.size:
        number = int(wrong[0])
        raise FormatError(
            f"{shown_path(where)}: shard {table.name(number)} lists {int(table.samples[number])} samples, "
            f"the columns hold {counts[number]}"
        )
