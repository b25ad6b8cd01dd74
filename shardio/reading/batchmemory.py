"""Batch memory: where a batch's tensors live, so that the memory of a batch is reused, not faulted in anew.

In a DataLoader worker every tensor of a batch is carved out of one shared-memory block (as torch's default
collate allocates in shared memory): the batch then travels to the main process as one file descriptor instead
of one copy and one descriptor hand-over per tensor (each hand-over waits on the busy worker's GIL). The block
is one the worker reuses once the trainer has dropped the batch (:mod:`shardio.reading.blocks`), and after its
first trip it is named, not sent.

In the process that iterates (``num_workers=0``) the audio of a batch reuses the memory of an earlier batch
that nothing references any more (the trainer has dropped it): a fresh multi-megabyte block costs a zero
fill or a page fault per 4 KiB, about a tenth of a WAV batch's whole loading time. An unbatched dataset's
samples are decoded into reused memory too (:func:`sample_row`), in every process.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from functools import cache

import numpy as np
import torch

from ..world import Context
from . import blocks

__all__ = ["allocate", "audio_block", "audio_rows", "clear_padding", "columns_behind", "sample_row"]

_ALIGN = 64
_POOL_BLOCKS = 4  # batches the iterating process keeps for reuse: the trainer holds one or two at a time
_POOL_MIN_BYTES = 1 << 20  # smaller batches are cheap to allocate


class _BlockPool:
    """Memory for batches that is reused once nothing but the pool references it.

    A block handed out is a view of one of the pool's arrays, and every view (numpy, or a tensor made by
    ``torch.from_numpy``) holds a reference to that array: one referenced by the pool alone is unused.
    """

    def __init__(self, blocks: int) -> None:
        self._arrays: list[np.ndarray] = []
        self._blocks = blocks
        self._lock = threading.Lock()  # datasets iterated in several threads share the pool

    def _unused(self, slot: int) -> bool:
        return sys.getrefcount(self._arrays[slot]) <= 2  # the pool's list, and getrefcount's argument

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of uninitialised uint8 memory: an unused pooled array, or a new one."""
        with self._lock:
            free = [slot for slot in range(len(self._arrays)) if self._unused(slot)]
            for slot in free:
                if self._arrays[slot].nbytes >= nbytes:
                    return self._arrays[slot][:nbytes]
            array = np.empty(nbytes + nbytes // 4, np.uint8)  # room for a somewhat longer batch next time
            if free:
                self._arrays[free[0]] = array
            elif len(self._arrays) < self._blocks:
                self._arrays.append(array)
            return array[:nbytes]


_POOL = _BlockPool(_POOL_BLOCKS)

_SAMPLE_BLOCK_BYTES = 4 << 20


class _SampleArena:
    """Memory for single samples' audio (an unbatched dataset's), carved one sample after another out of
    blocks of a pool of their own: a block is reused once none of its samples is referenced any more.

    A sample's own ``np.empty`` (~190 KB for 3 s of 16 kHz float32) is, in a process that frees no large
    block, a fresh mapping faulted in page by page: glibc's adaptive mmap threshold stays at 128 KiB.
    """

    def __init__(self) -> None:
        self._pool = _BlockPool(_POOL_BLOCKS)
        self._block: np.ndarray | None = None
        self._used = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of uninitialised uint8 memory."""
        with self._lock:
            if self._block is None or self._used + nbytes > self._block.nbytes:
                self._block = None  # the pool may hand it out again once its samples are gone
                self._block = self._pool.take(max(nbytes, _SAMPLE_BLOCK_BYTES))
                self._used = 0
            start = self._used
            self._used += _aligned(nbytes)
            return self._block[start : start + nbytes]


_SAMPLES = _SampleArena()


@cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return None


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def allocate(
    specs: list[tuple[tuple[int, ...], np.dtype]],
    spare: torch.Tensor | None = None,
    pooled: bool = False,
    in_worker: bool | None = None,
) -> list[tuple[torch.Tensor, np.ndarray]]:
    """Tensors of the given shapes and numpy dtypes, each with its numpy view: in a DataLoader worker, views
    of one shared block (the room left behind ``spare``, an :func:`audio_block`, when it is large enough; with
    ``pooled``, a block of :mod:`shardio.reading.blocks`). Zero, unless ``pooled``: then their contents are
    undefined (reused memory, in the process that iterates too), and the caller writes every element.
    ``in_worker``: whether this is a DataLoader worker, where the caller knows (else looked up)."""
    start = _aligned(spare.numel() * spare.element_size()) if spare is not None else 0
    offsets, total = [], start
    for shape, dtype in specs:
        offsets.append(total)
        total += _aligned(math.prod(shape) * dtype.itemsize)
    dtypes = [_torch_dtype(dtype) for _, dtype in specs]
    if not (Context.detect().in_worker if in_worker is None else in_worker):
        return [_private(shape, dtype, reuse=pooled) for shape, dtype in specs]
    if total == start or any(d is None for d in dtypes):
        arrays = [np.zeros(shape, dtype=dtype) for shape, dtype in specs]
        return [(torch.from_numpy(array), array) for array in arrays]
    memory = blocks.memory_of(spare) if spare is not None else None
    # a pooled block: what lies behind the audio is not zero
    if memory is not None and memory.nbytes >= total:
        memory[start:total] = 0
        return _views(memory, specs, offsets)
    if (
        spare is not None
        and spare.untyped_storage().is_shared()
        and spare.storage_offset() == 0
        and blocks.usable(spare) >= total
    ):
        storage = spare.untyped_storage()  # a new shared-memory file: zero-filled behind the audio
    else:
        offsets = [offset - start for offset in offsets]
        memory = blocks.take_memory(total - start) if pooled else None
        if memory is not None:
            return _views(memory, specs, offsets)
        storage = torch.UntypedStorage._new_shared(total - start)  # a new shared-memory file: zero-filled
    tensors = [
        torch.empty(0, dtype=torch_dtype).set_(storage, offset // dtype.itemsize, shape, _strides(shape))
        for (shape, dtype), torch_dtype, offset in zip(specs, dtypes, offsets)
    ]
    return [(tensor, tensor.numpy()) for tensor in tensors]


def _private(shape: tuple[int, ...], dtype: np.dtype, reuse: bool) -> tuple[torch.Tensor, np.ndarray]:
    """A private array and its tensor: zeros, or (``reuse``, when large) unused memory of the pool, as is."""
    nbytes = math.prod(shape) * dtype.itemsize
    array = (
        _POOL.take(nbytes).view(dtype).reshape(shape)
        if reuse and nbytes >= _POOL_MIN_BYTES
        else np.zeros(shape, dtype=dtype)
    )
    return torch.from_numpy(array), array


def _views(
    memory: np.ndarray, specs: list[tuple[tuple[int, ...], np.dtype]], offsets: list[int]
) -> list[tuple[torch.Tensor, np.ndarray]]:
    """Arrays of ``specs`` at ``offsets`` in ``memory`` (uint8), each with a tensor over it."""
    arrays = [
        memory[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        for (shape, dtype), offset in zip(specs, offsets)
    ]
    return [(torch.from_numpy(array), array) for array in arrays]


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-contiguous strides, in elements."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def audio_block(frames: Sequence[int], channels: int, dtype: np.dtype = np.dtype(np.float32)) -> torch.Tensor:
    """A float32 (or ``dtype``) ``(len(frames), channels, max(frames))`` batch to decode samples straight into
    (with :func:`shardio.reading.decode.decode_audio`'s ``out``, row by row), then to give
    :func:`~shardio.reading.collate.collate` as ``audio``, which zero-fills each row's padding.

    In a DataLoader worker it lies in shared memory, with room behind it for the batch's lengths, sample rates
    and repeat flags, so the whole batch crosses to the training process as one block: a block of
    :mod:`shardio.reading.blocks`, reused once the trainer has dropped the batch it held. Elsewhere a large
    block reuses the memory of an earlier batch that nothing references any more, so its contents are
    undefined until written."""
    return audio_rows(frames, channels, dtype)[0]


def audio_rows(
    frames: Sequence[int],
    channels: int,
    dtype: np.dtype = np.dtype(np.float32),
    in_worker: bool | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """An :func:`audio_block` and its numpy view (``Tensor.numpy`` costs microseconds); ``in_worker``: whether
    this is a DataLoader worker, where the caller knows (else looked up)."""
    count, int64 = len(frames), np.dtype(np.int64)
    shape = (count, channels, max(frames, default=0))
    nbytes = count * channels * shape[2] * dtype.itemsize
    if not (Context.detect().in_worker if in_worker is None else in_worker):
        return _private(shape, dtype, reuse=True)
    if nbytes:  # a fresh shared block costs system calls and page faults at any size
        memory = blocks.take_memory(_aligned(nbytes) + 3 * _aligned(count * 8))
        if memory is not None:
            rows = memory[:nbytes].view(dtype).reshape(shape)
            return torch.from_numpy(rows), rows
    return allocate([(shape, dtype), ((count,), int64), ((count,), int64)], in_worker=True)[0]


def clear_padding(audio: torch.Tensor, block: np.ndarray, lengths: list[int]) -> None:
    """Zero each row of ``audio``, an :func:`audio_block` (``block`` its numpy view), past its length in
    ``lengths``, unless its memory is new and so zero already; a mono block through its flat view, whose
    slices cost a third of the 3-d ones."""
    if audio.untyped_storage().is_shared() and not blocks.is_pooled(audio):  # a new shared-memory file
        return
    if block.shape[1] != 1 or not block.flags.c_contiguous:
        for row, length in enumerate(lengths):
            block[row, :, length:] = 0
        return
    flat, width = block.reshape(-1), block.shape[2]
    for row, length in enumerate(lengths):
        flat[row * width + length : (row + 1) * width] = 0


def sample_row(frames: int, channels: int, dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray:
    """Uninitialised ``(channels, frames)`` memory for one sample's audio to be decoded into (an unbatched
    dataset's), reused once the sample is gone (see :class:`_SampleArena`)."""
    return _SAMPLES.take(channels * frames * dtype.itemsize).view(dtype).reshape(channels, frames)


def columns_behind(
    audio: torch.Tensor, columns: dict[str, np.ndarray], in_worker: bool | None = None
) -> dict[str, torch.Tensor]:
    """A batch's per-sample ``columns`` (new arrays, of shape ``(B,)``) as tensors: in a DataLoader worker,
    copies behind ``audio`` (an :func:`audio_block`) in its shared block, as :func:`allocate` places them;
    elsewhere the arrays themselves. ``in_worker``: as for :func:`audio_rows`."""
    if not (Context.detect().in_worker if in_worker is None else in_worker):
        return {name: torch.from_numpy(column) for name, column in columns.items()}
    made = allocate(
        [(column.shape, column.dtype) for column in columns.values()], spare=audio, in_worker=True
    )
    for (_, out), column in zip(made, columns.values()):
        out[...] = column
    return {name: tensor for name, (tensor, _) in zip(columns, made)}
