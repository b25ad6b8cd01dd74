"""A FLAC file's structure checked without decoding it: the metadata blocks, every frame header and every
frame's CRC-16.

A FLAC file is ``fLaC``, metadata blocks (the first a STREAMINFO: sample rate, channels, bits and the total
samples), then frames. A frame does not say how long it is, so the frames are found by their headers: the
14-bit sync code (found with numpy), then fields whose CRC-8 must match and whose frame (or sample) number
must be the next one. The chain must start right after the metadata, its block sizes must add up to
STREAMINFO's total, and the CRC-16 of all frame bytes must be 0 (each whole frame ends with its own CRC-16,
so consecutive whole frames have the CRC 0: :mod:`shardio.packing.checksums`). What this cannot see: a frame
whose bytes are wrong but whose CRCs were computed over the wrong bytes (an encoder's bug, not damage), and
the MD5 of the decoded samples (which libsndfile does not check either).
"""

from __future__ import annotations

import numpy as np

from .checksums import flac_crc8, flac_crc16
from .malformed import Malformed
from .mp3frames import id3v2_end

__all__ = ["flac_facts"]

_RATES = dict(enumerate((88200, 176400, 192000, 8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000), 1))
_BITS = {1: 8, 2: 12, 4: 16, 5: 20, 6: 24, 7: 32}
_DECODABLE_BITS = (8, 16, 24)  # what libsndfile reads; others are left to the decoder's verdict
_ID3V1 = 128
_UTF8_LEADS = (0x80, 0xE0, 0xF0, 0xF8, 0xFC, 0xFE, 0xFF)  # below each: 0, 1, ... 6 continuation bytes


def flac_facts(view: memoryview) -> tuple[int, int, int] | None:
    """``(frames, sample rate, channels)`` of the FLAC file ``view``, checked as the module says; None where
    only a decoder can tell (a sample size libsndfile may not read). Raises :class:`Malformed` naming what is
    wrong."""
    position = id3v2_end(view)
    if bytes(view[position : position + 4]) != b"fLaC":
        raise Malformed("no fLaC signature where the FLAC stream should start")
    position += 4
    info: tuple[int, int, int, int, int] | None = None
    last = False
    while not last:
        if position + 4 > len(view):
            raise Malformed("truncated: the file ends in the FLAC metadata (an interrupted download?)")
        last, kind = bool(view[position] & 0x80), view[position] & 0x7F
        length = int.from_bytes(view[position + 1 : position + 4], "big")
        body = position + 4
        if info is None and (kind != 0 or length != 34):
            raise Malformed("the first FLAC metadata block is not a STREAMINFO block (damaged bytes?)")
        if body + length > len(view):
            raise Malformed(
                f"a FLAC metadata block claims {length} bytes, the file holds {len(view) - body} from there "
                "(cut short, or damaged bytes)"
            )
        if info is None:
            info = _streaminfo(view[body : body + 34])
        elif kind == 127:
            raise Malformed("a FLAC metadata block of the invalid type 127")
        position = body + length
    assert info is not None
    _, rate, channels, bits, total = info
    if bits not in _DECODABLE_BITS:
        return None
    samples = _frame_chain(view, position, info)
    if samples == 0:
        raise Malformed("the audio has no samples (0 frames); expected at least one frame")
    if total and samples != total:
        raise Malformed(
            f"{'truncated: ' if samples < total else ''}the FLAC STREAMINFO says {total} samples, its frames "
            f"hold {samples}" + (" (an interrupted download or copy?)" if samples < total else "")
        )
    return samples, rate, channels


def _streaminfo(block: memoryview) -> tuple[int, int, int, int, int]:
    """``(max block size, rate, channels, bits, total samples)`` of a STREAMINFO block."""
    fields = int.from_bytes(block[10:18], "big")  # rate 20 bits, channels-1 3, bits-1 5, total 36
    rate, channels, bits = fields >> 44, ((fields >> 41) & 7) + 1, ((fields >> 36) & 31) + 1
    max_block = int.from_bytes(block[2:4], "big")
    if rate == 0 or max_block < 16:
        raise Malformed(f"the FLAC STREAMINFO is invalid (sample rate {rate} Hz, block size {max_block})")
    return max_block, rate, channels, bits, fields & ((1 << 36) - 1)


def _frame_chain(view: memoryview, first: int, info: tuple[int, int, int, int, int]) -> int:
    """The samples of the frames from ``first`` to the end, each found and checked as the module says."""
    region = np.frombuffer(view, np.uint8, offset=first)
    syncs = np.flatnonzero(region[:-1] == 0xFF)
    syncs = syncs[(region[syncs + 1] & 0xFE) == 0xF8] + first
    starts: list[int] = []
    blocks: list[int] = []
    variable = False
    samples = 0
    for position in syncs.tolist():
        header = _frame_header(view, position, info)
        if header is None:
            continue
        number, block, is_variable = header
        if not starts:
            if number != 0:
                continue
            if position != first:
                raise Malformed(f"{position - first} bytes that are no FLAC frame follow the metadata")
            variable = is_variable
        elif is_variable != variable or number != (samples if variable else len(starts)):
            continue  # sync bytes inside a frame, or a frame of another number (missing ones show below)
        starts.append(position)
        blocks.append(block)
        samples += block
    if not starts:
        if len(region):
            raise Malformed("no valid FLAC frame header follows the metadata (damaged bytes?)")
        return 0
    if not variable and any(block != blocks[0] for block in blocks[:-1]):
        raise Malformed("the frames of a fixed-block-size FLAC stream have different block sizes")
    _check_crc16(view, starts)
    return samples


def _frame_header(
    view: memoryview, position: int, info: tuple[int, int, int, int, int]
) -> tuple[int, int, bool] | None:
    """``(frame or sample number, block size, variable)`` of a valid frame header at ``position``, or None."""
    _, rate, channels, bits, _ = info
    head = bytes(view[position : position + 16])
    if len(head) < 6 or head[3] & 1:
        return None
    block_code, rate_code = head[2] >> 4, head[2] & 15
    channel_code, bits_code = head[3] >> 4, (head[3] >> 1) & 7
    if block_code == 0 or rate_code == 15 or channel_code > 10 or bits_code == 3:
        return None
    if (channel_code + 1 if channel_code < 8 else 2) != channels or (bits_code and _BITS[bits_code] != bits):
        return None
    lead = head[4]  # the number, coded as UTF-8 is (1 to 7 bytes)
    extra = next((count for count, top in enumerate(_UTF8_LEADS) if lead < top), -1)
    if extra < 0 or 0x80 <= lead < 0xC0:
        return None
    number = lead & (0x7F >> extra if extra else 0x7F)
    for byte in head[5 : 5 + extra]:
        if byte & 0xC0 != 0x80:
            return None
        number = number << 6 | (byte & 0x3F)
    cursor = 5 + extra
    if block_code in (6, 7):
        size = 1 if block_code == 6 else 2
        block = int.from_bytes(head[cursor : cursor + size], "big") + 1
        cursor += size
    else:
        block = 192 if block_code == 1 else 576 << (block_code - 2) if block_code < 6 else 1 << block_code
    if rate_code >= 12:
        size = 1 if rate_code == 12 else 2
        coded = int.from_bytes(head[cursor : cursor + size], "big")
        cursor += size
        if (coded * 1000 if rate_code == 12 else coded * 10 if rate_code == 14 else coded) != rate:
            return None
    elif rate_code and _RATES.get(rate_code) != rate:
        return None
    if cursor >= len(head) or flac_crc8(head[:cursor]) != head[cursor]:
        return None
    return number, block, bool(head[1] & 1)


def _check_crc16(view: memoryview, starts: list[int]) -> None:
    """Every frame's CRC-16 matches: one pass over all of them, and frame by frame only when it fails."""
    end = len(view)
    if flac_crc16(view[starts[0] : end]) == 0:
        return
    if end - starts[0] > _ID3V1 and bytes(view[end - _ID3V1 : end - _ID3V1 + 3]) == b"TAG":
        end -= _ID3V1  # an ID3v1 tag after the last frame, as some taggers append
        if flac_crc16(view[starts[0] : end]) == 0:
            return
    for number, (start, stop) in enumerate(zip(starts, [*starts[1:], end], strict=True)):
        if flac_crc16(view[start:stop]) != 0:
            last = number == len(starts) - 1
            raise Malformed(
                f"FLAC frame {number} (at byte {start}) fails its CRC-16: damaged bytes"
                + (", a cut inside it, or bytes after it that are no frame" if last else "")
            )
