"""The checksums audio containers carry, computed without a per-byte Python loop.

* FLAC's CRC-8 (polynomial 0x07) of each frame header: a table, over a dozen bytes a frame;
* FLAC's CRC-16 (polynomial 0x8005) of each frame: numpy, in lanes. A CRC with a zero initial value is linear,
  ``crc(A + B) = shift(crc(A), len(B)) ^ crc(B)``, and shifting a 16-bit remainder by 2 or ``2^k`` bytes is a
  fixed map of 65,536 entries. The bytes are cut into lanes of 32; every lane's CRC advances by a 2-byte word
  at once (one table look-up for all lanes), then the lanes' CRCs are combined pairwise, halving their number
  at each level. A whole frame, its own CRC at its end, has the CRC 0; so do consecutive whole frames, so one
  pass checks all of a file's frames (a damaged frame leaves a non-zero remainder);
* Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0): :func:`zlib.crc32` (the reflected
  polynomial, initial value and final XOR 0xFFFFFFFF) over the bit-reversed bytes, its final XOR and initial
  value cancelled by the CRC of as many zero bytes, and the result bit-reversed.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

__all__ = ["CRC8_TABLE", "flac_crc8", "flac_crc16", "ogg_crc32"]

_LANE = 32  # bytes of each lane of the CRC-16 (a power of two): 3x as fast as combining 4-byte words pairwise


def _crc8_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        table.append(crc)
    return tuple(table)


CRC8_TABLE = _crc8_table()
"""FLAC's CRC-8 of one byte, by the byte XOR the CRC so far."""
_REVERSED_BITS = bytes(int(f"{byte:08b}"[::-1], 2) for byte in range(256))


def flac_crc8(data: bytes | memoryview) -> int:
    """The CRC-8 of a FLAC frame header (``data``: the header up to, not including, its CRC byte)."""
    crc = 0
    for byte in bytes(data):
        crc = CRC8_TABLE[crc ^ byte]
    return crc


@functools.cache
def _shift_tables() -> list[np.ndarray]:
    """``tables[k][r]``: the 16-bit remainder ``r`` shifted by ``2^(k+1)`` bytes (times x^(16 2^k) mod P)."""
    low = np.arange(256, dtype=np.uint32)
    crc = low << 8
    for _ in range(8):
        crc = np.where(crc & 0x8000, (crc << 1) ^ 0x8005, crc << 1) & 0xFFFF
    byte_shift = crc.astype(np.uint16)  # a remainder's high byte shifted out by one byte
    words = np.arange(65536, dtype=np.uint32)
    # shifting by one byte: (r << 8) & 0xFFFF, with its high byte's contribution; twice makes two bytes
    once = ((words << 8) & 0xFFFF) ^ byte_shift[words >> 8]
    twice = once[once]
    tables = [twice.astype(np.uint16)]
    for _ in range(40):  # 2^41 bytes: more than any file
        tables.append(tables[-1][tables[-1]])
    return tables


def flac_crc16(data: bytes | memoryview) -> int:
    """The CRC-16 of ``data`` as FLAC computes it for a frame (initial value 0): 0 for whole frames."""
    array = np.frombuffer(data, dtype=np.uint8)
    if len(array) % _LANE:  # leading zero bytes leave a zero-initialised CRC as it is
        array = np.concatenate((np.zeros(-len(array) % _LANE, np.uint8), array))
    if not len(array):
        return 0
    tables = _shift_tables()
    # each lane's CRC, a 2-byte word at a time for all lanes at once: r' = (r ^ w) * x^16 mod P
    words = array.reshape(-1, _LANE).view(">u2").T.astype(np.uint16)
    remainders = np.zeros(words.shape[1], np.uint16)
    for column in words:
        remainders = np.take(tables[0], remainders ^ column)
    level = _LANE.bit_length() - 2  # combining lanes: the left one shifted by _LANE bytes
    while len(remainders) > 1:
        if len(remainders) & 1:
            remainders = np.concatenate((np.zeros(1, np.uint16), remainders))
        remainders = np.take(tables[level], remainders[0::2]) ^ remainders[1::2]
        level += 1
    return int(remainders[0])


def ogg_crc32(page: bytes | bytearray | memoryview) -> int:
    """The CRC-32 of an Ogg page as its header stores it (``page`` with its CRC field zeroed)."""
    data = bytes(page)
    reflected = zlib.crc32(data.translate(_REVERSED_BITS)) ^ zlib.crc32(bytes(len(data)))
    return int(f"{reflected:032b}"[::-1], 2)
