"""Channel: one end of a ShardLoader worker's pipe, whose waits and sends cost a system call each.

``Connection.poll`` builds a selector on every call, and ``Connection.send`` a pickler with a fresh copy of
the reducer table. With batches of 16 WAV utterances that cost a worker ~145 µs of CPU a batch (of ~1.7 ms)
and the training process ~55 µs (of ~0.37 ms). A channel keeps one ``select.poll`` object and one copy of the
reducer table (torch's among them, so a tensor outside a batch's block still travels in shared memory) for the
pipe's life. Its messages are those of ``Connection.send``: either end may be a plain ``Connection``, except
that a channel made with ``carry_fds`` (a worker's) sends its tensors' file descriptors with the message
(:mod:`.descriptors`), for a channel to read: a message that has arrived then needs nothing more from its
sender, which may be stopped. A channel on a Unix socket reads each message as its bytes arrive, within
:meth:`Channel.ready`'s wait: a sender stopped in the middle of a message larger than the socket's buffer
leaves it unfinished there, not the reader blocked in :meth:`Channel.receive` beyond its time limit.
"""

from __future__ import annotations

import io
import math
import pickle
import select
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from . import descriptors

__all__ = ["Channel"]

_WAIT_S = 3600.0  # receive() without ready(): how long each of its waits is


class Channel:
    """``pipe`` (one end of a ``multiprocessing.Pipe``), with cheap :meth:`ready` and :meth:`send`;
    ``carry_fds``: send the file descriptors of tensors' shared memory with each message (see the module docs;
    where the pipe is no Unix socket they are fetched from this process, as ``Connection.send`` has them)."""

    def __init__(self, pipe: Connection, carry_fds: bool = False) -> None:
        self.pipe = pipe
        self._poller = select.poll()
        self._poller.register(pipe.fileno(), select.POLLIN)
        self._socket = descriptors.socket_of(pipe)  # None: no Unix socket, read and written as a Connection
        self._reducers = ForkingPickler(io.BytesIO()).dispatch_table
        self._carrier = descriptors.Carrier() if carry_fds and self._socket is not None else None
        self._incoming = descriptors.Incoming()  # the message being read
        self._arrived: descriptors.Incoming | BaseException | None = (
            None  # read whole (or the end), not taken
        )
        if self._carrier is not None:
            self._reducers = self._carrier.reducers(self._reducers)

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether a whole message (or the other end's closing) is there to read, after waiting at most
        ``timeout`` seconds for one; what arrives of a message meanwhile is read and kept."""
        if self._socket is None:
            return bool(self._poller.poll(_milliseconds(timeout)))
        deadline = time.monotonic() + timeout
        while self._arrived is None:
            if not self._poller.poll(_milliseconds(deadline - time.monotonic())):
                return False
            try:
                if self._incoming.advance(self._socket):
                    self._arrived, self._incoming = self._incoming, descriptors.Incoming()
            except (EOFError, OSError) as error:
                self._arrived = error
        return True

    def receive(self) -> Any:
        """The next message, with the descriptors it came with (``EOFError`` once the other end closed)."""
        if self._socket is None:
            return self.pipe.recv()
        if self.pipe.closed:
            raise OSError("handle is closed")
        while not self.ready(_WAIT_S):
            pass
        arrived, self._arrived = self._arrived, None
        if isinstance(arrived, BaseException):
            raise arrived
        assert arrived is not None
        return arrived.message()

    def send(self, message: Any) -> None:
        """Send ``message``, pickled as ``Connection.send`` pickles it."""
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = self._reducers
        carrier = self._carrier
        try:
            pickler.dump(message)
            if carrier is not None and carrier.fds and self._socket is not None:
                descriptors.send(self._socket, buffer.getbuffer(), carrier.fds)
                return
        finally:
            if carrier is not None and (carrier.kept or carrier.fds):
                carrier.clear()
        self.pipe.send_bytes(buffer.getbuffer())

    def close(self) -> None:
        """Close this end of the pipe."""
        if self._socket is not None:
            self._socket.close()
        self._incoming.close()
        if isinstance(self._arrived, descriptors.Incoming):
            self._arrived.close()
        self.pipe.close()


def _milliseconds(seconds: float) -> int:
    return math.ceil(max(seconds, 0.0) * 1000)
