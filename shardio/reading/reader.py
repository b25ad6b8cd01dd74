"""Reader: fetches one sample's tar members by offset, from local shards or fsspec URLs.

A plain ``.tar`` sample of a local shard is a view of the shard's memory map (a positioned read where the
kernel cannot map it safely; see :mod:`shardio.storage.localshard`), of a remote one a ranged request; a
compressed sample is decompressed from its zstd frame or its stream shard
(:mod:`shardio.reading.compressedreads`).

Remote reads retry transient failures (connection errors, timeouts, 5xx) under a :class:`RetryPolicy`, then
raise :class:`ReadError` naming the shard, key and offset.

Integrity, per read and cheap: a shard's size must match the index when it is opened (a truncated or
re-written shard of another size fails with :class:`IntegrityError` before any sample is read); every tar
header's checksum must hold and every member must carry the indexed key (:mod:`shardio.reading.members`);
``.tar.zst`` frames carry zstd's content checksum. A local shard rewritten or replaced after its index was
loaded is a :class:`ShardChanged` (:mod:`shardio.storage.localshard`), as a remote one is. What this cannot
see is a same-size shard whose member *data* changed before the index was loaded, in a plain ``.tar`` (headers
and keys intact): comparing every shard's SHA-256 with the index is ``shardio verify``'s job."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Any

import zstandard

from ..errors import FormatError, IntegrityError, ReadError, ShardChanged, ShardioError
from ..shards.columns import STREAM_CODECS
from ..shards.index import Index
from ..storage import localshard
from ..storage.filesystems import Filesystems
from ..storage.localshard import LocalShard
from ..storage.retries import RetryPolicy
from ..storage.validators import Validators
from .cache import ShardCache
from .compressedreads import CompressedReads
from .members import SampleMembers
from .prefetch import ReadAhead
from .readstats import ReadStats
from .remotereads import RemoteReads
from .streams import StreamCursor

__all__ = ["ReadStats", "Reader"]

logger = logging.getLogger(__name__)

_PROCESS = [os.getpid()]  # this process's pid, kept current across fork: no system call per read
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PROCESS.__setitem__(0, os.getpid()))


class Reader(RemoteReads, CompressedReads, SampleMembers):
    """Reads samples of one dataset. Cheap to create; holds open file handles, so make one per process.

    URLs are opened with the index's ``storage_options``. A reader inherited across ``fork`` (a DataLoader
    worker) drops its parent's handles and counters on first use, and reopens.
    """

    def __init__(
        self,
        index: Index,
        *,
        retry: RetryPolicy = RetryPolicy(),
        max_open: int = 64,
        stream_cache_bytes: int = 1 << 30,
        max_stream_bytes: int = 4 << 30,
        cache: ShardCache | None = None,
    ) -> None:
        self.index = index
        self.cache = cache
        """The node-local cache remote shards are read through, whole (None: read by ranges)."""
        self._from_cache: set[int] = set()  # shards open from the cache
        self.retry = retry
        self.max_open = max_open
        self.stream_cache_bytes = stream_cache_bytes
        self.max_stream_bytes = max_stream_bytes
        self.stats = ReadStats()
        self._handles: OrderedDict[int, Any] = OrderedDict()
        self._broken: dict[int, ShardioError] = {}  # shards that are missing or of the wrong size
        self._filesystems: Filesystems | None = None  # fsspec filesystems by protocol and options, when used
        self._validators = Validators()  # remote shards' versions as first read (kept across fork, pickling)
        self._frame: tuple[int, int, bytes] | None = None  # (shard, frame_offset, decompressed bytes)
        self._streams: OrderedDict[int, bytes] = OrderedDict()  # whole decompressed stream shards, LRU
        self._cursor: tuple[int, StreamCursor] | None = (
            None  # a stream shard too large to keep, read by spans
        )
        self._decompressor = zstandard.ZstdDecompressor()
        self._columns = {name: column for name, column in index.columns.items()}
        self._maps: dict[int, bool] = {}  # shard -> read as views of its memory map
        # shard -> ("shard PATH", has zstd frames), for messages
        self._labels: dict[int, tuple[str, bool]] = {}
        self._pid = os.getpid()
        self._ahead: ReadAhead | None = None  # this process's read-ahead, while a run of batches is read

    @property
    def retries(self) -> int:
        """Remote reads retried so far in this process."""
        return self.stats.retries

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(
            _handles=OrderedDict(),
            _frame=None,
            _streams=OrderedDict(),
            _cursor=None,
            _decompressor=None,
            stats=ReadStats(),
            _filesystems=None,
            _ahead=None,
            _from_cache=set(),
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decompressor = zstandard.ZstdDecompressor()
        self._pid = os.getpid()

    def close(self) -> None:
        """Close every open shard."""
        for handle in self._handles.values():
            if isinstance(handle, LocalShard):
                handle.close()
        self._handles.clear()

    def _after_fork(self) -> None:
        # fsspec's async filesystems refuse to run in a child process; file descriptors are the parent's
        # copies
        self.close()
        self._frame = self._ahead = self._cursor = None
        self._filesystems = None
        self._streams = OrderedDict()
        self._from_cache = set()
        self.stats = ReadStats()
        self._pid = os.getpid()

    # -- raw bytes -------------------------------------------------------------------------------

    def _open(self, shard: int, where: str) -> Any:
        cached = self._handles.get(shard)
        if cached is not None:
            self._handles.move_to_end(shard)
            return cached
        if shard in self._broken:
            known = self._broken[shard]
            raise type(known)(f"{where}: {known}")
        path = self.index.shard_path(shard)
        expected = self.index.table.bytes_of(shard)
        handle: Any
        try:
            remote = self.index.is_remote(shard)
            cached = self._open_cached(shard, where) if remote and self.cache is not None else None
            if cached is not None:
                handle = LocalShard(cached, expected)
                actual = os.fstat(handle.fd).st_size
                self._from_cache.add(shard)
            elif remote:
                handle = self._remote(shard, where)
                actual = self._remote_size(shard, where)
            else:
                try:
                    fd, actual = localshard.open_regular(path)
                except localshard.NotRegular as exc:
                    self._broken[shard] = FormatError(f"not a regular file ({exc}); expected the shard file")
                    raise FormatError(f"{where}: {self._broken[shard]}") from None
                handle = LocalShard(fd, expected, self.index.loaded_ns)
        except FileNotFoundError:
            self._broken[shard] = ReadError(
                f"the shard file is missing (the index lists it with {expected} bytes)"
            )
            raise ReadError(f"{where}: {self._broken[shard]}") from None
        except OSError as exc:
            raise ReadError(f"{where}: the shard file cannot be opened: {exc}") from None
        if actual != expected:
            if isinstance(handle, LocalShard):
                handle.close()
            self._broken[shard] = IntegrityError(
                f"the shard file has {actual} bytes, the index recorded {expected}: it was replaced or "
                "truncated after indexing; re-run 'shardio index' or re-pack"
            )
            raise IntegrityError(f"{where}: {self._broken[shard]}")
        if isinstance(handle, LocalShard) and handle.unchanged_since is not None:
            try:
                handle.check_unchanged("")
            except ShardChanged as exc:
                handle.close()
                self._broken[shard] = ShardChanged(str(exc).removeprefix(": "))
                raise ShardChanged(f"{where}: {self._broken[shard]}") from None
        self._handles[shard] = handle
        if len(self._handles) > self.max_open:
            _, oldest = self._handles.popitem(last=False)
            if isinstance(oldest, LocalShard):
                oldest.close()
        return handle

    def _count_retry(self, exc: BaseException) -> None:
        self.stats.retries += 1

    def read_range(self, shard: int, offset: int, size: int, where: str | None = None) -> bytes:
        """``size`` bytes at ``offset`` of shard number ``shard``; short reads are an error.

        ``where`` names the read in error messages (default: the shard file and offset).
        """
        if self._pid != _PROCESS[0]:
            self._after_fork()
        where = where or f"shard {self.index.shard_path(shard)}, offset {offset}"
        handle = self._open(shard, where)
        if offset + size > self.index.table.bytes_of(shard):
            raise FormatError(
                f"{where}: the index places {size} bytes at offset {offset}, past the end of the "
                f"shard ({self.index.table.bytes_of(shard)} bytes)"
            )
        if isinstance(handle, LocalShard):
            return handle.read(offset, size, where)
        if self._ahead is not None:
            ahead = self._ahead.take(shard, offset, size)
            if ahead is not None:
                return ahead
        self._count_request(size)
        return self._fetch(shard, handle, offset, size, where)

    def maps(self, shard: int) -> bool:
        """Whether the samples of shard number ``shard`` are read as views of its memory map (so a caller may
        hold many at no cost), rather than copied or decompressed one by one."""
        mapped = self._maps.get(shard)
        if mapped is None:
            mapped = self._maps[shard] = (
                self.index.table.codec_of(shard) == "none"
                and localshard.CAN_MAP
                and not self.index.is_remote(shard)
            )
        return mapped

    def local_shard(self, shard: int) -> LocalShard | None:
        """Shard number ``shard``, open, where its samples are views of its memory map (:meth:`maps`): a
        caller may keep it to take a batch's views at once (:meth:`LocalShard.views`) until it is ``closed``
        (this reader closes its least recently opened shards beyond ``max_open``, and all of them after a
        fork). None elsewhere, or where it cannot be opened (:meth:`sample_bytes` says why)."""
        if self._pid != _PROCESS[0]:
            self._after_fork()
        if not self.maps(shard):
            return None
        handle = self._handles.get(shard)
        if handle is None:
            try:
                handle = self._open(shard, f"shard {self.index.shard_path(shard)}")
            except ShardioError:
                return None
        else:  # open already: no message to name it in
            self._handles.move_to_end(shard)
        return handle if isinstance(handle, LocalShard) else None

    def local_bytes(self, sample: int) -> memoryview | None:
        """The tar bytes of sample number ``sample`` where its shard is a local file (a view of its memory map
        where :meth:`maps`, else read or decompressed); None where the shard is remote or the read fails:
        :meth:`sample_bytes` reads those, and says why it cannot."""
        if self.index.is_remote(int(self._columns["shard"][sample])):
            return None
        try:
            return self._sample_bytes(sample, "")
        except ShardioError:
            return None

    def _local_view(self, shard: int, offset: int, size: int, where: str) -> memoryview:
        """Like :meth:`read_range`, but a local shard's bytes are a view, without a copy (see
        :class:`~shardio.storage.localshard.LocalShard`)."""
        handle = self._open(shard, where)
        if not isinstance(handle, LocalShard) or offset + size > handle.size:
            return memoryview(self.read_range(shard, offset, size, where))
        return handle.view(offset, size, where)

    def where(self, sample: int, key: str | None = None) -> str:
        """Names sample number ``sample`` (whose ``key`` the caller may know already) in messages: its shard
        file, key and offset in the shard."""
        c = self._columns
        shard = int(c["shard"][sample])
        label = self._labels.get(shard)
        if label is None:
            framed = self.index.table.codec_of(shard) not in ("none", *STREAM_CODECS)
            label = self._labels[shard] = (f"shard {self.index.shard_path(shard)}", framed)
        key = self.index.key(sample) if key is None else key
        text = f"{label[0]}, key {key!r}, offset {int(c['frame_offset'][sample])}"
        if label[1]:
            text += f" (+{int(c['member_offset'][sample])} in the frame)"
        return text

    def sample_bytes(self, sample: int, where: str | None = None) -> memoryview:
        """The tar bytes (headers and data of every member) of sample number ``sample``."""
        where = where or self.where(sample)
        try:
            return self._sample_bytes(sample, where)
        except FormatError:
            if not self._refetch(sample, where):
                raise
            return self._sample_bytes(sample, where)

    def _sample_bytes(self, sample: int, where: str) -> memoryview:
        if self._pid != _PROCESS[0]:
            self._after_fork()
        c = self._columns
        shard, frame_offset, member_size = (
            int(c["shard"][sample]),
            int(c["frame_offset"][sample]),
            int(c["member_size"][sample]),
        )
        codec = self.index.table.codec_of(shard)
        if codec == "none":
            return self._local_view(shard, frame_offset, member_size, where)
        frame_size, member_offset = int(c["frame_size"][sample]), int(c["member_offset"][sample])
        if codec in STREAM_CODECS:
            data, base = self._stream_bytes(shard, sample, where)
            start, end = frame_offset - base, frame_offset - base + member_size
        else:
            data = self._frame_bytes(shard, frame_offset, frame_size, member_offset + member_size, where)
            start, end = member_offset, member_offset + member_size
        if end > len(data):
            raise FormatError(f"{where}: the sample runs past its frame ({end} > {len(data)} bytes)")
        return memoryview(data)[start:end]
