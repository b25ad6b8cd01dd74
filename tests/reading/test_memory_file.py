"""FLAC members are decoded by libsndfile from a file in memory: the same batches as from the members' bytes
through ``io.BytesIO``, which decide wherever the file's read cannot vouch for its result (a stream cut short,
an error), messages included; each thread and each forked process writes a file of its own."""

from __future__ import annotations

import collections
import io
import multiprocessing
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import soundfile
import torch
from audio_factory import audio_bytes, tone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio import Decoding, ShardDataset, ShardWriter
from shardio.errors import DecodeError
from shardio.reading import memoryfile

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memory files are Linux's memfd")

RATE = 8000


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Counts the decodes each path gave: ``file`` (from a memory file) and ``bytes``
    (left to ``io.BytesIO``)."""
    counts: collections.Counter[str] = collections.Counter()
    read_as_file = memoryfile.read_as_file

    def counted(data: memoryview, read: Any) -> Any:
        result = read_as_file(data, read)
        counts["bytes" if result is None else "file"] += 1
        return result

    monkeypatch.setattr(memoryfile, "read_as_file", counted)
    yield counts


def _bytes_only(directory: Path, **options: Any) -> list[dict[str, Any]]:
    """The batches with every member decoded from its bytes through ``io.BytesIO`` (the path before)."""
    saved = memoryfile.read_as_file
    memoryfile.read_as_file = lambda data, read: None  # type: ignore[assignment]
    try:
        return list(ShardDataset(directory, **options))
    finally:
        memoryfile.read_as_file = saved


def _write(directory: Path, members: list[tuple[bytes, int]], channels: int) -> None:
    """A plain-shard dataset of FLAC members, each with the frame count given for the index."""
    with ShardWriter(directory, max_samples=3) as writer:
        for number, (data, frames) in enumerate(members):
            writer.write(
                f"k{number:02d}",
                {"flac": data, "txt": f"utterance {number}".encode()},
                audio_ext="flac",
                num_frames=frames,
                sample_rate=RATE,
                channels=channels,
            )


def _flac(seconds: float, channels: int, subtype: str, seed: int) -> bytes:
    return audio_bytes(tone(seconds, RATE, channels, seed=seed), RATE, "flac", subtype)


def _frames(data: bytes) -> int:
    return soundfile.info(io.BytesIO(data)).frames


def _same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> None:
    assert len(left) == len(right) > 0
    for a, b in zip(left, right):
        assert a.keys() == b.keys()
        for name, value in a.items():
            assert torch.equal(value, b[name]) if isinstance(value, torch.Tensor) else value == b[name], name


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    clips=st.lists(
        st.tuples(st.floats(0.01, 0.3), st.sampled_from(["PCM_16", "PCM_24"])), min_size=1, max_size=7
    ),
    channels=st.integers(1, 2),
    dtype=st.sampled_from(["float32", "int16"]),
    batch_size=st.integers(1, 4),
)
def test_flac_members_decode_from_a_memory_file_exactly_as_from_their_bytes(
    paths: collections.Counter[str],
    clips: list[tuple[float, str]],
    channels: int,
    dtype: str,
    batch_size: int,
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        data = [_flac(seconds, channels, subtype, seed) for seed, (seconds, subtype) in enumerate(clips)]
        _write(Path(directory), [(flac, _frames(flac)) for flac in data], channels)
        options = {"batch_size": batch_size, "seed": 3, "decoding": Decoding(dtype=dtype)}
        paths.clear()
        from_file = list(ShardDataset(directory, **options))
        assert paths["file"] >= len(data) and paths["bytes"] <= len(data)  # 24-bit members to int16: 2 tries
        _same(from_file, _bytes_only(Path(directory), **options))
        for batch in from_file:  # and as soundfile.read gives them
            for row, key in enumerate(batch["keys"]):
                number = int(key[1:])
                if dtype == "int16" and clips[number][1] != "PCM_16":
                    continue  # decoded as float32, then rounded (tests/reading/test_pcm16.py)
                expected, _ = soundfile.read(io.BytesIO(data[number]), dtype=dtype, always_2d=True)
                length = int(batch["lengths"][row])
                assert torch.equal(batch["audio"][row, :, :length], torch.from_numpy(expected.T.copy()))


def test_a_member_whose_header_disagrees_with_the_index_decodes_as_from_its_bytes(
    tmp_path: Path, paths: collections.Counter[str]
) -> None:
    data = [_flac(0.2, 1, "PCM_16", seed) for seed in range(4)]
    _write(
        tmp_path, [(flac, _frames(flac) + (7 if number == 2 else 0)) for number, flac in enumerate(data)], 1
    )
    batches = list(ShardDataset(tmp_path, batch_size=4))
    assert paths == {"file": 4}
    _same(batches, _bytes_only(tmp_path, batch_size=4))
    assert batches[0]["lengths"].tolist() == [_frames(flac) for flac in data]


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.999])
def test_a_stream_cut_short_fails_or_is_skipped_as_from_its_bytes(
    tmp_path: Path, paths: collections.Counter[str], cut: float
) -> None:
    """A FLAC file cut short, indexed with its header's frame count (as ``shardio index`` does), followed in
    its shard by whole ones (decoded from the shard file at its offset, it read on into the
    next member's frames)."""
    whole = [_flac(0.3, 1, "PCM_16", seed) for seed in range(3)]
    cut_short = whole[0][: int(len(whole[0]) * cut)]
    _write(tmp_path, [(cut_short, _frames(whole[0]))] + [(flac, _frames(flac)) for flac in whole[1:]], 1)
    with pytest.raises(DecodeError) as from_file:
        list(ShardDataset(tmp_path, batch_size=3))
    assert paths["bytes"] == 1
    with pytest.raises(DecodeError) as from_bytes:
        _bytes_only(tmp_path, batch_size=3)
    assert str(from_file.value) == str(from_bytes.value)
    assert "k00" in str(from_file.value) and "could not be decoded as flac audio" in str(from_file.value)
    skipping = {"batch_size": 3, "on_error": "skip"}
    _same(list(ShardDataset(tmp_path, **skipping)), _bytes_only(tmp_path, **skipping))


@pytest.mark.parametrize(
    "start_method", ["fork", "forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_workers_decode_as_the_training_process_does(tmp_path: Path, start_method: str) -> None:
    data = [_flac(0.1 + 0.02 * seed, 2 if seed % 2 else 1, "PCM_16", seed) for seed in range(12)]
    with ShardWriter(tmp_path, max_samples=3) as writer:
        for number, flac in enumerate(data):  # mono and stereo: the unbatched path
            writer.write(
                f"k{number:02d}",
                {"flac": flac},
                audio_ext="flac",
                num_frames=_frames(flac),
                sample_rate=RATE,
                channels=2 if number % 2 else 1,
            )
    in_process = sorted(
        (sample["key"], sample["audio"].numpy().tobytes()) for sample in ShardDataset(tmp_path)
    )
    loader = torch.utils.data.DataLoader(
        ShardDataset(tmp_path), batch_size=None, num_workers=2, multiprocessing_context=start_method
    )
    in_workers = sorted((sample["key"], sample["audio"].numpy().tobytes()) for sample in loader)
    assert in_workers == in_process and len(in_process) == len(data)


def _inode() -> int:
    fd = memoryfile._descriptor()
    assert fd is not None
    return os.fstat(fd).st_ino


def test_each_thread_and_each_forked_process_writes_a_file_of_its_own() -> None:
    mine = _inode()
    assert _inode() == mine  # kept for the next decode
    theirs: list[int] = []
    done = threading.Event()

    def other_thread() -> None:
        theirs.append(_inode())
        done.wait(60)  # its file stays open while the others are compared with it

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            child = pool.apply(_inode)
    finally:
        done.set()
        thread.join()
    assert len({mine, theirs[0], child}) == 3


def test_a_threads_file_is_closed_when_the_thread_ends() -> None:
    opened: list[tuple[int, int]] = []

    def decode() -> None:
        fd = memoryfile._descriptor()
        assert fd is not None
        opened.append((fd, os.fstat(fd).st_ino))

    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    fd, inode = opened[0]
    try:
        now = os.fstat(fd).st_ino
    except OSError:  # closed
        return
    assert now != inode, "the thread's memory file is still open"  # the number was taken again since


def test_a_file_that_held_a_long_recording_is_emptied_after_its_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memoryfile, "KEPT_BYTES", 2000)
    fd = memoryfile._descriptor()
    assert fd is not None
    short, long = _flac(0.05, 1, "PCM_16", 0), _flac(1.0, 1, "PCM_16", 1)
    assert len(short) < 2000 < len(long)
    for data, kept in ((short, len(short)), (long, 0)):
        decoded = memoryfile.read_as_file(memoryview(data), lambda sound: sound.read(dtype="float32"))
        assert decoded is not None and decoded.shape == (_frames(data),)
        assert os.fstat(fd).st_size == kept
