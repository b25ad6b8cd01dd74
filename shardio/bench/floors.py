"""The floors of ``shardio bench``: what decoding alone costs (soundfile, numpy, zstd) and what a pure-Python
loader doing only a batch's necessary work costs, each an
:class:`~shardio.bench.cases.Epoch` over the same corpus.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import struct
from collections.abc import Sequence

import numpy as np
import soundfile

from ..reading.memoryfile import FILE_FORMATS, read_as_file
from ..shards.index import Index
from ..shards.tarformat import parse_members
from ..storage.localshard import CAN_MAP
from .cases import Epoch

__all__ = [
    "memory_file_floor",
    "numpy_batch_floor",
    "numpy_floor",
    "pcm_layout",
    "python_floor",
    "soundfile_floor",
    "zstd_floor",
]

_MADV_POPULATE_READ = 22  # as shardio's reader faults a sample's pages in (Linux 5.14+)


def soundfile_floor(members: Sequence[tuple[str, bytes]]) -> Epoch:
    """The decoder floor: soundfile on each audio member's bytes, already in memory, in a tight loop."""

    def epoch() -> tuple[int, float]:
        seconds = 0.0
        for _ext, data in members:
            audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
            seconds += audio.shape[0] / rate
        return len(members), seconds

    return epoch


def memory_file_floor(members: Sequence[tuple[str, bytes]]) -> Epoch | None:
    """The decoder floor as shardio reads FLAC: soundfile on each member's bytes copied into a memory file
    (:mod:`shardio.reading.memoryfile`); None where the members are of other formats, or there is no memfd."""
    if (
        not members
        or any(ext not in FILE_FORMATS for ext, _data in members)
        or read_as_file(memoryview(members[0][1]), lambda sound: sound.read()) is None
    ):
        return None

    def epoch() -> tuple[int, float]:
        seconds = 0.0
        for _ext, data in members:
            decoded = read_as_file(
                memoryview(data),
                lambda sound: (sound.read(dtype="float32", always_2d=True), sound.samplerate),
            )
            assert decoded is not None, "a member the memory file read once no longer reads"
            seconds += decoded[0].shape[0] / decoded[1]
        return len(members), seconds

    return epoch


def pcm_layout(data: bytes | memoryview) -> tuple[int, int, int, int, int] | None:
    """``(data offset, frames, channels, rate, bits)`` of a PCM 16/32-bit or float32 WAV, else None."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    position, fmt = 12, None
    while position + 8 <= len(data):
        chunk, size = data[position : position + 4], struct.unpack_from("<I", data, position + 4)[0]
        if chunk == b"fmt ":
            fmt = struct.unpack_from("<HHIIHH", data, position + 8)
        elif chunk == b"data" and fmt is not None:
            tag, channels, rate, _, _, bits = fmt
            if (tag, bits) not in ((1, 16), (1, 32), (3, 32)):
                return None
            size = min(size, len(data) - position - 8)
            return (
                position + 8,
                size // (channels * bits // 8),
                channels,
                rate,
                bits * (1 if tag == 1 else -1),
            )
        position += 8 + size + (size & 1)
    return None


_PCM_KINDS = {
    16: ("<i2", np.float32(2.0**-15)),
    32: ("<i4", np.float32(2.0**-31)),
    -32: ("<f4", np.float32(1.0)),
}
"""``pcm_layout``'s signed bits -> (numpy dtype of the stored samples, scale to float32)."""


def _all_pcm(members: Sequence[tuple[str, bytes]]) -> bool:
    """Whether there are members and :func:`pcm_layout` reads every one (the raw floors apply)."""
    return bool(members) and all(pcm_layout(data) is not None for _ext, data in members)


def numpy_floor(members: Sequence[tuple[str, bytes]]) -> Epoch | None:
    """The raw floor for PCM WAV: header walk, ``frombuffer``, cast and scale to float32; no audio library."""
    if not _all_pcm(members):
        return None
    kinds = _PCM_KINDS

    def epoch() -> tuple[int, float]:
        seconds = 0.0
        for _ext, data in members:
            offset, frames, channels, rate, bits = pcm_layout(data)  # type: ignore[misc]
            dtype, scale = kinds[bits]
            audio = np.frombuffer(data, dtype, frames * channels, offset).astype(np.float32)
            audio *= scale
            audio = audio.reshape(frames, channels).T
            seconds += frames / rate
        return len(members), seconds

    return epoch


def numpy_batch_floor(members: Sequence[tuple[str, bytes]], batch_size: int) -> Epoch | None:
    """The raw floor of a loader that yields padded batches: as :func:`numpy_floor`, but each sample is cast
    into its row of a new zero-padded float32 ``(B, C, T)`` batch, which lives on
    (fresh memory, not cache)."""
    if not _all_pcm(members):
        return None
    kinds = _PCM_KINDS

    def epoch() -> tuple[int, float]:
        seconds, kept = 0.0, None
        for start in range(0, len(members), batch_size):
            chunk = [(data, pcm_layout(data)) for _ext, data in members[start : start + batch_size]]
            channels, longest = chunk[0][1][2], max(layout[1] for _, layout in chunk)  # type: ignore[index]
            batch = np.zeros((len(chunk), channels, longest), np.float32)
            for row, (data, layout) in enumerate(chunk):
                offset, frames, channels, rate, bits = layout  # type: ignore[misc]
                dtype, scale = kinds[bits]
                target = batch[row, :, :frames]
                np.copyto(
                    target,
                    np.frombuffer(data, dtype, frames * channels, offset).reshape(frames, channels).T,
                    casting="unsafe",
                )
                target *= scale
                seconds += frames / rate
            kept = batch  # the consumer holds the batch while the next one is made
        del kept
        return len(members), seconds

    return epoch


def zstd_floor(frames: Sequence[tuple[bytes, float]]) -> Epoch:
    """The decompression floor of a ``.tar.zst`` corpus: for each sample (``(frame, audio seconds)``), its
    zstd frame decompressed from memory with one reused context, as a reader with random access must. The
    floor of the whole ``.tar.zst`` path is this plus the ``.tar`` path (:mod:`shardio.bench.throughput`)."""
    import zstandard

    decompressor = zstandard.ZstdDecompressor()

    def epoch() -> tuple[int, float]:
        for frame, _seconds in frames:
            decompressor.decompress(frame)
        return len(frames), sum(seconds for _frame, seconds in frames)

    return epoch


def python_floor(directory: str, batch_size: int) -> Epoch | None:
    """The floor of a pure-Python loader over a dataset of PCM WAV (and JSON) samples in plain ``.tar``
    shards: in shuffled batches, each sample's bytes a view of its shard's memory map faulted in by one call,
    its tar members parsed (checksums included) and checked against its key, its JSON parsed and its WAV
    header read, its samples cast and scaled into its row of a reused zero-padded batch. No plan, no error
    handling, no fields but the keys, lengths, rates and JSON values: what shardio's checks cost
    in Python at the least."""
    index = Index.load(directory)
    if not CAN_MAP or set(index.formats) != {"wav"} or any(info.codec != "none" for info in index.shards):
        return None
    columns = index.columns
    shard_of, offset_of = columns["shard"].tolist(), columns["frame_offset"].tolist()
    size_of = columns["member_size"].tolist()
    maps = [_mapped(index.shard_path(shard)) for shard in range(len(index.shards))]
    views = [memoryview(mapped) for mapped in maps]
    keys = [index.key(sample) for sample in range(len(index))]
    longest = int(columns["num_frames"].max()) if len(index) else 0
    pool = np.empty(batch_size * int(columns["channels"].max(initial=1)) * longest, np.float32)
    kinds, rng = _PCM_KINDS, np.random.default_rng(0)

    def epoch() -> tuple[int, float]:
        seconds, order = 0.0, rng.permutation(len(keys)).tolist()
        for start in range(0, len(order), batch_size):
            chunk, read, fields = order[start : start + batch_size], [], []
            for sample in chunk:
                shard, offset, size = shard_of[sample], offset_of[sample], size_of[sample]
                page = offset - offset % mmap.PAGESIZE
                maps[shard].madvise(_MADV_POPULATE_READ, page, offset + size - page)
                read.append(views[shard][offset : offset + size])
            layouts = []
            for sample, data in zip(chunk, read):
                key, members = keys[sample], {}
                for name, member in parse_members(data, key):
                    if not name.startswith(key + "."):
                        raise ValueError(f"{key}: member {name!r}")
                    members[name[len(key) + 1 :]] = member
                fields.append(json.loads(bytes(members["json"])) if "json" in members else {})
                layout = pcm_layout(members["wav"])
                if layout is None:
                    raise ValueError(f"{key}: not a PCM WAV the floor reads")
                layouts.append((members["wav"], layout))
            channels, frames = layouts[0][1][2], max(layout[1] for _, layout in layouts)
            batch = pool[: len(chunk) * channels * frames].reshape(len(chunk), channels, frames)
            lengths, rates = [], []
            for row, (wav, layout) in enumerate(layouts):
                offset, count, channels, rate, bits = layout
                dtype, scale = kinds[bits]
                target = batch[row, :, :count]
                np.copyto(
                    target,
                    np.frombuffer(wav, dtype, count * channels, offset).reshape(count, channels).T,
                    casting="unsafe",
                )
                target *= scale
                batch[row, :, count:] = 0
                lengths.append(count)
                rates.append(rate)
                seconds += count / rate
            float(batch.reshape(-1)[::1024].sum())  # as the loaders' consumer touches each page
        return len(order), seconds

    return epoch


def _mapped(path: str) -> mmap.mmap:
    """The file at ``path``, mapped read-only (the map keeps a descriptor of its own)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(descriptor, 0, prot=mmap.PROT_READ)
    finally:
        os.close(descriptor)
