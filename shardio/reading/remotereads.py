"""RemoteReads: the part of :class:`~shardio.reading.reader.Reader` that reads remote shards.

Two ways to hide object-storage latency, both driven by the plan: read-ahead (the next batches' spans,
coalesced per shard and fetched concurrently while the current batch is built:
:mod:`shardio.reading.prefetch`), and the node-local shard cache (whole shards fetched once per node and
mapped from local disk: :mod:`shardio.reading.cache`). With the cache, the read-ahead fetches the shards the
next batches need into it. Every read of a shard over HTTP or S3 is held to the version this process first
read (:mod:`shardio.storage.validators`)."""

from __future__ import annotations

import errno
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import numpy as np

from ..errors import ReadError
from ..shards.columns import STREAM_CODECS
from ..shards.index import Index
from ..storage.files import read_range
from ..storage.filesystems import Filesystems
from ..storage.httpreads import is_http
from ..storage.localshard import LocalShard, short_read
from ..storage.objectcopy import copy_capped
from ..storage.retries import RetryPolicy, retrying
from ..storage.s3reads import is_s3
from ..storage.validators import Validators, from_info
from .cache import ShardCache
from .prefetch import MAX_GAP, ReadAhead, Span

__all__ = ["RemoteReads"]

logger = logging.getLogger(__name__)


class RemoteReads:
    """Remote range reads, read-ahead and the node cache, for a reader with these attributes."""

    index: Index
    retry: RetryPolicy
    cache: ShardCache | None
    stats: Any
    _filesystems: Filesystems | None
    _validators: Validators
    _ahead: ReadAhead | None
    _columns: dict[str, np.ndarray]
    _broken: dict[int, Any]
    _from_cache: set[int]
    _handles: OrderedDict[int, Any]
    _streams: OrderedDict[int, bytes]
    _cursor: Any
    _frame: tuple[int, int, bytes] | None
    _pid: int
    _after_fork: Callable[[], None]
    _count_retry: Callable[[BaseException], None]

    def _fetch(self, shard: int, handle: tuple[Any, str], offset: int, size: int, where: str) -> bytes:
        """``size`` bytes at ``offset`` of remote shard ``shard``, open as ``handle``, with retries (safe in
        read-ahead threads); over HTTP the answer must say the object still has the index's size, and over
        HTTP and S3 be the version this process first read (a shard found changed fails without a request)."""
        fs, path = handle
        total = self.index.table.bytes_of(shard)
        self._validators.refuse_changed(shard, where)
        pin = self._validators.pin(shard)
        data = retrying(
            lambda: read_range(fs, path, offset, offset + size, total, pin),
            where,
            self.retry,
            self._count_retry,
        )
        if len(data) != size:
            raise short_read(where, size, offset, len(data))
        return data

    def _remote(self, shard: int, where: str) -> tuple[Any, str]:
        """The filesystem of remote shard ``shard`` (one per protocol and options) and its path there."""
        if self._filesystems is None:
            self._filesystems = Filesystems()
        return self._filesystems.get(
            self.index.shard_path(shard),
            self.index.shard_options(shard),
            where,
            self.retry,
            self._count_retry,
        )

    def _count_request(self, size: int) -> None:
        self.stats.requests += 1
        self.stats.bytes_fetched += size

    def read_ahead(
        self,
        batches: Iterable[np.ndarray],
        budget: int,
        concurrency: int = 16,
        max_gap: int = MAX_GAP,
        share: float = 1.0,
        held: Callable[[np.ndarray], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """``batches`` (arrays of sample ids, in the order they will be read), passed through; while the
        caller reads one, the remote bytes of the next ones (up to ``budget`` bytes) are fetched, coalesced
        per shard and concurrently (:mod:`shardio.reading.prefetch`); ``share``: the part of the plan's
        batches these are (1 / DataLoader workers); a batch for which ``held(ids)`` is true (the decoded cache
        holds its samples) fetches nothing. Local datasets, and ``budget=0``, read as they go:
        ``iter(batches)``."""
        if budget <= 0 or not self.index.remote:
            return iter(batches)
        return self._reading_ahead(
            batches,
            ReadAhead(
                self._spans if held is None else (lambda ids: [] if held(ids) else self._spans(ids)),
                self._fetch_span,
                budget=budget,
                concurrency=concurrency,
                max_gap=max_gap,
                share=share,
                on_request=self._count_request,
            ),
        )

    def _reading_ahead(self, batches: Iterable[np.ndarray], ahead: ReadAhead) -> Iterator[np.ndarray]:
        if self._pid != os.getpid():
            self._after_fork()
        self._ahead = ahead
        try:
            yield from ahead.run(batches)
        finally:
            self._ahead = None

    def _spans(self, ids: np.ndarray) -> list[Span]:
        """The remote byte spans the samples ``ids`` read (a stream-codec shard: all of it)."""
        c = self._columns
        spans = []
        for sample in ids.tolist():
            shard = int(c["shard"][sample])
            if not self.index.is_remote(shard) or shard in self._broken or shard in self._from_cache:
                continue
            if self.cache is not None:
                spans += self._whole_shard(shard)
                continue
            self._check_size_ahead(shard)
            codec = self.index.table.codec_of(shard)
            offset = int(c["frame_offset"][sample])
            if codec in STREAM_CODECS:
                if shard not in self._streams:
                    spans.append(Span(shard, 0, self.index.table.bytes_of(shard)))
            elif codec == "none":
                spans.append(Span(shard, offset, offset + int(c["member_size"][sample])))
            elif self._frame is None or self._frame[:2] != (shard, offset):
                spans.append(Span(shard, offset, offset + int(c["frame_size"][sample])))
        return [s for s in spans if s.end <= self.index.table.bytes_of(s.shard)]

    def _check_size_ahead(self, shard: int) -> None:
        """Start the size check of a remote shard not yet opened, in the read-ahead's pool (else the reader
        makes one request per shard, in turn, as it first opens each: 6 shards at 50 ms were 0.3 s of each
        epoch)."""
        assert self._ahead is not None
        if shard not in self._handles and shard not in self._ahead.sizes:
            where = f"shard {self.index.shard_path(shard)}"
            self._ahead.sizes[shard] = self._ahead.background(lambda: self._size(shard, where))

    def _size(self, shard: int, where: str) -> int:
        """The size of remote shard ``shard`` as its server reports it (retried); the same answer's validator
        is recorded, or checked where one is already (:mod:`shardio.storage.validators`)."""
        fs, path = self._remote(shard, where)
        protocol = "http" if is_http(fs) else "s3" if is_s3(fs) else ""
        pin = self._validators.pin(shard)

        def info() -> Any:
            found = fs.info(path)
            pin.check(from_info(found, protocol))
            return found.get("size")

        return int(retrying(info, where, self.retry, self._count_retry))

    def _remote_size(self, shard: int, where: str) -> int:
        """The size of remote shard ``shard``: from the read-ahead's check when it made one, else asked now
        (also when that check failed other than with a missing file: as for read-ahead fetches, the reader
        tries itself, with its own retries and its own ``where`` in the error)."""
        pending = self._ahead.sizes.pop(shard, None) if self._ahead is not None else None
        if pending is not None:
            try:
                return pending.result()
            except FileNotFoundError:
                raise
            except Exception as exc:  # noqa: BLE001 - asked again below, which reports what fails
                logger.debug("%s: the read-ahead's size check failed (%s); asking again", where, exc)
        return self._size(shard, where)

    def _whole_shard(self, shard: int) -> list[Span]:
        """With the node cache: the whole shard as one span, the first time the read-ahead meets it uncached
        (a cached one is marked as about to be used, so it is evicted last)."""
        assert self.cache is not None and self._ahead is not None
        if shard in self._ahead.met:
            return []
        self._ahead.met.add(shard)
        info = self.index.shards[shard]
        if self.cache.lookup(info.sha256, info.bytes) is not None:
            return []
        return [Span(shard, 0, info.bytes)]

    def _fetch_span(self, span: Span) -> bytes:
        if self.cache is not None:  # a whole shard into the cache; the reader then maps it from there
            self._cached(span.shard, f"shard {self.index.shard_path(span.shard)} (read-ahead)")
            return b""
        where = f"shard {self.index.shard_path(span.shard)}, bytes {span.start} to {span.end} (read-ahead)"
        return self._fetch(
            span.shard, self._remote(span.shard, where), span.start, span.end - span.start, where
        )

    # -- the node cache ------------------------------------------------------------------------------

    def _cached(self, shard: int, where: str) -> str | None:
        """The local path of remote shard ``shard`` in the node cache, fetched whole if need be; None when it
        cannot be cached (too big, or no room on the disk)."""
        assert self.cache is not None
        info = self.index.shards[shard]
        found = self.cache.lookup(info.sha256, info.bytes)
        if found is None:
            found = self.cache.fill(
                info.sha256, info.bytes, lambda out: self._download(shard, out, where), where
            )
        return found

    def _open_cached(self, shard: int, where: str) -> int | None:
        """A read-only descriptor of remote shard ``shard``'s copy in the node cache (fetched if need be);
        None: read it by ranges. A copy another process evicts between its fetch and this open is fetched
        again (up to 3 times: a small cache that many readers fill at once evicts often)."""
        for _ in range(3):
            path = self._cached(shard, where)
            if path is None:
                return None
            try:
                return os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
        return None

    def _download(self, shard: int, out: BinaryIO, where: str) -> None:
        """Stream remote shard ``shard`` into ``out`` (retried whole under the reader's policy), no further
        than one byte past the size the index records (a longer answer is refused by the cache's size check,
        not written on until the disk is full); over HTTP as the range of those bytes, which must say the
        object has that size and come at :data:`~shardio.storage.httpreads.HTTP_MIN_RATE` after a grace
        (:func:`~shardio.storage.objectcopy.copy_capped`)."""
        fs, path = self._remote(shard, where)
        size = self.index.table.bytes_of(shard)

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            copy_capped(fs, path, out, size, size, self._validators.pin(shard))

        try:
            retrying(attempt, where, self.retry, self._count_retry)
        except ReadError as exc:
            # a full disk is the cache's to handle (evict, or read by ranges): not a read error
            if isinstance(exc.__cause__, OSError) and exc.__cause__.errno in (errno.ENOSPC, errno.EDQUOT):
                raise exc.__cause__ from None
            raise
        self._count_request(size)

    def _refetch(self, sample: int, where: str) -> bool:
        """Whether sample ``sample``'s shard came from the node cache: then its entry is discarded (it failed
        a check) and the shard is fetched again on the next read."""
        shard = int(self._columns["shard"][sample])
        if shard not in self._from_cache or self.cache is None:
            return False
        info = self.index.shards[shard]
        logger.warning("%s: the node cache's copy of the shard failed a check; fetching it again", where)
        self.cache.discard(info.sha256, info.bytes)
        self._from_cache.discard(shard)
        handle = self._handles.pop(shard, None)
        if isinstance(handle, LocalShard):
            handle.close()
        self._streams.pop(shard, None)
        self._frame = self._cursor = None
        return True
