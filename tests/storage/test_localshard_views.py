"""A batch's ranges of one local shard at once (``LocalShard.views``): the bytes of each range, a range past
the end a ``FormatError``, a changed file a ``ShardChanged``, and none from a closed shard."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shardio.errors import FormatError, ShardChanged
from shardio.storage.localshard import CAN_MAP, LocalShard, open_regular

DATA = bytes(range(256)) * 64

pytestmark = pytest.mark.skipif(not CAN_MAP, reason="local shards are read with pread here, not mapped")


def _shard(tmp_path: Path, unchanged_since: int | None = None) -> tuple[Path, LocalShard]:
    path = tmp_path / "shard.tar"
    path.write_bytes(DATA)
    fd, size = open_regular(str(path))
    return path, LocalShard(fd, size, unchanged_since)


def test_the_views_are_the_ranges(tmp_path: Path) -> None:
    _, shard = _shard(tmp_path)
    views = shard.views([0, 100, 5000, 100], [10, 300, 1000, 0], "shard")
    assert views is not None
    assert [bytes(view) for view in views] == [DATA[:10], DATA[100:400], DATA[5000:6000], b""]
    shard.close()
    assert shard.closed and shard.views([0], [10], "shard") is None


def test_a_range_past_the_end_is_a_format_error(tmp_path: Path) -> None:
    _, shard = _shard(tmp_path)
    with pytest.raises(FormatError, match="wanted 10 bytes at offset 16380"):
        shard.views([0, len(DATA) - 4], [10, 10], "shard")


def test_the_views_of_a_changed_shard_are_refused(tmp_path: Path) -> None:
    path, shard = _shard(tmp_path, unchanged_since=time.time_ns())
    time.sleep(0.05)  # file times tick every few milliseconds
    os.chmod(path, 0o600)
    with pytest.raises(ShardChanged, match="shard: the local shard file changed"):
        shard.views([0], [10], "shard")
