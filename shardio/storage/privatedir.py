"""Private directories: a node-local store that only its owner may write to, and its secret."""

from __future__ import annotations

import logging
import os
import stat

__all__ = ["private_dir", "secret", "untrusted"]

logger = logging.getLogger(__name__)


def untrusted(status: os.stat_result, directory: bool) -> str | None:
    """Why a file or directory of ``status`` (not followed through a link) is not one this process may
    trust with what it reads back: not a directory (``directory``) or not a regular file, another user's, or
    writable by others; None when it may."""
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(status.st_mode):
        return "not a directory" if directory else "not a regular file"
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not by this user"
    if status.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def private_dir(path: str) -> bool:
    """Make directory ``path`` (``0700``) when missing; whether it is a directory of this user that no one
    else may write to (else a warning says why it is not used)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        logger.warning("decoded cache %s cannot be made (%s): reading without it", path, exc)
        return False
    reason = untrusted(info, directory=True)
    if reason is not None:
        logger.warning("decoded cache %s: %s: reading without it", path, reason)
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
