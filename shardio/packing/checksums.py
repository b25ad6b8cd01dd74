"""The checksums audio containers carry, computed by fastcrc (a compiled CRC library) in one call each.

* FLAC's CRC-8 of each frame header: CRC-8/SMBUS (polynomial 0x07, initial value 0, not reflected);
* FLAC's CRC-16 of each frame: CRC-16/UMTS, a.k.a. BUYPASS (polynomial 0x8005, initial value 0, not
  reflected). With a zero initial value and no final XOR, a whole frame, its own CRC at its end, has the
  CRC 0; so do consecutive whole frames, so one call checks all of a file's frames (a damaged frame leaves a
  non-zero remainder);
* Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0, no final XOR): CRC-32/CKSUM, the same
  but for its final XOR of 0xFFFFFFFF, undone here.
"""

from __future__ import annotations

from fastcrc import crc8, crc16, crc32

__all__ = ["flac_crc8", "flac_crc16", "ogg_crc32"]


def flac_crc8(data: bytes | memoryview) -> int:
    """The CRC-8 of a FLAC frame header (``data``: the header up to, not including, its CRC byte)."""
    return crc8.smbus(data)


def flac_crc16(data: bytes | memoryview) -> int:
    """The CRC-16 of ``data`` as FLAC computes it for a frame (initial value 0): 0 for whole frames."""
    return crc16.umts(data)


def ogg_crc32(page: bytes | bytearray | memoryview) -> int:
    """The CRC-32 of an Ogg page as its header stores it (``page`` with its CRC field zeroed)."""
    return crc32.cksum(page) ^ 0xFFFFFFFF
