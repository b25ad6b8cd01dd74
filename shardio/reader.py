"""Reader: fetches one sample's tar members by offset, from local shards or fsspec URLs.

A plain ``.tar`` sample is one positioned read; a ``.tar.zst`` sample is one zstd frame read and
decompressed (the last frame is kept, since neighbouring samples often share it). Stream-compressed
shards from other tools (``.tar.gz``, single-frame ``.tar.zst``) cannot be seeked: they are decompressed
whole, once, and the last one is kept in memory.

Remote reads retry transient failures (connection errors, timeouts, 5xx) with exponential backoff, then
raise :class:`ReadError` naming the shard and offset.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import zstandard

from .errors import FormatError, IntegrityError, ReadError
from .index import STREAM_CODECS, Index
from .storage import filesystem, is_url
from .tarformat import parse_members, split_name

__all__ = ["Reader", "RetryPolicy"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for remote reads: ``attempts`` in all, waiting ``backoff * 2**k`` seconds between."""

    attempts: int = 4
    backoff: float = 0.2
    max_backoff: float = 5.0


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int):
        return status >= 500 or status == 429
    name = type(exc).__name__
    return isinstance(exc, OSError) or any(word in name for word in ("Timeout", "Connection", "Disconnect",
                                                                       "ServerError", "Payload"))


class Reader:
    """Reads samples of one dataset. Cheap to create; holds open file handles, so make one per process."""

    def __init__(self, index: Index, *, retry: RetryPolicy = RetryPolicy(), max_open: int = 64) -> None:
        self.index = index
        self.retry = retry
        self.max_open = max_open
        self._handles: OrderedDict[int, Any] = OrderedDict()
        self._frame: tuple[int, int, bytes] | None = None  # (shard, frame_offset, decompressed bytes)
        self._stream: tuple[int, bytes] | None = None  # (shard, whole decompressed tar)
        self._decompressor = zstandard.ZstdDecompressor()
        self._columns = {name: column for name, column in index.columns.items()}
        self.retries = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_handles=OrderedDict(), _frame=None, _stream=None, _decompressor=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decompressor = zstandard.ZstdDecompressor()

    def close(self) -> None:
        """Close every open shard."""
        for handle in self._handles.values():
            if isinstance(handle, int):
                os.close(handle)
        self._handles.clear()

    # -- raw bytes -------------------------------------------------------------------------------

    def _open(self, shard: int) -> Any:
        handle = self._handles.get(shard)
        if handle is not None:
            self._handles.move_to_end(shard)
            return handle
        path = self.index.shard_path(shard)
        expected = self.index.shards[shard].bytes
        if is_url(path):
            handle = filesystem(path)
            actual = self._with_retries(lambda: handle[0].size(handle[1]), shard, 0)
        else:
            try:
                handle = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise ReadError(f"shard {path} is missing (the index lists it with {expected} bytes)") from None
            except OSError as exc:
                raise ReadError(f"shard {path} cannot be opened: {exc}") from None
            actual = os.fstat(handle).st_size
        if actual != expected:
            if isinstance(handle, int):
                os.close(handle)
            raise IntegrityError(f"shard {path} has {actual} bytes, the index recorded {expected}: "
                                 "it was replaced or truncated after indexing; re-run 'shardio index' or re-pack")
        self._handles[shard] = handle
        if len(self._handles) > self.max_open:
            _, oldest = self._handles.popitem(last=False)
            if isinstance(oldest, int):
                os.close(oldest)
        return handle

    def _with_retries(self, action: Any, shard: int, offset: int) -> Any:
        for attempt in range(self.retry.attempts):
            try:
                return action()
            except Exception as exc:  # noqa: BLE001 - classified just below
                if not _is_transient(exc) or attempt + 1 == self.retry.attempts:
                    raise ReadError(f"shard {self.index.shard_path(shard)} at offset {offset}: read failed "
                                    f"after {attempt + 1} attempt(s): {type(exc).__name__}: {exc}") from exc
                self.retries += 1
                delay = min(self.retry.backoff * 2**attempt, self.retry.max_backoff)
                logger.warning("retrying shard %s offset %d in %.2fs after %s: %s",
                               self.index.shards[shard].name, offset, delay, type(exc).__name__, exc)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def read_range(self, shard: int, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of shard number ``shard``; short reads are an error."""
        handle = self._open(shard)
        if isinstance(handle, int):
            data = os.pread(handle, size, offset)
        else:
            fs, path = handle
            data = self._with_retries(lambda: fs.cat_file(path, start=offset, end=offset + size), shard, offset)
        if len(data) != size:
            raise FormatError(f"shard {self.index.shard_path(shard)}: wanted {size} bytes at offset {offset}, "
                              f"got {len(data)} (truncated shard?)")
        return data

    def _stream_bytes(self, shard: int) -> bytes:
        if self._stream is None or self._stream[0] != shard:
            info = self.index.shards[shard]
            raw = self.read_range(shard, 0, info.bytes)
            where = self.index.shard_path(shard)
            try:
                if info.codec == "gzip":
                    data = gzip.decompress(raw)
                elif info.codec == "bz2":
                    data = bz2.decompress(raw)
                else:
                    data = self._decompressor.decompressobj().decompress(raw)
            except Exception as exc:  # noqa: BLE001 - every codec raises its own type
                raise FormatError(f"shard {where}: cannot decompress ({info.codec}): {exc}") from None
            self._stream = (shard, data)
        return self._stream[1]

    def _frame_bytes(self, shard: int, frame_offset: int, frame_size: int) -> bytes:
        if self._frame is not None and self._frame[:2] == (shard, frame_offset):
            return self._frame[2]
        raw = self.read_range(shard, frame_offset, frame_size)
        try:
            data = self._decompressor.decompress(raw)
        except zstandard.ZstdError as exc:
            raise FormatError(f"shard {self.index.shard_path(shard)}: corrupt zstd frame at offset "
                              f"{frame_offset} ({frame_size} bytes): {exc}") from None
        self._frame = (shard, frame_offset, data)
        return data

    def sample_bytes(self, sample: int) -> memoryview:
        """The tar bytes (headers and data of every member) of sample number ``sample``."""
        c = self._columns
        shard, frame_offset = int(c["shard"][sample]), int(c["frame_offset"][sample])
        frame_size, member_size = int(c["frame_size"][sample]), int(c["member_size"][sample])
        member_offset = int(c["member_offset"][sample])
        codec = self.index.shards[shard].codec
        if codec == "none":
            return memoryview(self.read_range(shard, frame_offset, member_size))
        if codec in STREAM_CODECS:
            data = self._stream_bytes(shard)
            start, end = frame_offset, frame_offset + member_size
        else:
            data = self._frame_bytes(shard, frame_offset, frame_size)
            start, end = member_offset, member_offset + member_size
        if end > len(data):
            raise FormatError(f"shard {self.index.shard_path(shard)}: sample {sample} runs past its frame "
                              f"({end} > {len(data)} bytes)")
        return memoryview(data)[start:end]

    def members(self, sample: int) -> dict[str, memoryview]:
        """Sample number ``sample`` as ``{ext: bytes}``, checking each member belongs to its key."""
        key = self.index.keys[sample]
        where = f"shard {self.index.shards[int(self._columns['shard'][sample])].name}, key {key!r}"
        found: dict[str, memoryview] = {}
        for name, data in parse_members(self.sample_bytes(sample), where):
            member_key, ext = split_name(name)
            if member_key != key:
                raise FormatError(f"{where}: found member {name!r} where the index expects key {key!r}")
            found[ext] = data
        if not found:
            raise FormatError(f"{where}: no members at the indexed offset")
        return found
