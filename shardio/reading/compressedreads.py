"""CompressedReads: the part of :class:`~shardio.reading.reader.Reader` that reads compressed shards.

A seekable ``.tar.zst`` sample is one zstd frame read and decompressed; the last frame is kept, since
neighbouring samples often share it. A stream-compressed shard (``.tar.gz``, a single-frame ``.tar.zst``)
cannot be seeked: it is decompressed once, as far as its indexed samples reach, and recent ones are kept (up
to ``stream_cache_bytes``); one whose samples reach further is read a sample's span at a time. Neither a
frame's header nor a stream allocates beyond what the index places in it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import zstandard

from ..errors import FormatError, ReadError
from ..shards.index import Index
from .streams import StreamCursor, decompress_prefix, decompress_upto

__all__ = ["CompressedReads"]

# A zstd frame header may claim any size; one claiming more than this beyond the bytes the index places in
# the frame is corrupt (shardio's frames hold a few hundred KB), and is not allocated.
_MAX_FRAME_EXCESS = 256 << 20
# A frame claiming more (or not saying) is decompressed in chunks, so that a claim alone allocates nothing.
_ONE_SHOT_FRAME = 64 << 20
# What a frame may decompress to, whatever the index places in it: this many times its own bytes plus this
# many bytes. Audio compresses a few times at most; digital silence far more (10 minutes at 16 kHz, 19 MB, in
# 607 bytes at level 3), which the additive part leaves room for.
_FRAME_RATIO, _FRAME_SLACK = 64, 64 << 20


class CompressedReads:
    """Decompressed frames and stream shards, for a reader with these attributes."""

    index: Index
    max_stream_bytes: int
    stream_cache_bytes: int
    _columns: dict[str, np.ndarray]
    _streams: OrderedDict[int, bytes]
    _cursor: tuple[int, StreamCursor] | None
    _frame: tuple[int, int, bytes] | None
    _decompressor: Any
    read_range: Callable[..., bytes]
    _local_view: Callable[[int, int, int, str], memoryview]

    def _stream_bytes(self, shard: int, sample: int, where: str) -> tuple[bytes, int]:
        """Decompressed bytes of a stream-codec shard that hold ``sample``, and the offset in the decompressed
        tar they start at. A shard whose indexed samples span at most ``stream_cache_bytes`` is decompressed
        once, as far as they reach, and kept (recent ones, up to ``stream_cache_bytes`` in all), so a shuffle
        window over a few such shards decompresses each once. A larger one is read by a
        :class:`~shardio.reading.streams.StreamCursor`: only ``sample``'s span is held (the bytes before it
        are decompressed and dropped), so a huge member costs memory only to a read of its own sample. A
        sample ending past ``max_stream_bytes`` is a :class:`FormatError`."""
        cached = self._streams.get(shard)
        if cached is not None:
            self._streams.move_to_end(shard)
            return cached, 0
        info = self.index.shards[shard]
        start = int(self._columns["frame_offset"][sample])
        end = start + int(self._columns["member_size"][sample])
        if end > self.max_stream_bytes:
            raise FormatError(
                f"{where}: the sample ends {end} bytes into its decompressed {info.codec} "
                f"shard, past the reader's bound (max_stream_bytes={self.max_stream_bytes})"
                "; re-pack the shard with 'shardio pack' (seekable) or raise the bound"
            )
        need = self._stream_need(shard)
        if need > min(self.stream_cache_bytes, self.max_stream_bytes):
            return self._span(shard, start, end, where), start
        raw = self.read_range(shard, 0, info.bytes, where)
        try:
            data = decompress_prefix(raw, info.codec, need, where)
        except ReadError:  # the whole stream does not fit in this process: the sample's span may
            return self._span(shard, start, end, where), start
        self._streams[shard] = data
        while len(self._streams) > 1 and sum(map(len, self._streams.values())) > self.stream_cache_bytes:
            self._streams.popitem(last=False)
        return data, 0

    def _span(self, shard: int, start: int, end: int, where: str) -> bytes:
        """Decompressed bytes ``start`` to ``end`` of stream shard ``shard``, through this reader's cursor."""
        cursor = self._cursor
        if cursor is None or cursor[0] != shard:
            raw = self.read_range(shard, 0, self.index.shards[shard].bytes, where)
            cursor = self._cursor = (shard, StreamCursor(raw, self.index.shards[shard].codec))
        return cursor[1].span(start, end, where)

    def _stream_need(self, shard: int) -> int:
        """The decompressed bytes of a stream shard that its indexed samples span (all that is read)."""
        mine = self._columns["shard"] == shard
        ends = self._columns["frame_offset"][mine] + self._columns["member_size"][mine].astype(np.uint64)
        return int(ends.max()) if ends.size else 0

    def _frame_bytes(self, shard: int, frame_offset: int, frame_size: int, need: int, where: str) -> bytes:
        if self._frame is not None and self._frame[:2] == (shard, frame_offset):
            return self._frame[2]
        problem = f"{where}: corrupt zstd frame ({frame_size} bytes at offset {frame_offset})"
        bound = _FRAME_RATIO * frame_size + _FRAME_SLACK
        if need > bound:
            raise FormatError(
                f"{problem}: the index places {need} bytes in it, more than a frame of its size may "
                f"hold ({bound}: {_FRAME_RATIO} times its bytes plus {_FRAME_SLACK >> 20} MiB)"
            )
        limit = min(need + _MAX_FRAME_EXCESS, bound)
        # a local frame is read in place, not copied
        raw = self._local_view(shard, frame_offset, frame_size, where)
        try:
            claimed = zstandard.frame_content_size(raw)
            if claimed >= 0 and not need <= claimed <= limit:
                raise FormatError(
                    f"{problem}: its header claims {claimed} bytes, the index places {need} in it"
                )
            if 0 <= claimed <= _ONE_SHOT_FRAME:  # shardio's frames: one call, one buffer of the claimed size
                data = self._decompressor.decompress(raw, max_output_size=limit)
            else:  # the buffer grows only as the frame really decompresses, whatever its header claims
                data = decompress_upto(raw, "zstd", limit, where)
        except zstandard.ZstdError as exc:
            raise FormatError(f"{problem}: {exc}") from None
        self._frame = (shard, frame_offset, data)
        return data
