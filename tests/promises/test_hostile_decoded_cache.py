"""Hostile decoded caches: whatever the cache directory holds (FIFOs, links out, directories and garbage named
like segments, headers that claim more bytes than there are, entries out of range, a secret that is a link, a
directory others may write), reading goes on and every batch is the one read without the cache: a cache is
distrusted, never trusted to change a batch, and nothing in it makes shardio hang, read outside it or crash.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from shardio import Reading, ShardDataset
from shardio.reading.decodedcache import namespace
from shardio.shards.index import Index
from shardio.storage.segments import HEADER
from tests.reading.test_decoded_cache import assert_identical, batches, make_corpus

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("hostile_dc"), "flac", count=10)


def _space(corpus: Path, cache: Path) -> Path:
    from shardio import Decoding

    return cache / namespace(Index.load(corpus), Decoding())


def _fifo(space: Path) -> None:
    os.mkfifo(space / "pipe.seg")


def _link_out(space: Path) -> None:
    outside = space.parent.parent / "outside.seg"
    outside.write_bytes(HEADER.pack(b"SDC1", 0, 0, 4, 0) + b"abcd")
    (space / "link.seg").symlink_to(outside)


def _directory(space: Path) -> None:
    (space / "folder.seg").mkdir()


def _garbage(space: Path) -> None:
    (space / "garbage.seg").write_bytes(os.urandom(100_000))


def _huge_claim(space: Path) -> None:
    (space / "huge.seg").write_bytes(HEADER.pack(b"SDC1", 1, 0, 1 << 60, 0) + b"x" * 100)


def _out_of_range(space: Path) -> None:
    (space / "range.seg").write_bytes(HEADER.pack(b"SDC1", 1 << 40, 0, 8, 0) + b"x" * 8)


def _forged(space: Path) -> None:
    # entries for every sample, well formed but not written with this cache's secret
    with open(space / "forged.seg", "wb") as out:
        for number in range(10):
            meta = 0 | (1 << 8) | (8000 << 24)
            out.write(HEADER.pack(b"SDC1", number, meta, 400, 0) + struct.pack("<200h", *range(200)))


def _secret_link(space: Path) -> None:
    target = space.parent.parent / "my-secret"
    target.write_bytes(b"0123456789abcdef")
    os.chmod(target, 0o600)
    os.unlink(space.parent / "secret")
    (space.parent / "secret").symlink_to(target)


def _shared_directory(space: Path) -> None:
    os.chmod(space.parent, 0o777)


def _space_link(space: Path) -> None:
    elsewhere = space.parent.parent / "elsewhere"
    elsewhere.mkdir()
    for name in os.listdir(space):
        os.unlink(space / name)
    space.rmdir()
    space.symlink_to(elsewhere)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "link out": _link_out,
    "directory": _directory,
    "garbage": _garbage,
    "huge claim": _huge_claim,
    "out of range": _out_of_range,
    "forged": _forged,
    "secret link": _secret_link,
    "shared directory": _shared_directory,
    "namespace link": _space_link,
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_cache_changes_no_batch(corpus: Path, tmp_path: Path, case: str) -> None:
    plain = batches(corpus)
    cache = tmp_path / "cache" / "decoded"
    reading = Reading(decoded_cache=str(cache))
    dataset = ShardDataset(corpus, batch_size=4, seed=3, reading=reading)
    list(dataset)  # made and filled by this user
    assert dataset._decoded is not None
    dataset._decoded.close()
    HOSTILE[case](_space(corpus, cache))
    assert_identical(plain, batches(corpus, reading=reading))
    assert (tmp_path / "cache").exists()
    if case == "link out":
        assert (tmp_path / "cache" / "outside.seg").exists()  # never followed, never removed
