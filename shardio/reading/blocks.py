"""Blocks: shared-memory batch memory that a DataLoader worker reuses once the training process drops a batch.

A fresh shared-memory block per batch costs a page fault per 4 KiB twice: in the worker that writes it and in
the training process that maps and reads it (``benchmarks/transport.py``: ~30x a private page). Here each
worker keeps a few blocks (torch shared storages) and writes batch after batch into them, and the training
process keeps each block mapped, so after the first few batches no page is faulted on either side.

A block is never written while the trainer may still hold a batch in it. Its last byte is a flag in the
shared memory itself: the worker sets it when it hands the block out; the training process clears it when
the last reference to the batch's audio (any view of it, the batch dict, a list of held batches) is gone
(``weakref.finalize`` on the array that backs the tensor it gives the trainer). A worker only writes into
a block whose flag is clear; with none free it makes a new block, or (over :data:`LIMIT`) an unpooled one.

The batch leaves the worker as an :class:`Outgoing` dict: unpickled in the training process it becomes a
plain dict whose tensors in the block release it when the last of them dies. A block is sent (its file
descriptor) once; later batches name it, and the training process keeps it mapped until its worker exits or
replaces it with a larger one.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from functools import cache
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import ReadError

__all__ = ["LIMIT", "Outgoing", "is_pooled", "memory_of", "outgoing", "release", "take", "take_memory"]

LIMIT = 8
"""Blocks a worker keeps: the DataLoader's prefetch (2 per worker), the batches the trainer holds and
pinning."""
_TAIL = 64  # bytes kept free at the end of a block: its flag lies in the last one
_SMALL = 4096  # tensors of the block up to this size travel as copies: a trainer keeping a batch's lengths
# (for its logs) does not hold the whole block
_HELD, _FREE = 1, 0


class _Block(NamedTuple):
    tensor: torch.Tensor  # uint8, the whole shared storage
    flag: np.ndarray  # its last byte
    token: tuple[int, int]  # (worker pid, serial): names the block in the training process once it has it
    # uint8, the block but its tail: batches are written through numpy views (~1 us, torch's ~5)
    memory: np.ndarray


class _Pool:
    """One worker's blocks, and which of them the training process has been sent already."""

    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.by_pointer: dict[int, _Block] = {}
        self.sent: set[tuple[int, int]] = set()
        self.retired: list[tuple[int, int]] = []  # replaced blocks the training process still keeps mapped
        self.serial = 0
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> _Block | None:
        with self.lock:
            free = [i for i, block in enumerate(self.blocks) if block.flag[0] == _FREE]
            for i in free:
                block = self.blocks[i]
                if block.memory.nbytes >= nbytes:
                    block.flag[0] = _HELD
                    return block
            if len(self.blocks) >= LIMIT and not free:
                return None
            size = nbytes + nbytes // 4 + _TAIL  # room for a somewhat longer batch next time
            storage = torch.UntypedStorage._new_shared(size)
            tensor = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,), (1,))
            self.serial += 1
            whole = tensor.numpy()
            block = _Block(tensor, whole[size - 1 :], (os.getpid(), self.serial), whole[: size - _TAIL])
            block.flag[0] = _HELD
            if free:  # a free block too small for this batch: replaced
                old = self.blocks[free[0]]
                self.by_pointer.pop(old.tensor.data_ptr(), None)
                if old.token in self.sent:
                    self.sent.discard(old.token)
                    self.retired.append(old.token)
                self.blocks[free[0]] = block
            else:
                self.blocks.append(block)
            self.by_pointer[tensor.data_ptr()] = block
            return block


_POOL = _Pool()


def _forked() -> None:
    global _POOL
    _POOL = _Pool()  # a child process (a DataLoader worker) writes into blocks of its own, never its parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def take(nbytes: int) -> torch.Tensor | None:
    """A uint8 shared-memory block of at least ``nbytes`` usable bytes, marked as held, with undefined
    contents; None when the worker already keeps :data:`LIMIT` blocks and the trainer holds them all."""
    block = _POOL.take(nbytes)
    return None if block is None else block.tensor


def take_memory(nbytes: int) -> np.ndarray | None:
    """As :func:`take`, the block's usable bytes as a uint8 numpy array: views of it, and tensors made from
    them by ``torch.from_numpy``, cost a fraction of torch's views of the storage, and are as much the block's
    (it is found by address)."""
    block = _POOL.take(nbytes)
    return None if block is None else block.memory


def memory_of(tensor: torch.Tensor) -> np.ndarray | None:
    """The usable bytes of the block whose start ``tensor``'s data is (as :func:`take_memory` gives them), or
    None when ``tensor`` does not start a block of this worker."""
    block = _POOL.by_pointer.get(tensor.data_ptr())
    return None if block is None else block.memory


def usable(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s storage free for a batch (a pooled block keeps its tail for the flag)."""
    storage = tensor.untyped_storage()
    block = _POOL.by_pointer.get(storage.data_ptr())
    return storage.nbytes() if block is None else block.memory.nbytes


def is_pooled(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a view of one of this worker's blocks (so its memory is not zero-filled)."""
    return tensor.untyped_storage().data_ptr() in _POOL.by_pointer


def release(tensor: torch.Tensor | None) -> None:
    """Give back the block of ``tensor`` when a batch did not end up in it (its audio went elsewhere)."""
    if tensor is not None:
        block = _POOL.by_pointer.get(tensor.untyped_storage().data_ptr())
        if block is not None:
            block.flag[0] = _FREE


class Outgoing(dict[str, Any]):
    """A batch whose audio lies in a pooled block: pickled to the training process, it arrives as a plain dict
    whose tensors in the block release it once the trainer has dropped them all (see the module docs).

    The block's memory (a file descriptor, handed over through a socket) is sent the first time only; after
    that the batch names the block and where each of its tensors lies in it. A tensor of the block that is not
    contiguous (a strided view made in the worker) is sent as a copy; a batch left with no tensor in its block
    (the worker replaced them) gives the block back and is sent as a plain dict."""

    block: _Block | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        block = self.block
        # whether a tensor lies in the block, by its address (a storage object per tensor costs ~3 us)
        start = block.tensor.data_ptr() if block is not None else 0
        end = start + block.tensor.numel() if block is not None else 0
        views: dict[str, tuple[str, int, tuple[int, ...]]] = {}
        small: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
        rest: dict[str, Any] = {}
        for name, value in self.items():
            inside = False
            if block is not None and isinstance(value, torch.Tensor) and value.is_cpu:
                pointer = value.data_ptr()
                inside = (
                    start <= pointer < end if value.numel() else value.untyped_storage().data_ptr() == start
                )
            if not inside:
                rest[name] = value
                continue
            array = value.numpy()
            if not array.flags.c_contiguous:
                rest[name] = value.clone()
            elif array.nbytes <= _SMALL:
                small[name] = (
                    array.dtype.str,
                    array.shape,
                    array.tobytes(),
                )  # by value: cheaper than an array
            else:
                views[name] = (array.dtype.str, pointer - start, array.shape)
        if block is None or not views:  # nothing left in the block: copies go as torch sends tensors
            if block is not None:
                block.flag[0] = _FREE
            return dict, (
                {name: _small_tensor(*small[name]) if name in small else rest[name] for name in self},
            )
        with _POOL.lock:
            first = block.token not in _POOL.sent
            _POOL.sent.add(block.token)
            retired, _POOL.retired = _POOL.retired, []
        storage = block.tensor.untyped_storage() if first else None
        return _arrived, (block.token, storage, views, small, rest, list(self), retired)

    def __copy__(self) -> Outgoing:  # DataLoader's default_convert copies the batch in the worker
        copy = Outgoing(self)
        copy.block = self.block
        return copy


def outgoing(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` as an :class:`Outgoing` when its audio lies in a pooled block, else as it is."""
    audio = batch.get("audio")
    if isinstance(batch, Outgoing) or not isinstance(audio, torch.Tensor):
        return batch
    block = _POOL.by_pointer.get(audio.untyped_storage().data_ptr())
    if block is None:
        return batch
    wrapped = Outgoing(batch)
    wrapped.block = block
    return wrapped


class _Received(NamedTuple):
    memory: memoryview  # the whole block (its storage kept alive through it)
    flag: np.ndarray  # its last byte


class _Mapped:
    """The blocks the training process has received, by token. Kept mapped while their worker lives (its
    batches name them without sending them again); a new block's arrival drops those of exited workers."""

    def __init__(self) -> None:
        self.storages: dict[tuple[int, int], _Received] = {}
        self.lock = threading.Lock()

    def add(self, token: tuple[int, int], storage: torch.UntypedStorage) -> None:
        """Keep ``storage``, the block ``token`` names; drop the blocks of workers that have exited."""
        size = storage.nbytes()
        whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,), (1,)).numpy()
        received = _Received(whole.data, whole[size - 1 :])
        with self.lock:
            for pid in {known for known, _ in self.storages} - {token[0]}:
                if not _alive(pid):
                    self.storages = {t: s for t, s in self.storages.items() if t[0] != pid}
            self.storages[token] = received

    def drop(self, tokens: list[tuple[int, int]]) -> None:
        """Forget blocks their worker has replaced (they are unmapped once no batch views them)."""
        with self.lock:
            for token in tokens:
                self.storages.pop(token, None)

    def get(self, token: tuple[int, int]) -> _Received:
        """The block ``token`` names, received earlier."""
        received = self.storages.get(token)
        if received is None:
            raise ReadError(
                f"a batch names shared-memory block {token[1]} of DataLoader worker {token[0]}, which "
                "this process was never sent: a batch from a worker can be unpickled once, by the "
                "process that iterates the DataLoader"
            )
        return received


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


_MAPPED = _Mapped()


@cache
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _small_tensor(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    """A tensor of its own holding ``data`` (a small tensor of a batch, sent by value)."""
    return torch.from_numpy(np.frombuffer(bytearray(data), dtype).reshape(shape))


def _set_free(flag: np.ndarray) -> None:
    flag[0] = _FREE


def _arrived(
    token: tuple[int, int],
    storage: torch.UntypedStorage | None,
    views: dict[str, tuple[str, int, tuple[int, ...]]],
    small: dict[str, tuple[str, tuple[int, ...], bytes]],
    rest: dict[str, Any],
    order: list[str],
    retired: list[tuple[int, int]],
) -> dict[str, Any]:
    """Unpickling an :class:`Outgoing` batch (in the training process): its tensors in the block become
    tensors over views of one array, whose death (that of every view) clears the block's flag."""
    _MAPPED.drop(retired)
    if storage is not None:
        _MAPPED.add(token, storage)
    memory, flag = _MAPPED.get(token)
    # an array of this batch's own over the block: the views below lead back to it (never to an array that
    # outlives the batch), so its death is that of the batch's last view
    whole = np.frombuffer(memory, np.uint8)
    weakref.finalize(whole, _set_free, flag)
    batch = {}
    for name in order:
        if name in views:
            dtype, offset, shape = views[name]
            end = offset + math.prod(shape) * _itemsize(dtype)
            batch[name] = torch.from_numpy(whole[offset:end].view(dtype).reshape(shape))
        elif name in small:
            batch[name] = _small_tensor(*small[name])
        else:
            batch[name] = rest[name]
    return batch
