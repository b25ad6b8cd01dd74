"""A FLAC file's structure checked without decoding it: the metadata blocks, the first and last frame
headers, and every frame's CRC-16.

A FLAC file is ``fLaC``, metadata blocks (the first a STREAMINFO: sample rate, channels, bits and the total
samples), then frames. Each frame ends with the CRC-16 of its bytes, so consecutive whole frames have the
CRC 0 (:mod:`shardio.packing.checksums`): one pass over everything after the metadata checks every frame, and
a cut anywhere in them. A frame does not say how long it is; a header does say its frame (or first sample's)
number and its block size, with a CRC-8. The first frame must start right after the metadata as frame 0, and
the last one (found from the end: a sync code, then fields whose CRC-8 matches) must end the stream at
STREAMINFO's total samples, which a cut at a frame boundary does not.

What this cannot see: whole frames lost, repeated or swapped between the first and the last (damage that
keeps every frame whole); the headers between them beyond their CRC-16; a frame whose CRCs were computed over
wrong bytes (an encoder's bug, not damage); the MD5 of the decoded samples (libsndfile does not check it
either). Only when the CRC fails are the frames walked one by one, to name the damaged one. A stream whose
STREAMINFO does not give its total is left to the decoder.
"""

from __future__ import annotations

import numpy as np

from .checksums import flac_crc8, flac_crc16
from .malformed import Malformed
from .mp3frames import id3v2_end

__all__ = ["flac_facts"]

_BITS = {1: 8, 2: 12, 4: 16, 5: 20, 6: 24, 7: 32}
_RATES = {1: 88200, 2: 176400, 3: 192000, 4: 8000, 5: 16000, 6: 22050, 7: 24000, 8: 32000, 9: 44100}
_RATES |= {10: 48000, 11: 96000}
_UTF8_LEADS = (0x80, 0xE0, 0xF0, 0xF8, 0xFC, 0xFE, 0xFF)  # below each: 0, 1, ... 6 continuation bytes
_DECODABLE_BITS = (8, 16, 24)  # what libsndfile reads; others are left to the decoder's verdict
_ID3V1 = 128
_CUT = "(an interrupted download or copy?)"
Info = tuple[int, int, int, int, int]  # max block size, rate, channels, bits, total samples


def flac_facts(view: memoryview) -> tuple[int, int, int] | None:
    """``(frames, sample rate, channels)`` of the FLAC file ``view``, checked as the module says; None where
    only a decoder can tell (a sample size libsndfile may not read). Raises :class:`Malformed` naming what is
    wrong."""
    position = id3v2_end(view)
    if bytes(view[position : position + 4]) != b"fLaC":
        raise Malformed("no fLaC signature where the FLAC stream should start")
    position += 4
    info: Info | None = None
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
    if not total:
        return None
    _check_frames(view, position, info)
    return total, rate, channels


def _streaminfo(block: memoryview) -> Info:
    """``(max block size, rate, channels, bits, total samples)`` of a STREAMINFO block."""
    fields = int.from_bytes(block[10:18], "big")  # rate 20 bits, channels-1 3, bits-1 5, total 36
    rate, channels, bits = fields >> 44, ((fields >> 41) & 7) + 1, ((fields >> 36) & 31) + 1
    max_block = int.from_bytes(block[2:4], "big")
    if rate == 0 or max_block < 16:
        raise Malformed(f"the FLAC STREAMINFO is invalid (sample rate {rate} Hz, block size {max_block})")
    return max_block, rate, channels, bits, fields & ((1 << 36) - 1)


def _check_frames(view: memoryview, first: int, info: Info) -> None:
    """The frames from ``first`` to the end: frame 0 first, their CRC-16, and the last one ending the stream
    at STREAMINFO's total."""
    max_block, _, channels, bits, total = info
    if len(view) == first:
        raise Malformed("the audio has no samples (0 frames); expected at least one frame")
    header = _frame_header(view, first, info)
    if header is None or header[0] != 0:
        raise Malformed("no valid FLAC frame header follows the metadata (damaged bytes?)")
    _, block, variable = header
    end = len(view)
    if flac_crc16(view[first:end]) != 0:
        if end - first > _ID3V1 and bytes(view[end - _ID3V1 : end - _ID3V1 + 3]) == b"TAG":
            end -= _ID3V1  # an ID3v1 tag after the last frame, as some taggers append
        if flac_crc16(view[first:end]) != 0:
            _name_damage(view, first, end, info)
    # the last frame starts within one uncoded (verbatim) frame of the end
    reach = max_block * channels * (bits + 1) // 8 + 64
    data = np.frombuffer(view, np.uint8)
    start = max(first, end - reach)
    syncs = np.flatnonzero(data[start : end - 1] == 0xFF) + start
    for position in syncs[(data[syncs + 1] & 0xFE) == 0xF8][::-1].tolist():
        header = _frame_header(view, position, info)
        if header is not None and header[2] == variable:
            number, last_block, _ = header
            if (number if variable else number * block) + last_block == total:
                return
    raise Malformed(
        f"truncated: the FLAC frames end before the {total} samples STREAMINFO says (a cut between "
        f"frames) {_CUT}"
    )


def _name_damage(view: memoryview, first: int, end: int, info: Info) -> None:
    """Raise :class:`Malformed` naming the first frame that fails its CRC-16: the frames walked one by one,
    each the next header (by its number) after the one before."""
    data = np.frombuffer(view, np.uint8)
    syncs = np.flatnonzero(data[first : end - 1] == 0xFF) + first
    starts: list[int] = []
    samples = 0
    variable = False
    for position in syncs[(data[syncs + 1] & 0xFE) == 0xF8].tolist():
        header = _frame_header(view, position, info)
        if header is None:
            continue
        number, block, is_variable = header
        if starts and (is_variable != variable or number != (samples if variable else len(starts))):
            continue  # sync bytes inside a frame, or a frame of another number
        variable = is_variable
        starts.append(position)
        samples += block
    for number, (start, stop) in enumerate(zip(starts, [*starts[1:], end], strict=True)):
        if flac_crc16(view[start:stop]) != 0:
            last = number == len(starts) - 1
            raise Malformed(
                f"FLAC frame {number} (at byte {start}) fails its CRC-16: damaged or lost bytes"
                + (", a cut inside it, or bytes after it that are no frame" if last else "")
            )
    raise Malformed("the FLAC frames fail their CRC-16 (damaged bytes)")


def _frame_header(view: memoryview, position: int, info: Info) -> tuple[int, int, bool] | None:
    """``(frame or sample number, block size, variable)`` of a valid frame header at ``position``, or None."""
    _, rate, channels, bits, _ = info
    head = bytes(view[position : position + 16])
    if len(head) < 6 or head[0] != 0xFF or head[1] & 0xFE != 0xF8 or head[3] & 1:
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
    number = lead & (0x7F >> extra)
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
