"""Where a ``.tar.zst`` shard's zstd frames lie, and whether its samples can be read frame by
frame (codec ``zstd``)."""

from __future__ import annotations

import os

import zstandard

from ..errors import FormatError, shown_path

__all__ = ["seekable_frames", "zstd_frames"]

_ZSTD_MAGIC = 0xFD2FB528
_SEEKABLE_FRAME = 4 << 20


def zstd_frames(path: str) -> list[tuple[int, int, int]] | None:
    """``(compressed offset, compressed size, decompressed size)`` of each zstd frame, or None when a frame
    does not record its decompressed size (then the shard can only be read as a stream)."""
    frames: list[tuple[int, int, int]] = []
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        offset = 0
        while offset < size:
            handle.seek(offset)
            head = handle.read(18)
            magic = int.from_bytes(head[:4], "little")
            if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
                offset += 8 + int.from_bytes(head[4:8], "little")
                continue
            if magic != _ZSTD_MAGIC:
                raise FormatError(f"{shown_path(path)}: not a zstd frame at offset {offset}")
            try:
                params = zstandard.get_frame_parameters(head)
                position = offset + zstandard.frame_header_size(head)
            except zstandard.ZstdError as exc:
                raise FormatError(
                    f"{shown_path(path)}: bad zstd frame header at offset {offset} ({exc})"
                ) from None
            if params.content_size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR):
                return None
            last = False
            while not last:
                if position + 3 > size:
                    raise FormatError(
                        f"{shown_path(path)}: zstd frame at offset {offset} runs past the end of the file"
                    )
                handle.seek(position)
                block = int.from_bytes(handle.read(3), "little")
                last, kind, block_size = bool(block & 1), (block >> 1) & 3, block >> 3
                position += 3 + (1 if kind == 1 else block_size)
            position += 4 if params.has_checksum else 0
            frames.append((offset, position - offset, params.content_size))
            offset = position
    return frames


def seekable_frames(
    frames: list[tuple[int, int, int]], spans: list[tuple[int, int]]
) -> list[tuple[int, int, int]] | None:
    """Per sample ``(frame offset, frame size, offset in the frame)`` when every sample lies in one frame and
    frames are small (one sample, or at most ``_SEEKABLE_FRAME`` bytes): a whole-shard frame is no index."""
    placed: list[tuple[int, int, int]] = []
    per_frame: dict[int, int] = {}
    number, frame_start = 0, 0
    for start, end in spans:
        while number < len(frames) and start >= frame_start + frames[number][2]:
            frame_start += frames[number][2]
            number += 1
        if number == len(frames) or end > frame_start + frames[number][2]:
            return None
        placed.append((frames[number][0], frames[number][1], start - frame_start))
        per_frame[number] = per_frame.get(number, 0) + 1
    if any(count > 1 and frames[number][2] > _SEEKABLE_FRAME for number, count in per_frame.items()):
        return None
    return placed
