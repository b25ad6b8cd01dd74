"""IndexBuilder: an :class:`~shardio.Index` accumulated shard by shard and sample by
sample, in write order."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import OptionError
from .index import COLUMNS, Index, ShardInfo
from .keys import Keys
from .metadata import Metadata

__all__ = ["IndexBuilder"]


class IndexBuilder:
    """Accumulates shards and samples in write order, then makes an :class:`Index`."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.shards: list[ShardInfo] = []
        self.formats: list[str] = []
        self._rows: dict[str, list[int]] = {name: [] for name in COLUMNS}
        self._keys: list[str] = []
        self._meta: list[dict[str, Any]] | None = None

    def format_id(self, ext: str) -> int:
        """The number of audio format ``ext`` in this index's format table."""
        if ext not in self.formats:
            if len(self.formats) >= 255:
                raise OptionError("more than 255 distinct audio formats in one dataset")
            self.formats.append(ext)
        return self.formats.index(ext)

    def add_sample(
        self,
        key: str,
        *,
        shard: int,
        frame_offset: int,
        frame_size: int,
        member_offset: int,
        member_size: int,
        num_frames: int,
        sample_rate: int,
        channels: int,
        audio_ext: str,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Record one sample of shard number ``shard`` (shards are numbered in the order they are added);
        ``meta``: metadata for the index to keep (given for one sample, the index keeps it for all)."""
        if meta is not None and self._meta is None:
            self._meta = [{} for _ in self._keys]
        if self._meta is not None:
            self._meta.append(meta or {})
        values = dict(
            shard=shard,
            frame_offset=frame_offset,
            frame_size=frame_size,
            member_offset=member_offset,
            member_size=member_size,
            num_frames=num_frames,
            sample_rate=sample_rate,
            channels=channels,
            format=self.format_id(audio_ext),
        )
        for name, value in values.items():
            self._rows[name].append(value)
        self._keys.append(key)

    def add_shard(self, info: ShardInfo) -> int:
        """Record a finished shard; returns its number."""
        self.shards.append(info)
        return len(self.shards) - 1

    def build(self) -> Index:
        """The finished index (not yet saved)."""
        columns: dict[str, np.ndarray] = {
            name: np.asarray(values, dtype=COLUMNS[name]) for name, values in self._rows.items()
        }
        index = Index(
            root=self.root,
            shards=list(self.shards),
            formats=list(self.formats),
            columns=columns,
            _keys=Keys.of(self._keys),
            _meta=None if self._meta is None else Metadata.of(self._meta, self.root),
        )
        index.validate(self.root)
        return index
