"""The columns of an index: what it keeps of each sample, 34 bytes a sample (:mod:`shardio.shards.index`).

Per sample the columns say where its tar bytes are: ``frame_offset``/``frame_size`` locate the bytes to
read from the shard file (a zstd frame, or the sample's own tar bytes in a plain ``.tar``), and
``member_offset``/``member_size`` locate the sample's members inside those bytes once decompressed.
Shards with a stream codec (``gzip``, ``bz2``, ``zstd-stream``: shards from other tools that cannot be
seeked) use ``frame_offset`` as the offset in the decompressed tar and are read as a whole.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COLUMNS", "STREAM_CODECS"]

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
"""Each column's name and dtype."""
STREAM_CODECS = frozenset({"zstd-stream", "gzip", "bz2"})
"""Codecs of shards read as a whole stream (their ``frame_offset`` is an offset in the decompressed tar)."""
