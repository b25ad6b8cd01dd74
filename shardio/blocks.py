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

The batch leaves the worker as a :class:`Outgoing` dict: unpickled in the training process it becomes a
plain dict whose audio is a view that releases the block when it dies.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

__all__ = ["LIMIT", "Outgoing", "is_pooled", "outgoing", "release", "take"]

LIMIT = 8
"""Blocks a worker keeps: the DataLoader's prefetch (2 per worker), the batches the trainer holds and pinning."""
_TAIL = 64  # bytes kept free at the end of a block: its flag lies in the last one
_HELD, _FREE = 1, 0
_MAPPED_LIMIT = 64  # blocks the training process keeps mapped (over several workers and iterations)


class _Pool:
    """One worker's blocks: uint8 tensors over shared storages, with their flag bytes."""

    def __init__(self) -> None:
        self.blocks: list[tuple[torch.Tensor, np.ndarray]] = []
        self.by_pointer: dict[int, np.ndarray] = {}
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor | None:
        with self.lock:
            free = [i for i, (_, flag) in enumerate(self.blocks) if flag[0] == _FREE]
            for i in free:
                block, flag = self.blocks[i]
                if block.numel() - _TAIL >= nbytes:
                    flag[0] = _HELD
                    return block
            if len(self.blocks) >= LIMIT and not free:
                return None
            size = nbytes + nbytes // 4 + _TAIL  # room for a somewhat longer batch next time
            storage = torch.UntypedStorage._new_shared(size)
            block = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,), (1,))
            flag = block[size - 1 :].numpy()
            flag[0] = _HELD
            if free:
                old, _ = self.blocks[free[0]]
                self.by_pointer.pop(old.data_ptr(), None)
                self.blocks[free[0]] = (block, flag)
            else:
                self.blocks.append((block, flag))
            self.by_pointer[block.data_ptr()] = flag
            return block


_POOL = _Pool()


def take(nbytes: int) -> torch.Tensor | None:
    """A uint8 shared-memory block of at least ``nbytes`` usable bytes, marked as held, with undefined
    contents; None when the worker already keeps :data:`LIMIT` blocks and the trainer holds them all."""
    return _POOL.take(nbytes)


def usable(tensor: torch.Tensor) -> int:
    """Bytes of ``tensor``'s storage free for a batch (a pooled block keeps its tail for the flag)."""
    storage = tensor.untyped_storage()
    return storage.nbytes() - (_TAIL if storage.data_ptr() in _POOL.by_pointer else 0)


def is_pooled(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a view of one of this worker's blocks (so its memory is not zero-filled)."""
    return tensor.untyped_storage().data_ptr() in _POOL.by_pointer


def release(tensor: torch.Tensor | None) -> None:
    """Give back the block of ``tensor`` when a batch did not end up in it (its audio went elsewhere)."""
    if tensor is not None:
        flag = _POOL.by_pointer.get(tensor.untyped_storage().data_ptr())
        if flag is not None:
            flag[0] = _FREE


class Outgoing(dict[str, Any]):
    """A batch whose audio lies in a pooled block: pickled to the training process, it arrives as a plain dict
    whose audio releases the block when the trainer drops it (see the module docs)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _arrived, (dict(self),)

    def __copy__(self) -> Outgoing:  # DataLoader's default_convert copies the batch in the worker
        return Outgoing(self)


def outgoing(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` as an :class:`Outgoing` when its audio lies in a pooled block, else as it is."""
    audio = batch.get("audio")
    if isinstance(audio, torch.Tensor) and is_pooled(audio):
        return Outgoing(batch)
    return batch


class _Mapped:
    """Blocks the training process has received, kept mapped (strong references, the oldest dropped first):
    torch then finds a block again by its file instead of mapping it anew, page by page."""

    def __init__(self) -> None:
        self.storages: OrderedDict[int, torch.UntypedStorage] = OrderedDict()
        self.lock = threading.Lock()

    def keep(self, storage: torch.UntypedStorage) -> None:
        with self.lock:
            self.storages[storage.data_ptr()] = storage
            self.storages.move_to_end(storage.data_ptr())
            while len(self.storages) > _MAPPED_LIMIT:
                self.storages.popitem(last=False)


_MAPPED = _Mapped()


def _set_free(flag: np.ndarray) -> None:
    flag[0] = _FREE


def _arrived(batch: dict[str, Any]) -> dict[str, Any]:
    """Unpickling an :class:`Outgoing` batch (in the training process): its audio becomes a tensor over an
    array whose death clears the block's flag."""
    audio = batch["audio"]
    storage = audio.untyped_storage()
    _MAPPED.keep(storage)
    whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    flag = whole[storage.nbytes() - 1 :].numpy()
    backing = audio.numpy()  # references `audio`, so the block stays mapped while the trainer uses it
    weakref.finalize(backing, _set_free, flag)
    batch["audio"] = torch.from_numpy(backing)
    return batch
