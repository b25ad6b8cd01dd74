"""Collate: samples into one batch of padded tensors, lengths, keys and metadata lists.

Padding is done in numpy into buffers wrapped by ``torch.from_numpy`` (no copy): torch's own indexed copies
run on its intra-op thread pool, which on a small, busy machine cost 20-50x the copy itself (measured: 16
utterances of 1-5 s, 35-135 ms with torch on 2 threads, 1-3 ms in numpy).

In a DataLoader worker every tensor of a batch is carved out of one shared-memory block (as torch's default
collate allocates in shared memory): the batch then travels to the main process as one file descriptor
instead of one copy and one descriptor hand-over per tensor (each hand-over waits on the busy worker's GIL).
The block is one the worker reuses once the trainer has dropped the batch (:mod:`shardio.reading.blocks`), and after
its first trip it is named, not sent.

In the process that iterates (``num_workers=0``) the audio of a batch reuses the memory of an earlier batch
that nothing references any more (the trainer has dropped it): a fresh multi-megabyte block costs a zero
fill or a page fault per 4 KiB, about a tenth of a WAV batch's whole loading time.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..errors import OptionError
from . import blocks

__all__ = ["audio_block", "collate", "to_tensors"]

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


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numeric numpy array (CPU tensors are viewed, not copied), or None if it is not one."""
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "fiub" else None
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad:
        try:
            return value.numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...)
            return None
    return None


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


@cache
def _torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return None


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _allocate(specs: list[tuple[tuple[int, ...], np.dtype]], spare: torch.Tensor | None = None,
              pooled: bool = False) -> list[torch.Tensor]:
    """Zero tensors of the given shapes and numpy dtypes: in a DataLoader worker, views of one shared block
    (the room left behind ``spare``, an :func:`audio_block`, when it is large enough; with ``pooled``, a block
    of :mod:`shardio.reading.blocks`)."""
    start = _aligned(spare.numel() * spare.element_size()) if spare is not None else 0
    offsets, total = [], start
    for shape, dtype in specs:
        offsets.append(total)
        total += _aligned(math.prod(shape) * dtype.itemsize)
    dtypes = [_torch_dtype(dtype) for _, dtype in specs]
    if get_worker_info() is None or total == start or any(d is None for d in dtypes):
        return [torch.from_numpy(np.zeros(shape, dtype=dtype)) for shape, dtype in specs]
    if spare is not None and spare.is_shared() and spare.storage_offset() == 0 and blocks.usable(spare) >= total:
        storage = spare.untyped_storage()  # not yet used behind the audio: zero-filled, unless a pooled block
        if blocks.is_pooled(spare):
            torch.empty(0, dtype=torch.uint8).set_(storage, start, (total - start,), (1,)).zero_()
    else:
        offsets = [offset - start for offset in offsets]
        block = blocks.take(total - start) if pooled else None
        if block is not None:
            storage = block.untyped_storage()
            block[: total - start].zero_()
        else:
            storage = torch.UntypedStorage._new_shared(total - start)  # a new shared-memory file: zero-filled
    return [torch.empty(0, dtype=torch_dtype).set_(storage, offset // dtype.itemsize, shape, _strides(shape))
            for (shape, dtype), torch_dtype, offset in zip(specs, dtypes, offsets)]


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-contiguous strides, in elements."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def audio_block(frames: Sequence[int], channels: int, dtype: np.dtype = np.dtype(np.float32)) -> torch.Tensor:
    """A float32 (or ``dtype``) ``(len(frames), channels, max(frames))`` batch to decode samples straight into (with
    :func:`shardio.reading.decode.decode_audio`'s ``out``, row by row), then to give :func:`collate` as ``audio``,
    which zero-fills each row's padding.

    In a DataLoader worker it lies in shared memory, with room behind it for the batch's lengths and sample
    rates, so the whole batch crosses to the training process as one block: a block of :mod:`shardio.reading.blocks`,
    reused once the trainer has dropped the batch it held. Elsewhere a large block reuses the memory of an earlier batch that nothing references any more, so its contents
    are undefined until written.
    """
    count, int64 = len(frames), np.dtype(np.int64)
    shape = (count, channels, max(frames, default=0))
    nbytes = count * channels * shape[2] * dtype.itemsize
    if get_worker_info() is None:
        if nbytes >= _POOL_MIN_BYTES:
            return torch.from_numpy(_POOL.take(nbytes).view(dtype).reshape(shape))
    elif nbytes:  # a fresh shared block costs system calls and page faults at any size
        block = blocks.take(_aligned(nbytes) + 2 * _aligned(count * 8))
        if block is not None:
            torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
            return torch.empty(0, dtype=torch_dtype).set_(block.untyped_storage(), 0, shape, _strides(shape))
    return _allocate([(shape, dtype), ((count,), int64), ((count,), int64)])[0]


def _in_place(audio: torch.Tensor, arrays: list[np.ndarray | None], in_rows: bool) -> bool:
    """Whether ``audio`` can be the batch of ``arrays``: each fits its row, where it is copied unless it was
    decoded there already (``in_rows``: the caller knows each is)."""
    block = audio.numpy()
    if audio.dtype not in (torch.float32, torch.int16) or block.ndim != 3 or block.shape[0] != len(arrays):
        return False
    if not in_rows and any(a is None or a.ndim != 2 or a.dtype != block.dtype or a.shape[0] != block.shape[1]
                           or a.shape[1] > block.shape[2] for a in arrays):
        return False
    # a new shared-memory block is created zero-filled; a reused one (either pool) is not
    recycled = not audio.is_shared() or blocks.is_pooled(audio)
    # the row check costs ~2 us a row (ctypes.data), which callers that decoded into the rows skip
    start, row_bytes = (0, 0) if in_rows else (block.ctypes.data, block.strides[0])
    for row, array in enumerate(arrays):
        assert array is not None
        if not in_rows:
            target = block[row, :, : array.shape[1]]
            if array.ctypes.data != start + row * row_bytes or array.strides != target.strides:
                target[...] = array
        if recycled:
            block[row, :, array.shape[1] :] = 0
    return True


def _pad_last_torch(tensors: list[torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding for tensors numpy cannot view (GPU, autograd, bfloat16), in torch."""
    lead = tensors[0].shape[:-1]
    if any(t.shape[:-1] != lead for t in tensors):
        raise OptionError(f"cannot batch field {name!r}: leading shapes differ across samples "
                          f"{sorted({tuple(t.shape[:-1]) for t in tensors})}")
    lengths = torch.tensor([t.shape[-1] for t in tensors], dtype=torch.int64)
    out = tensors[0].new_zeros((len(tensors), *lead, int(lengths.max())))
    for row, tensor in enumerate(tensors):
        out[row, ..., : tensor.shape[-1]] = tensor
    return out, lengths


def to_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """One sample with its numpy arrays as tensors (what an unbatched dataset yields)."""
    out: dict[str, Any] = {}
    for name, value in sample.items():
        tensor = _as_tensor(value)
        out[name] = value if tensor is None else tensor
    return out


def collate(samples: Sequence[dict[str, Any]], *, audio: torch.Tensor | None = None,
            in_rows: bool = False, columns: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Batch samples: ``audio`` becomes ``(B, C, T)`` zero-padded with ``lengths``; other array fields are
    padded along their last axis with ``{name}_lengths`` (0-d arrays are stacked into ``(B,)``); ``keys``
    and every other field become lists.

    An empty sequence gives an empty batch (``keys == []``, ``audio`` of shape ``(0, 1, 0)``).

    ``audio``, an :func:`audio_block` whose rows hold the samples' audio (decoded there), becomes the batch's
    audio as it is: no copy. A sample whose audio lies elsewhere is copied into its row; when one does not
    fit, ``audio`` is ignored and a new batch is made. ``in_rows`` tells that every sample's audio is the start
    of its row already (``decode_audio(..., out=audio[row])`` returned a view of the row): rows are then not
    compared, only their padding zeroed. ``columns`` are per-sample arrays of shape ``(B,)`` added as they are
    (after the samples' fields), in the same memory block.
    """
    if not samples:
        return {"audio": torch.zeros((0, 1, 0)), "lengths": torch.zeros(0, dtype=torch.int64),
                "sample_rate": torch.zeros(0, dtype=torch.int64), "keys": []}
    count = len(samples)
    batch: dict[str, Any] = {}
    fills: list[tuple[str, Any]] = []  # (output name, what to write): filled once the block is allocated
    specs: list[tuple[tuple[int, ...], np.dtype]] = []
    int64 = np.dtype(np.int64)
    for name in samples[0]:
        values = [sample.get(name) for sample in samples]
        if name == "key":
            batch["keys"] = values
            continue
        if name == "sample_rate":
            fills.append((name, np.asarray(values, dtype=np.int64)))
            specs.append(((count,), int64))
            continue
        arrays = [_as_array(v) for v in values]
        if name == "audio" and audio is not None and _in_place(audio, arrays, in_rows):
            batch["audio"] = audio
            fills.append(("lengths", np.array([a.shape[-1] for a in arrays if a is not None], dtype=np.int64)))
            specs.append(((count,), int64))
        elif all(a is not None and a.ndim > 0 for a in arrays):
            padded = [a for a in arrays if a is not None]
            lead = padded[0].shape[:-1]
            if any(a.shape[:-1] != lead for a in padded):
                shapes = sorted({a.shape[:-1] for a in padded})
                hint = " (pass mono=True to mix every sample to one channel)" if name == "audio" else ""
                raise OptionError(f"cannot batch field {name!r}: leading shapes differ across samples "
                                  f"{shapes}{hint}")
            sizes = np.array([a.shape[-1] for a in padded], dtype=np.int64)
            fills += [(name, padded), ("lengths" if name == "audio" else f"{name}_lengths", sizes)]
            specs += [((count, *lead, int(sizes.max())), padded[0].dtype), ((count,), int64)]
        elif all(a is not None and a.ndim == 0 for a in arrays):
            stacked = np.stack([a for a in arrays if a is not None])
            fills.append((name, stacked))
            specs.append((stacked.shape, stacked.dtype))
        elif all(isinstance(v, torch.Tensor) and v.ndim > 0 for v in values):
            padded_tensor, lengths = _pad_last_torch([v for v in values if isinstance(v, torch.Tensor)], name)
            batch[name] = padded_tensor
            batch["lengths" if name == "audio" else f"{name}_lengths"] = lengths
        else:
            batch[name] = values
    if audio is not None and batch.get("audio") is not audio:
        blocks.release(audio)  # the samples did not fit it: the batch is made elsewhere
    spare = audio if batch.get("audio") is audio else None
    pooled = spare is None and bool(fills) and fills[0][0] == "audio"  # samples collated in a worker
    for name, column in (columns or {}).items():
        fills.append((name, column))
        specs.append((column.shape, column.dtype))
    for (name, content), tensor in zip(fills, _allocate(specs, spare, pooled)):
        out = tensor.numpy()
        if isinstance(content, list):
            for row, array in enumerate(content):
                out[row, ..., : array.shape[-1]] = array
        else:
            out[...] = content
        batch[name] = tensor
    return blocks.outgoing(_ordered(batch, samples[0], list(columns or ())))


def _ordered(batch: dict[str, Any], first: dict[str, Any], last: list[str]) -> dict[str, Any]:
    """``batch`` with its fields in the order of the samples' fields (each followed by its lengths), then
    the fields named in ``last``."""
    order: list[str] = []
    for name in first:
        if name == "key":
            order.append("keys")
            continue
        order.append(name)
        order.append("lengths" if name == "audio" else f"{name}_lengths")
    return {name: batch[name] for name in [*order, *last] if name in batch}
