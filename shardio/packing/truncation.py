"""Truncated audio: files whose own header says they hold more than they do.

Decoders read a truncated file as a shorter clip without complaint, so a half-downloaded file would be
packed (and verified) as a short sample. Two headers say how long the audio is:

* a WAV's ``data`` chunk size (an RF64 or BW64 file's from its ``ds64`` chunk; a streaming writer's
  0xFFFFFFFF aside): the file must hold that many bytes after the chunk header;
* an MP3's Xing/Info header (LAME and most VBR encoders write one): its stream byte count must fit in the
  file, and its frame count must match what decodes, within the encoder's delay and padding;
* every Ogg page header (Vorbis, Opus) says how long its page is: the last page must be whole.

An MP3 without a Xing/Info header (plain CBR, or a VBRI header) cannot be checked this way.
"""

from __future__ import annotations

import struct

__all__ = ["truncation_problem"]

_STREAMING = 0xFFFFFFFF
# MPEG version bits -> sample rates; layer III samples per frame: 1152 for MPEG-1, 576 for MPEG-2 and 2.5
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_SLACK_FRAMES = 3  # MP3 frames of encoder delay and padding (LAME: 576 + 1105 samples, at most ~2 frames)


def truncation_problem(data: bytes | memoryview, ext: str, decoded_frames: int | None = None) -> str | None:
    """Why ``data`` (audio of extension ``ext``) is truncated, or None when its header claims no more than
    it holds. ``decoded_frames``: how many frames it decoded to (enables the MP3 frame-count check)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    ext = ext.lower().lstrip(".")
    if ext in ("wav", "wave"):
        return _wav(view)
    if ext == "mp3":
        return _mp3(view, decoded_frames)
    if ext in ("ogg", "oga", "opus"):
        return _ogg(view)
    return None


def _wav(view: memoryview) -> str | None:
    if len(view) < 12 or bytes(view[:4]) not in (b"RIFF", b"RF64", b"BW64") or bytes(view[8:12]) != b"WAVE":
        return None
    wide = bytes(view[:4]) != b"RIFF"
    ds64_data: int | None = None  # RF64/BW64: the data chunk's 64-bit size, from the ds64 chunk
    position = 12
    while position + 8 <= len(view):
        name = bytes(view[position : position + 4])
        (size,) = struct.unpack_from("<I", view, position + 4)
        if wide and name == b"ds64" and size >= 16 and position + 24 <= len(view):
            (ds64_data,) = struct.unpack_from("<Q", view, position + 16)
        if name == b"data":
            held = len(view) - position - 8
            if wide and size == _STREAMING:
                if ds64_data is None:
                    return None  # no ds64 before the data: nothing says how long it is
                size = ds64_data
            elif size == _STREAMING:
                return None
            if size > held:
                return (
                    f"truncated: the {'RF64 ds64' if wide else 'WAV data'} chunk claims {size} bytes of "
                    f"samples, the file holds {held} after the data chunk header (an interrupted download "
                    "or copy?)"
                )
            return None
        position += 8 + size + (size & 1)
    return None


def _mp3(view: memoryview, decoded_frames: int | None) -> str | None:
    start = 0
    if bytes(view[:3]) == b"ID3" and len(view) >= 10:  # ID3v2: a syncsafe size after a 10-byte header
        start = 10 + (
            (view[6] & 0x7F) << 21 | (view[7] & 0x7F) << 14 | (view[8] & 0x7F) << 7 | (view[9] & 0x7F)
        )
        start += 10 if view[5] & 0x10 else 0  # a footer
    if start + 4 > len(view) or view[start] != 0xFF or view[start + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (view[start + 1] >> 3) & 3, (view[start + 1] >> 1) & 3
    if version not in _RATES or layer != 1:  # layer III only
        return None
    mono = (view[start + 3] >> 6) == 3
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    tag = start + 4 + side
    if bytes(view[tag : tag + 4]) not in (b"Xing", b"Info") or tag + 16 > len(view):
        return None
    (flags,) = struct.unpack_from(">I", view, tag + 4)
    fields, position = {}, tag + 8
    for bit, name in ((1, "frames"), (2, "bytes")):
        if flags & bit:
            (fields[name],) = struct.unpack_from(">I", view, position)
            position += 4
    held = len(view) - start - (128 if bytes(view[-128:-125]) == b"TAG" else 0)
    if "bytes" in fields and fields["bytes"] > held:
        return (
            f"truncated: the MP3's {bytes(view[tag : tag + 4]).decode()} header claims {fields['bytes']} "
            f"bytes of frames, the file holds {held} (an interrupted download or copy?)"
        )
    if "frames" in fields and decoded_frames is not None:
        per_frame = 1152 if version == 3 else 576
        claimed = fields["frames"] * per_frame
        if decoded_frames < claimed - _SLACK_FRAMES * per_frame:
            return (
                f"truncated: the MP3's header claims {fields['frames']} MPEG frames (about {claimed} "
                f"samples), only {decoded_frames} samples decode (an interrupted download or copy?)"
            )
    return None


def _ogg(view: memoryview) -> str | None:
    position = 0
    while position < len(view):
        if bytes(view[position : position + 4]) != b"OggS":
            return None  # not a page (trailing bytes of another kind): nothing this check can say
        segments = view[position + 26] if position + 27 <= len(view) else None
        if segments is not None and position + 27 + segments <= len(view):
            size = 27 + segments + sum(view[position + 27 : position + 27 + segments])
        else:
            size = 27 + (segments or 0)
        if position + size > len(view):
            return (
                f"truncated: the Ogg page at byte {position} is cut short (it needs at least {size} bytes, "
                f"the file holds {len(view) - position} from there; an interrupted download or copy?)"
            )
        position += size
    return None
