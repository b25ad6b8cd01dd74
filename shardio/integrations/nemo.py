"""NeMo ASR models trained on shardio batches (``shardio[nemo]``): the batch NeMo's models take.

A NeMo model is a Lightning module: ``ShardioCallback`` (:mod:`shardio.integrations.lightning`) saves and
resumes the loader in NeMo's Lightning checkpoint as it does for any module. What NeMo adds is the shape of a
training batch: its audio-to-text datasets collate ``(audio_signal, audio_signal_length, transcript,
transcript_length)``, which :func:`nemo_batch` makes of a shardio batch. Nothing of NeMo is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import OptionError, shown

__all__ = ["nemo_batch"]


def nemo_batch(
    batch: Mapping[str, Any], tokenize: Callable[[str], Sequence[int]], *, text_field: str = "text"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A shardio batch as NeMo's audio-to-text batch.

    Args:
        batch: A batch of a ``ShardDataset`` of mono audio (``audio`` ``(B, 1, T)``, ``lengths``, and the
            transcripts in ``text_field``).
        tokenize: A transcript's token ids: the model's ``tokenizer.text_to_ids`` (a BPE model), or a
            lookup in its ``decoder.vocabulary`` (a character model).
        text_field: The batch field holding the transcripts.

    Returns:
        ``(audio_signal (B, T) float32, audio_signal_length (B,), transcript (B, L) int64 zero-padded,
        transcript_length (B,))``.

    Raises:
        OptionError: Audio with more than one channel (give the dataset ``Decoding(mono=True)``), or a batch
            without transcripts.
    """
    audio = batch["audio"]
    if audio.dim() != 3 or audio.shape[1] != 1:
        raise OptionError(f"NeMo takes mono audio; this batch's audio has shape {tuple(audio.shape)}")
    texts = batch.get(text_field)
    if texts is None:
        raise OptionError(f"the batch has no {shown(text_field)} field of transcripts")
    tokens = [torch.tensor(list(tokenize(text)), dtype=torch.int64) for text in texts]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int64)
    transcript = torch.zeros((len(tokens), max((len(t) for t in tokens), default=0)), dtype=torch.int64)
    for row, ids in enumerate(tokens):
        transcript[row, : len(ids)] = ids
    return audio[:, 0], batch["lengths"], transcript, lengths
