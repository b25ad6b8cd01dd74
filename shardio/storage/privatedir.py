"""Private directories: a node-local store that only its owner may write to, and its secret."""

from __future__ import annotations

import logging
import os
import stat

__all__ = ["private_dir", "secret"]

logger = logging.getLogger(__name__)


def private_dir(path: str) -> bool:
    """Make directory ``path`` (``0700``) when missing; whether it is a directory of this user that no one
    else may write to (else a warning says why it is not used)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        logger.warning("decoded cache %s cannot be made (%s): reading without it", path, exc)
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        logger.warning(
            "decoded cache %s is not a directory of this user writable by no one else: reading without it",
            path,
        )
        return False
    return True


def secret(directory: str) -> int | None:
    """The 64-bit secret of the store in ``directory``, made when missing (written aside, then linked into
    place: never replaced); None (and a warning) where the file there is not one this user made."""
    path = os.path.join(directory, "secret")
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, os.urandom(16))
            finally:
                os.close(fd)
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
        except OSError as exc:
            logger.warning("decoded cache %s: no secret (%s): reading without it", directory, exc)
            return None
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info, data = os.fstat(fd), os.read(fd, 17)
        finally:
            os.close(fd)
    except OSError:
        data, info = b"", None
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        data = b""
    if len(data) != 16:
        logger.warning(
            "decoded cache %s: its secret is not one this user made: reading without it", directory
        )
        return None
    return int.from_bytes(data[:8], "little") ^ int.from_bytes(data[8:], "little")
