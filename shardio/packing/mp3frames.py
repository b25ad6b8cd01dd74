"""An MP3 file's frames checked without decoding: after any ID3v2 tag, frame headers that follow each other
to the end of the file (or to an ID3v1 or APEv2 tag there), each at the offset its predecessor's header says.

A frame header says how long its frame is, so a cut or lost bytes break the chain; flipped bits inside a
frame's audio do not (MP3's optional CRC covers only part of a frame, and is not checked here). A free-format
stream (no bit rate in its headers) is left to the decoder.
"""

from __future__ import annotations

from .malformed import Malformed

__all__ = ["check_mp3_frames", "id3v2_end"]

# kbit/s by (MPEG-1?, layer) for bit-rate indexes 1..14; MPEG-2 and 2.5 share theirs
_BITRATES = {
    (True, 3): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 1): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 3): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 1): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_ID3V1 = 128
_CUT = "(an interrupted download or copy?)"


def id3v2_end(view: memoryview) -> int:
    """Where the audio starts: after an ID3v2 tag (and its footer), else 0."""
    if bytes(view[:3]) != b"ID3" or len(view) < 10:
        return 0
    size = (view[6] & 0x7F) << 21 | (view[7] & 0x7F) << 14 | (view[8] & 0x7F) << 7 | (view[9] & 0x7F)
    return 10 + size + (10 if view[5] & 0x10 else 0)


def check_mp3_frames(view: memoryview) -> None:
    """Raise :class:`Malformed` where the MP3 file ``view`` breaks its chain of frames."""
    position, end = id3v2_end(view), _audio_end(view)
    frames = 0
    while position + 4 <= end:
        header = int.from_bytes(view[position : position + 4], "big")
        size = _frame_size(header)
        if size is None:
            if frames:
                raise Malformed(
                    f"the MP3 frames break off at byte {position}, after {frames} frames (damaged, lost or "
                    "extra bytes)"
                )
            raise Malformed("no MPEG audio frame header where the MP3 audio should start")
        if size == 0:
            return  # free format: the decoder finds its frames
        position += size
        frames += 1
    if position > end:
        raise Malformed(f"truncated: the last MP3 frame is cut short {_CUT}")
    if frames == 0:
        raise Malformed("the MP3 file holds no frame")
    if position < end:
        raise Malformed(f"{end - position} bytes after the last MP3 frame are no frame")


def _audio_end(view: memoryview) -> int:
    """Where the frames end: before an ID3v1 tag and an APEv2 tag at the file's end, if any."""
    end = len(view)
    if end >= _ID3V1 and bytes(view[end - _ID3V1 : end - _ID3V1 + 3]) == b"TAG":
        end -= _ID3V1
    if end >= 32 and bytes(view[end - 32 : end - 24]) == b"APETAGEX":  # an APEv2 footer: its size after
        tag = int.from_bytes(view[end - 20 : end - 16], "little")
        header = 32 if view[end - 9] & 0x80 else 0
        end = max(0, end - tag - header)
    return end


def _frame_size(header: int) -> int | None:
    """The bytes of the frame whose 32-bit header is ``header`` (0: free format), None if it is no header."""
    if header >> 21 != 0x7FF:
        return None
    version, layer = (header >> 19) & 3, (header >> 17) & 3
    bitrate_index, rate_index, padding = (header >> 12) & 15, (header >> 10) & 3, (header >> 9) & 1
    if version == 1 or layer == 0 or bitrate_index == 15 or rate_index == 3:
        return None
    if bitrate_index == 0:
        return 0
    mpeg1 = version == 3
    bitrate = _BITRATES[(mpeg1, layer)][bitrate_index - 1] * 1000
    rate = _RATES[version][rate_index]
    if layer == 3:  # layer I: 4-byte slots
        return (12 * bitrate // rate + padding) * 4
    per_frame = 144 if mpeg1 or layer == 2 else 72
    return per_frame * bitrate // rate + padding
