"""DirectoryLock: one writer at a time in a dataset directory, and a message naming the one that holds it.

An advisory ``fcntl.flock`` on ``.shardio.lock`` in the directory, which records the holder's host, pid and
start time. The kernel drops the lock when its holder exits, however it exits, so a crashed run never
leaves the directory locked; the file itself is removed on release (a run that opened it just before is
told apart by its inode, and tries again).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from ..errors import OutputError
from ..reading.storage import check_output_file

__all__ = ["LOCK_FILE", "DirectoryLock"]

LOCK_FILE = ".shardio.lock"


class DirectoryLock:
    """Hold ``directory``'s writer lock from construction until :meth:`release`; raises
    :class:`~shardio.errors.OutputError` naming the holder when another process has it."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: int | None = None
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise OutputError(f"{directory} is being written by another shardio run ({holder}); wait for it "
                                  f"to finish, or write elsewhere") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed the file between our open and our lock
                os.close(fd)
                continue
            record = {"host": socket.gethostname(), "pid": os.getpid(),
                      "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(record).encode())
            self._fd = fd

    def _open(self) -> int:
        check_output_file(self.path)  # a device or FIFO there is not opened, let alone written
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            raise OutputError(f"{os.path.dirname(self.path)}: cannot create the lock file {LOCK_FILE} "
                              f"({exc.strerror or exc}); expected a writable directory") from None

    def release(self) -> None:
        """Remove the lock file and let the next writer in (idempotent)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _holder(fd: int) -> str:
    """The holder the lock file names, for the message: ``pid 123 on host h since ...``."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        host, since = (_printable(str(record[name]))[:64] for name in ("host", "since"))
        return f"pid {int(record['pid'])} on host {host} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)
