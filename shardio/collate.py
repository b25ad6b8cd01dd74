"""Collate: samples into one batch of padded tensors, lengths, keys and metadata lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .errors import OptionError

__all__ = ["collate", "to_tensors"]


def _as_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
        return torch.from_numpy(np.ascontiguousarray(value))
    return None


def _pad_last(tensors: list[torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = {t.shape[:-1] for t in tensors}
    if len(shapes) != 1:
        hint = " (pass mono=True to mix every sample to one channel)" if name == "audio" else ""
        raise OptionError(f"cannot batch field {name!r}: leading shapes differ across samples {sorted(shapes)}"
                          f"{hint}")
    lengths = torch.tensor([t.shape[-1] for t in tensors], dtype=torch.int64)
    out = tensors[0].new_zeros((len(tensors), *tensors[0].shape[:-1], int(lengths.max())))
    for row, tensor in enumerate(tensors):
        out[row, ..., : tensor.shape[-1]] = tensor
    return out, lengths


def to_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """One sample with its numpy arrays as tensors (what an unbatched dataset yields)."""
    return {name: (_as_tensor(value) if _as_tensor(value) is not None else value) for name, value in sample.items()}


def collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Batch samples: ``audio`` becomes ``(B, C, T)`` zero-padded with ``lengths``; other array fields are
    padded along their last axis with ``{name}_lengths``; ``keys`` and every other field become lists.

    An empty sequence gives an empty batch (``keys == []``, ``audio`` of shape ``(0, 1, 0)``).
    """
    if not samples:
        return {"audio": torch.zeros((0, 1, 0)), "lengths": torch.zeros(0, dtype=torch.int64),
                "sample_rate": torch.zeros(0, dtype=torch.int64), "keys": []}
    batch: dict[str, Any] = {}
    for name in samples[0]:
        values = [sample.get(name) for sample in samples]
        tensors = [_as_tensor(v) for v in values]
        if name == "key":
            batch["keys"] = values
        elif name == "sample_rate":
            batch["sample_rate"] = torch.tensor(values, dtype=torch.int64)
        elif all(t is not None for t in tensors):
            padded, lengths = _pad_last([t for t in tensors if t is not None], name)
            batch[name] = padded
            batch["lengths" if name == "audio" else f"{name}_lengths"] = lengths
        else:
            batch[name] = values
    return batch
