"""An Ogg file's pages checked without decoding: each page whole, its CRC-32 matching its bytes, the pages of
each logical stream numbered without a gap, and each stream closed by its end-of-stream page.

libogg drops a page whose CRC does not match without an error, so a decoder reads a damaged Ogg file as a
shorter clip; this check finds it. A file cut at a page boundary lacks its end-of-stream page.
"""

from __future__ import annotations

import struct

from .checksums import ogg_crc32
from .malformed import Malformed

__all__ = ["check_ogg_pages"]

_END_OF_STREAM = 0x04
_CUT = "(an interrupted download or copy?)"


def check_ogg_pages(view: memoryview) -> None:
    """Raise :class:`Malformed` naming the first page of the Ogg file ``view`` that breaks the rules above."""
    position = 0
    next_page: dict[int, int] = {}  # serial number -> the next page's sequence number
    ended: set[int] = set()
    while position < len(view):
        if bytes(view[position : position + 4]) != b"OggS":
            where = "where the Ogg stream should start" if not position else f"at byte {position}"
            raise Malformed(f"no Ogg page {where} (damaged bytes, or bytes after the last page)")
        if position + 27 > len(view):
            raise Malformed(f"truncated: the Ogg page at byte {position} is cut short {_CUT}")
        if view[position + 4] != 0:
            raise Malformed(f"the Ogg page at byte {position} has the unknown version {view[position + 4]}")
        flags = view[position + 5]
        serial, sequence, stored = struct.unpack_from("<III", view, position + 14)
        segments = view[position + 26]
        table = position + 27
        size = 27 + segments + (sum(view[table : table + segments]) if table + segments <= len(view) else 0)
        if table + segments > len(view) or position + size > len(view):
            raise Malformed(
                f"truncated: the Ogg page at byte {position} is cut short (it needs {size} bytes, the file "
                f"holds {len(view) - position} from there) {_CUT}"
            )
        page = bytearray(view[position : position + size])
        page[22:26] = bytes(4)
        if ogg_crc32(page) != stored:
            raise Malformed(f"the Ogg page at byte {position} fails its CRC-32 (damaged bytes)")
        expected = next_page.get(serial)
        if serial in ended or (expected is not None and sequence != expected):
            raise Malformed(
                f"Ogg page {expected} of a stream is missing: page {sequence} follows (damaged or lost bytes)"
                if serial not in ended
                else f"the Ogg page at byte {position} follows its stream's end-of-stream page"
            )
        next_page[serial] = sequence + 1
        if flags & _END_OF_STREAM:
            ended.add(serial)
        position += size
    if not next_page:
        raise Malformed("the Ogg file holds no page")
    if set(next_page) - ended:
        raise Malformed(f"truncated: an Ogg stream ends without its end-of-stream page {_CUT}")
