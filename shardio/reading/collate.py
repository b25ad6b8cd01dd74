"""Collate: samples into one batch of padded tensors, lengths, keys and metadata lists.

Padding is done in numpy into buffers wrapped by ``torch.from_numpy`` (no copy): torch's own indexed copies
run on its intra-op thread pool, which on a small, busy machine cost 20-50x the copy itself (measured: 16
utterances of 1-5 s, 35-135 ms with torch on 2 threads, 1-3 ms in numpy). Where the tensors live is
:mod:`shardio.reading.batchmemory`'s choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import OptionError, shown
from ..planning.steps import loader_batching
from ..world import Context
from . import blocks
from .batchmemory import allocate, audio_block, clear_padding

__all__ = ["PLAIN_TYPES", "audio_block", "collate", "collate_into", "to_tensors"]


PLAIN_TYPES = frozenset({str, int, float, bool, type(None), list, dict})
"""Types of field values that are never arrays (so a field of only these is a list in the batch)."""


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


def _in_place(audio: torch.Tensor, arrays: list[np.ndarray | None], in_rows: bool) -> bool:
    """Whether ``audio`` can be the batch of ``arrays``: each fits its row, where it is copied unless it was
    decoded there already (``in_rows``: the caller knows each is)."""
    block = audio.numpy()
    if audio.dtype not in (torch.float32, torch.int16) or block.ndim != 3 or block.shape[0] != len(arrays):
        return False
    if not in_rows and any(
        a is None
        or a.ndim != 2
        or a.dtype != block.dtype
        or a.shape[0] != block.shape[1]
        or a.shape[1] > block.shape[2]
        for a in arrays
    ):
        return False
    # a new shared-memory block is created zero-filled; a reused one (either pool) is not
    if not in_rows:
        # the row check costs ~2 us a row (ctypes.data), which callers that decoded into the rows skip
        start, row_bytes = block.ctypes.data, block.strides[0]
        for row, array in enumerate(arrays):
            assert array is not None
            target = block[row, :, : array.shape[1]]
            if array.ctypes.data != start + row * row_bytes or array.strides != target.strides:
                target[...] = array
    clear_padding(audio, block, [array.shape[1] for array in arrays if array is not None])
    return True


def _pad_last_torch(tensors: list[torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Padding for tensors numpy cannot view (GPU, autograd, bfloat16), in torch."""
    lead = tensors[0].shape[:-1]
    if any(t.shape[:-1] != lead for t in tensors):
        raise OptionError(
            f"cannot batch field {name!r}: leading shapes differ across samples "
            f"{sorted({tuple(t.shape[:-1]) for t in tensors})}"
        )
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


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``collate_fn`` for samples of an unbatched dataset: ``DataLoader(ds, batch_size=16,
    collate_fn=shardio.collate)``. ``audio`` becomes ``(B, C, T)``, zero-padded, with ``lengths``; other
    array fields are padded along their last axis with ``{name}_lengths`` (0-d arrays are stacked into
    ``(B,)``); ``repeat`` becomes a bool tensor ``(B,)`` as in a batched dataset's batches (so
    ``~batch["repeat"]`` masks planned repeats either way); ``keys`` and every other field (``epoch`` and
    ``batch_index`` too) become lists.

    A field some samples lack is ``None`` in their rows of its list (a sample without ``audio`` while others
    have it is an :class:`~shardio.OptionError`). An empty sequence gives an empty batch (``keys == []``,
    ``audio`` of shape ``(0, 1, 0)``). In a DataLoader worker the batch is written into the worker's reused
    shared memory (never while the trainer holds it). Batches of a batched dataset are an
    :class:`~shardio.OptionError`: give the DataLoader ``batch_size=None``.

    Args:
        samples: The samples of an unbatched dataset.

    Returns:
        The batch, shaped as a batched dataset's.

    Raises:
        OptionError: Not a sequence of samples, or samples of a batched dataset, or (in a DataLoader
            worker) several samples of a dataset with `step_batches`, whose samples are its steps' batches.
    """
    if samples is None or isinstance(samples, (str, bytes, dict)) or not isinstance(samples, Sequence):
        raise OptionError(f"collate takes a list of samples (dicts), not {shown(samples)}")
    for position, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise OptionError(f"collate takes a list of samples (dicts); item {position} is {shown(sample)}")
    with_audio = [("audio" in sample) for sample in samples]
    if any(with_audio) and not all(with_audio):
        position = with_audio.index(False)
        raise OptionError(
            f"cannot batch field 'audio': sample {position} ({shown(samples[position].get('key'))}) "
            "has none, others have"
        )
    if samples and "keys" in samples[0] and "key" not in samples[0]:
        raise OptionError(
            f"collate batches single samples (a ShardDataset without batch_size or max_duration); "
            f"these are {len(samples)} batches of a batched dataset: give the DataLoader "
            "batch_size=None, which hands them over as they are"
        )
    if len(samples) > 1:
        _refuse_steps(len(samples))
    return collate_into(samples)


def _refuse_steps(samples: int) -> None:
    """An :class:`OptionError` where a DataLoader worker batches the samples of an unbatched dataset with
    ``step_batches`` (its samples are the steps' batches): in a worker, the dataset it batches is known."""
    context = Context.detect()
    if not context.in_worker or getattr(context.dataset, "batched", True) is not False:
        return
    step_batches = getattr(getattr(context.dataset, "batching", None), "step_batches", None)
    if type(step_batches) is int:
        raise OptionError(loader_batching(step_batches, samples, "shardio.collate in a DataLoader worker"))


def collate_into(
    samples: Sequence[dict[str, Any]],
    *,
    audio: torch.Tensor | None = None,
    in_rows: bool = False,
    columns: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """:func:`collate`, into the memory the caller has decoded the samples' audio into.

    ``audio``, an :func:`audio_block` whose rows hold the samples' audio (decoded there), becomes the batch's
    audio as it is: no copy. A sample whose audio lies elsewhere is copied into its row; when one does not
    fit, ``audio`` is ignored and a new batch is made. ``in_rows`` tells that every sample's audio is the
    start of its row already (``decode_audio(..., out=audio[row])`` returned a view of the row): rows are then
    not compared, only their padding zeroed. ``columns`` are per-sample arrays of shape ``(B,)`` added as they
    are (after the samples' fields), in the same memory block."""
    if not samples:
        return {
            "audio": torch.zeros((0, 1, 0)),
            "lengths": torch.zeros(0, dtype=torch.int64),
            "sample_rate": torch.zeros(0, dtype=torch.int64),
            "keys": [],
        }
    count = len(samples)
    batch: dict[str, Any] = {}
    fills: list[tuple[str, Any]] = []  # (output name, what to write): filled once the block is allocated
    specs: list[tuple[tuple[int, ...], np.dtype]] = []
    int64 = np.dtype(np.int64)
    # every sample's fields, not the first's
    names = dict.fromkeys(name for sample in samples for name in sample)
    for name in names:
        values = [sample.get(name) for sample in samples]
        if name == "key":
            batch["keys"] = values
            continue
        if name == "sample_rate":
            fills.append((name, np.asarray(values, dtype=np.int64)))
            specs.append(((count,), int64))
            continue
        if name == "repeat" and all(type(v) is bool for v in values) and "repeat" not in (columns or {}):
            fills.append((name, np.asarray(values, dtype=bool)))  # a bool tensor, as a batched dataset's
            specs.append(((count,), np.dtype(bool)))
            continue
        if PLAIN_TYPES.issuperset(map(type, values)):  # JSON's values: listed as they are
            batch[name] = values
            continue
        arrays = [_as_array(v) for v in values]
        if name == "audio" and audio is not None and _in_place(audio, arrays, in_rows):
            batch["audio"] = audio
            fills.append(
                ("lengths", np.array([a.shape[-1] for a in arrays if a is not None], dtype=np.int64))
            )
            specs.append(((count,), int64))
        elif all(a is not None and a.ndim > 0 for a in arrays):
            padded = [a for a in arrays if a is not None]
            lead = padded[0].shape[:-1]
            if any(a.shape[:-1] != lead for a in padded):
                shapes = sorted({a.shape[:-1] for a in padded})
                hint = " (pass mono=True to mix every sample to one channel)" if name == "audio" else ""
                raise OptionError(
                    f"cannot batch field {name!r}: leading shapes differ across samples {shapes}{hint}"
                )
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
    for (name, content), (tensor, out) in zip(fills, allocate(specs, spare, pooled)):
        if isinstance(content, list):
            for row, array in enumerate(content):
                out[row, ..., : array.shape[-1]] = array
                if pooled:  # reused memory: the padding may hold an earlier batch's
                    out[row, ..., array.shape[-1] :] = 0
        else:
            out[...] = content
        batch[name] = tensor
    return blocks.outgoing(_ordered(batch, names, list(columns or ())))


def _ordered(
    batch: dict[str, Any], first: dict[str, Any] | dict[str, None], last: list[str]
) -> dict[str, Any]:
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
