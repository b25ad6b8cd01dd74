"""WeNet's sample dicts from shardio batches: what WeNet's shard reader yields, for its processors.

WeNet's ``data_type: shard`` pipeline reads a tar's members into one dict per utterance, ``{"key", "txt",
"wav", "sample_rate"}`` (``wav`` the decoded ``(channels, frames)`` float32 tensor in [-1, 1], ``txt`` the
``.txt`` member decoded and stripped), and hands those to its processors (``compute_fbank``, ``tokenize``,
``filter``, ...) and ``padding``. A dataset indexed with ``shardio index --wenet-list data.list``
(:mod:`shardio.integrations.importers.wenet_index`) reads through ``ShardDataset`` as planned, resumable
batches; :func:`wenet_samples` turns one into those dicts, so WeNet's processors run unchanged after it
(recipe: ``docs/trainers/wenet.md``). WeNet itself is not needed here, and nothing is imported from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import OptionError, shown

__all__ = ["wenet_sample", "wenet_samples"]

_INT16_SCALE = 1.0 / (1 << 15)


def _wav(audio: torch.Tensor) -> torch.Tensor:
    """``audio`` as WeNet's ``torchaudio.load`` gives it: float32 in [-1, 1], a tensor of its own (a batch's
    memory may be reused for a later batch)."""
    if audio.dtype == torch.int16:
        return audio.to(torch.float32) * _INT16_SCALE
    if audio.dtype != torch.float32:
        raise OptionError(f"WeNet's samples hold float32 audio; this batch's audio is {audio.dtype}")
    return audio.clone()


def _with_fields(sample: dict[str, Any], text: object) -> dict[str, Any]:
    if text is not None:
        if not isinstance(text, str):
            raise OptionError(f"a sample's text is {shown(text)}, expected a string (its .txt member)")
        sample["txt"] = text.strip()
    return sample


def wenet_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """One shardio sample (a ``ShardDataset`` without batching) as WeNet's sample dict.

    Args:
        sample: A sample: ``key``, ``audio`` ``(C, T)``, ``sample_rate`` and, when the shard has a ``.txt``
            member, ``text``.

    Returns:
        ``{"key", "wav", "sample_rate"}`` and ``"txt"`` (stripped, as WeNet strips it) when the sample has
        text: ``wav`` a float32 ``(C, T)`` tensor in [-1, 1].

    Raises:
        OptionError: Audio that is neither float32 nor int16, or text that is not a string.
    """
    audio = sample["audio"]
    if not isinstance(audio, torch.Tensor) or audio.dim() != 2:
        raise OptionError(f"a sample's audio is {shown(audio)}, expected a (channels, frames) tensor")
    out = {"key": sample["key"], "wav": _wav(audio), "sample_rate": int(sample["sample_rate"])}
    return _with_fields(out, sample.get("text"))


def wenet_samples(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A shardio batch as WeNet's sample dicts, one per sample in the batch's order (padding cut off).

    Args:
        batch: A batch of a ``ShardDataset`` (``keys``, ``audio`` ``(B, C, T)``, ``lengths``,
            ``sample_rate`` and, when the shards have ``.txt`` members, ``text``).

    Returns:
        One dict per sample as :func:`wenet_sample` makes it; the batch's own fields (``epoch``,
        ``batch_index``: what ``ds.state_after(batch)`` needs) stay in ``batch``.

    Raises:
        OptionError: Audio that is neither float32 nor int16, or text that is not a string.
    """
    audio, lengths, rates = batch["audio"], batch["lengths"], batch["sample_rate"]
    texts = batch.get("text") or [None] * len(batch["keys"])
    if not isinstance(audio, torch.Tensor) or audio.dim() != 3:
        raise OptionError(f"a batch's audio is {shown(audio)}, expected a (batch, channels, frames) tensor")
    return [
        _with_fields(
            {"key": key, "wav": _wav(audio[row, :, : int(lengths[row])]), "sample_rate": int(rates[row])},
            texts[row],
        )
        for row, key in enumerate(batch["keys"])
    ]
