"""MemoryFile: audio bytes handed to libsndfile as a file of their own, one in memory (a Linux memfd), and
:func:`read_sound`, which opens bytes with soundfile that way where it can, else from ``io.BytesIO``.

soundfile reads in-memory bytes through libsndfile's virtual I/O, which calls back into Python for each read
and each position asked: about 120 calls for a 6 s FLAC clip. Given a file, libsndfile reads with system calls
instead: a FLAC sample decodes ~4% cheaper (``benchmarks/README.md``, "FLAC from a memory file"), for one copy
of its bytes into the file.

The file holds exactly the member's bytes, so libsndfile sees what it sees in memory. A result is taken only
where the read returned every frame the header promises; anything else (an error, a short read, no memfd on
this system) gives None, and :func:`read_sound` decodes from ``io.BytesIO`` as before: errors and their
messages stay those of the in-memory path. (Decoding straight from the shard file, at the member's offset, was
cheaper still, but libsndfile then reads on past the member's end: a stream cut short decoded the next
member's frames.)

Each thread of each process writes a file of its own, which holds the last bytes it decoded, unless they were
more than :data:`KEPT_BYTES`.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable
from typing import TypeVar

import soundfile

from ..errors import DecodeError

__all__ = ["FILE_FORMATS", "KEPT_BYTES", "read_as_file", "read_sound"]

FILE_FORMATS = frozenset({"flac"})
"""Extensions decoded through a memory file: those whose samples are checked to be the in-memory path's
(``tests/reading/test_memory_file.py``)."""

KEPT_BYTES = 4 << 20
"""A file that held more than this is emptied after its read, so that a long recording's bytes are not
held."""

_Result = TypeVar("_Result")


class _Descriptor:
    """A memory file's descriptor, closed when its thread's storage lets go of it."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("shardio-audio", os.MFD_CLOEXEC)
        self.pid = os.getpid()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_LOCAL = threading.local()


def _descriptor() -> int | None:
    """This thread's memory file (a forked child's own, not its parent's); None where there can be none."""
    held: _Descriptor | None = getattr(_LOCAL, "file", None)
    if held is None or held.pid != os.getpid():
        try:
            held = _LOCAL.file = _Descriptor()
        except (AttributeError, OSError):  # no memfd_create here (not Linux), or no descriptors left
            return None
    return held.fd


def read_as_file(data: memoryview, read: Callable[[soundfile.SoundFile], _Result | None]) -> _Result | None:
    """``read(sound)`` of ``data`` opened by libsndfile from a memory file, where it leaves the sound at the
    end of every frame the header promises; else None (see the module)."""
    fd = _descriptor()
    if fd is None:
        return None
    try:
        os.ftruncate(fd, len(data))
        if os.pwrite(fd, data, 0) != len(data):
            return None
        os.lseek(fd, 0, os.SEEK_SET)
        with soundfile.SoundFile(fd, closefd=False) as sound:
            frames = sound.frames
            result = read(sound)
            return result if frames > 0 and sound.tell() == frames else None
    except (RuntimeError, ValueError, TypeError, EOFError, OSError):  # LibsndfileError is a RuntimeError
        return None
    finally:
        if len(data) > KEPT_BYTES:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)


def read_sound(
    view: memoryview, ext: str, where: str, read: Callable[[soundfile.SoundFile], _Result]
) -> _Result:
    """``read(sound)`` of audio bytes opened by soundfile: from a memory file for the formats it takes (where
    that gives a result), else from ``io.BytesIO``; a :class:`~shardio.errors.DecodeError` naming ``where``
    for bytes libsndfile cannot read."""
    decoded = read_as_file(view, read) if ext in FILE_FORMATS else None
    if decoded is not None:
        return decoded
    try:
        with soundfile.SoundFile(io.BytesIO(view)) as sound:
            return read(sound)
    except (RuntimeError, ValueError, TypeError, EOFError, OSError) as exc:  # LibsndfileError: a RuntimeError
        detail = getattr(exc, "error_string", "") or str(exc)  # without soundfile's "<BytesIO object at ..>"
        raise DecodeError(
            f"{where}: {len(view)} bytes could not be decoded as {ext} audio ({detail}); "
            f"expected a complete {ext} file that libsndfile can read"
        ) from exc
