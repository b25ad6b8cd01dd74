"""Descriptors: the file descriptors of a message's tensors, sent with the message itself (``SCM_RIGHTS``).

torch sends a CPU tensor's shared memory between processes as a file descriptor (its default sharing strategy
on Linux) through ``multiprocessing``'s resource sharer: the message holds an address, and the receiver, while
unpickling it, connects back to a thread of the sender and fetches the descriptor there. That fetch needs the
sender running: a ShardLoader worker stopped (``SIGSTOP``, job control, a debugger) just after sending such a
message (a block's first trip, a tensor outside the block) held the training process inside the message's
unpickling with no time limit, where neither ``timeout`` nor the silence warning applies. A worker's channel
instead sends the descriptors in the ancillary data of the message's own first bytes, so a message that has
arrived needs nothing more from its sender; a descriptor so sent also costs less than a fetch (a connection,
an authentication and a hand-off to the sender's thread each).

How: torch's storage reducer wraps a descriptor with ``multiprocessing.reduction.DupFd``, which, while a
process is being started by spawn or forkserver, asks that start's "spawning popen" for it (whose descriptors
go with the start). While a channel pickles a message, a :class:`Carrier` is that popen for torch's storage
reducer only: it keeps each descriptor for the message and puts its index there. The receiving end
(:class:`Incoming`) reads a message as ``Connection.recv`` does, as its bytes arrive, taking the descriptors
that came with it, and the unpickled indices give them to torch's rebuild, which closes them once mapped; any
left are closed.
"""

from __future__ import annotations

import array
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing import context as mp_context
from typing import Any

from torch.multiprocessing import reductions

__all__ = ["Carrier", "Incoming", "send", "socket_of"]

_MAX_FDS = 253
"""Descriptors one ``sendmsg`` may carry (Linux's ``SCM_MAX_FD``); a message with more sends groups."""
_ANCILLARY = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize) if hasattr(socket, "CMSG_SPACE") else 0
_ARRIVED = threading.local()  # .fds: the descriptors of the message this thread is unpickling
# plain ints: socket's flags are enum members, whose `&` with an int costs ~5 us a message
_DONTWAIT, _CTRUNC = int(getattr(socket, "MSG_DONTWAIT", 0)), int(getattr(socket, "MSG_CTRUNC", 0))


class _Index:
    """A carried descriptor in a message: its index among the descriptors that come with the message."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return _arrived, (self.index,)


class _Arrived:
    """A descriptor that came with the message being unpickled, for torch's rebuild to take (``detach``)."""

    def __init__(self, fds: list[int], index: int) -> None:
        self.fds, self.index = fds, index

    def detach(self) -> int:
        """The descriptor, now the caller's to close."""
        fd, self.fds[self.index] = self.fds[self.index], -1
        if fd < 0:
            raise RuntimeError("a file descriptor that came with a shardio worker's message was taken twice")
        return fd


def _arrived(index: int) -> _Arrived:
    fds = getattr(_ARRIVED, "fds", None)
    if fds is None or not 0 <= index < len(fds):
        raise RuntimeError(
            "a message sent with its file descriptors by a shardio channel was read without "
            "them: read it with a shardio.loader.channel.Channel"
        )
    return _Arrived(fds, index)


class Carrier:
    """What one end of a pipe sends with the message it is pickling: the descriptors of its tensors' memory
    (see the module docs). One message at a time: :meth:`clear` once it is sent."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.kept: list[Any] = []  # the storages those descriptors are of: open until the message is sent

    def reducers(self, table: dict[Any, Any]) -> dict[Any, Any]:
        """``table`` (a pickler's dispatch table) with torch's storage reducer carrying descriptors here."""
        return {
            kind: self._carrying(reduce) if reduce is reductions.reduce_storage else reduce
            for kind, reduce in table.items()
        }

    def _carrying(self, reduce: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def reducer(storage: Any) -> Any:
            previous = mp_context.get_spawning_popen()
            mp_context.set_spawning_popen(self)  # type: ignore[arg-type]  # a Popen's stand-in (module docs)
            try:
                reduced = reduce(storage)
            finally:
                mp_context.set_spawning_popen(previous)
            self.kept.append(storage)
            return reduced

        return reducer

    def duplicate_for_child(self, fd: int) -> int:
        """(As a spawning popen) keep ``fd`` for the message; its index there."""
        self.fds.append(fd)
        return len(self.fds) - 1

    def DupFd(self, index: int) -> _Index:  # noqa: N802 - the name multiprocessing calls
        """(As a spawning popen) what the message holds for descriptor ``index``."""
        return _Index(index)

    def clear(self) -> None:
        """Forget the message sent (or that failed to pickle)."""
        self.fds, self.kept = [], []


def socket_of(pipe: Any) -> socket.socket | None:
    """A socket on (a duplicate of) ``pipe``'s descriptor, if it is a Unix socket that can carry descriptors
    (a duplex ``multiprocessing.Pipe`` on Linux and macOS); None otherwise."""
    if not (hasattr(socket, "SCM_RIGHTS") and hasattr(socket, "AF_UNIX") and _ANCILLARY):
        return None
    fd = os.dup(pipe.fileno())
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket (a one-way pipe)
        os.close(fd)
        return None
    if sock.family != socket.AF_UNIX:
        sock.close()
        return None
    sock.setblocking(True)  # as the pipe is (a default socket timeout made the shared file non-blocking)
    return sock


def send(sock: socket.socket, payload: memoryview, fds: list[int]) -> None:
    """Send ``payload`` framed as ``Connection.send_bytes`` frames it, with ``fds`` in its first bytes'
    ancillary data."""
    size = len(payload)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
    data = memoryview(header + payload)
    groups = [fds[i : i + _MAX_FDS] for i in range(0, len(fds), _MAX_FDS)] or [[]]
    cut = len(data) - (len(groups) - 1)  # the first group with all but one byte per other group
    pieces = [data[:cut]] + [data[cut + i : cut + i + 1] for i in range(len(groups) - 1)]
    for piece, group in zip(pieces, groups):
        sent = sock.sendmsg([piece], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", group))])
        if sent < len(piece):
            sock.sendall(piece[sent:])


_SIZE, _LONG_SIZE = struct.Struct("!i"), struct.Struct("!Q")
_HEADER, _LONG_HEADER, _BODY = 0, 1, 2  # what an Incoming is reading: the length, its long form, the pickle


class Incoming:
    """One message being read from a socket as its bytes arrive, framed as ``Connection.send_bytes`` frames
    it (by :func:`send` or by ``Connection.send``), with the descriptors that come with it.

    :meth:`advance` never waits, so a reader can keep its own time limit: a sender stopped in the middle of
    writing a message larger than the socket's buffer leaves the message unfinished, not the reader blocked.
    """

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._truncated = False
        self._stage = _HEADER
        self._buffer = bytearray(_SIZE.size)
        self._got = 0

    def advance(self, sock: socket.socket) -> bool:
        """Read what has arrived of the message without waiting; whether it is whole now. ``EOFError``: the
        other end closed before the message began; ``OSError``: it closed in the middle of it."""
        while True:
            if self._got == len(self._buffer) and not self._next_stage():
                return True
            view = memoryview(self._buffer)[self._got :]
            try:
                if self._stage == _BODY and not self.fds and not self._truncated:
                    # descriptors come with a message's first bytes: with none there, the message has none
                    count = sock.recv_into(view, 0, _DONTWAIT)
                else:
                    count, ancillary, flags, _ = sock.recvmsg_into([view], _ANCILLARY, _DONTWAIT)
                    if ancillary or flags & _CTRUNC:
                        self._take(ancillary, flags)
            except (BlockingIOError, InterruptedError):
                return False
            if count == 0:
                if self._stage == _HEADER and self._got == 0:
                    raise EOFError
                raise OSError("got end of file during message")
            self._got += count

    def _next_stage(self) -> bool:
        """After a part of the message is read whole: begin the next (True), or the
        message is whole (False)."""
        if self._stage == _BODY:
            return False
        if self._stage == _HEADER:
            (size,) = _SIZE.unpack(self._buffer)
            if size == -1:
                self._stage, self._buffer, self._got = _LONG_HEADER, bytearray(_LONG_SIZE.size), 0
                return True
        else:
            (size,) = _LONG_SIZE.unpack(self._buffer)
        self._stage, self._buffer, self._got = _BODY, bytearray(size), 0
        return True

    def _take(self, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        self._truncated = self._truncated or bool(flags & _CTRUNC)

    def message(self) -> Any:
        """The whole message, unpickled with the descriptors that came with it (those
        it leaves are closed)."""
        try:
            if self._truncated:  # the message is read whole: the next one is read as it should be
                raise RuntimeError(
                    "a shardio worker's message came without some of its file descriptors (too "
                    "many open files? see `ulimit -n`)"
                )
            if not self.fds:
                return pickle.loads(self._buffer)
            _ARRIVED.fds = self.fds
            try:
                return pickle.loads(self._buffer)
            finally:
                _ARRIVED.fds = None
        finally:
            self.close()

    def close(self) -> None:
        """Close the descriptors that came with the message and were not taken."""
        fds, self.fds = self.fds, []
        for fd in fds:
            if fd >= 0:
                os.close(fd)
