"""Pack's validation levels, and the one that reads no sample: a file's container checked from its structure,
sizes and checksums, its frames, rate and channels taken from its headers where they are exact.

* ``structure`` (the default): FLAC's metadata, its first and last frame headers and the CRC-16 of every frame
  (:mod:`shardio.packing.flacframes`); a WAV's chunks, its data chunk held whole by the file, and float
  samples finite (the loader's own header parser, :func:`shardio.reading.wav.wav_layout`); every Ogg page's
  CRC-32 and sequence (:mod:`shardio.packing.oggpages`); an MP3's chain of frame headers
  (:mod:`shardio.packing.mp3frames`). MP3 and Ogg are decoded as well (no header of theirs gives the decoder's
  exact sample count), and so is any file these checks leave to a decoder (a WAV the loader's fast path does
  not take, a FLAC of a sample size libsndfile may not read or whose STREAMINFO gives no total);
* ``decode``: the same checks, then every file decoded by the loader's decoder, which must agree with the
  headers.
"""

from __future__ import annotations

import numpy as np

from ..errors import OptionError
from ..reading.wav import wav_layout
from .flacframes import flac_facts
from .malformed import Malformed
from .mp3frames import check_mp3_frames
from .oggpages import check_ogg_pages
from .truncation import truncation_problem

__all__ = ["DEFAULT_VALIDATE", "VALIDATE_LEVELS", "Malformed", "check_validate", "structure_facts"]

VALIDATE_LEVELS = ("structure", "decode")
"""Pack's validation levels, the cheaper first (see the module's description)."""
DEFAULT_VALIDATE = "structure"
"""The level :func:`shardio.packing.pack.pack` validates at unless asked for another."""
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_validate(validate: str) -> None:
    """Refuse a validation level that is not one of :data:`VALIDATE_LEVELS`.

    Raises:
        OptionError: naming the levels.
    """
    if validate not in VALIDATE_LEVELS:
        raise OptionError(
            f"validate must be one of {', '.join(map(repr, VALIDATE_LEVELS))}, not {validate!r}"
        )


def structure_facts(data: bytes | memoryview, ext: str) -> tuple[int, int, int] | None:
    """``(frames, sample rate, channels)`` of the audio file ``data`` (extension ``ext``) after its structure
    checks, or None where only decoding tells them exactly.

    Raises:
        Malformed: the structure, a size or a checksum is wrong; the message says which.
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if ext == "flac":
        return flac_facts(view)
    problem = truncation_problem(view, ext)  # the headers' sizes: the most telling message for a cut
    if problem is not None:
        raise Malformed(problem)
    if ext in ("ogg", "oga", "opus"):
        check_ogg_pages(view)
        return None
    if ext == "mp3":
        check_mp3_frames(view)
        return None
    return _wav_facts(view) if ext == "wav" else None


def _wav_facts(view: memoryview) -> tuple[int, int, int] | None:
    layout = wav_layout(view)
    if layout is None:
        return None
    if layout.frames == 0:
        raise Malformed("the audio has no samples (0 frames); expected at least one frame")
    if layout.dtype in ("<f4", "<f8"):
        samples = np.frombuffer(view, layout.dtype, layout.frames * layout.channels, layout.offset)
        bad = ~np.isfinite(samples)
        if layout.dtype == "<f8":  # beyond float32, a float64 sample decodes to infinity
            with np.errstate(invalid="ignore"):
                bad |= np.abs(samples) > _FLOAT32_MAX
        if bad.any():
            raise Malformed(
                f"the decoded audio holds {int(bad.sum())} NaN or infinite sample(s); expected finite samples"
            )
    return layout.frames, layout.sample_rate, layout.channels
