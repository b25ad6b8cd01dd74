"""The checksums audio containers carry, computed without a per-byte Python loop.

* FLAC's CRC-8 (polynomial 0x07) of each frame header: a table, over a dozen bytes a frame;
* FLAC's CRC-16 (polynomial 0x8005) of each frame: numpy, as a tree. A CRC with a zero initial value is
  linear, ``crc(A + B) = shift(crc(A), len(B)) ^ crc(B)``, and shifting a 16-bit remainder by ``2^k`` bytes is
  a fixed map of 65,536 entries; so the CRCs of 2-byte words (one table look-up each) are combined pairwise,
  halving the array at each level. A whole frame, its own CRC at its end, has the CRC 0; so do consecutive
  whole frames, so one pass checks all of a file's frames (a damaged frame leaves a non-zero remainder);
* Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0): :func:`zlib.crc32` (the reflected
  polynomial, initial value and final XOR 0xFFFFFFFF) over the bit-reversed bytes, its final XOR and initial
  value cancelled by the CRC of as many zero bytes, and the result bit-reversed.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

__all__ = ["CRC8_TABLE", "flac_crc8", "flac_crc16", "ogg_crc32"]


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
    if len(array) % 4:  # leading zero bytes leave a zero-initialised CRC as it is
        array = np.concatenate((np.zeros(-len(array) % 4, np.uint8), array))
    if not len(array):
        return 0
    tables = _shift_tables()
    # a 2-byte word w has the CRC w * x^16 mod P (w shifted by two bytes); a 4-byte one, its first word's
    # shifted by two more bytes, XOR its second word's
    words = array.view(">u4")
    remainders = np.take(_word_pairs(), words >> 16)
    remainders ^= np.take(tables[0], words & 0xFFFF)
    level = 1  # combining blocks of 4 bytes: the left one shifted by 4 bytes
    while len(remainders) > 1:
        if len(remainders) & 1:
            remainders = np.concatenate((np.zeros(1, np.uint16), remainders))
        remainders = np.take(tables[level], remainders[0::2]) ^ remainders[1::2]
        level += 1
    return int(remainders[0])


@functools.cache
def _word_pairs() -> np.ndarray:
    """The CRC of a 2-byte word followed by two zero bytes."""
    tables = _shift_tables()
    return tables[0][tables[0]]


def ogg_crc32(page: bytes | bytearray | memoryview) -> int:
    """The CRC-32 of an Ogg page as its header stores it (``page`` with its CRC field zeroed)."""
    data = bytes(page)
    reflected = zlib.crc32(data.translate(_REVERSED_BITS)) ^ zlib.crc32(bytes(len(data)))
    return int(f"{reflected:032b}"[::-1], 2)
