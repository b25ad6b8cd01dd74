"""Lane: a batch of the common case in fewer steps, or None to leave the batch to the general assembly.

The common case is how shardio packs speech: local shards (plain ``.tar`` read as views of their memory maps,
or compressed), integer PCM WAV that the decoder's header parser reads, audio decoded straight into the batch
(no mono mix, resampling or transform) as float32 or as stored 16-bit samples, and an index without
per-sample metadata. There the general path's layers (a sample's name in messages built before any error
could need it, a record per sample between the passes, the decoder's dispatch, collate's checks of each row
and of each field's values) cost a good part of what reading, checking and converting the samples does:
the lane makes a WAV batch ~10% cheaper (``benchmarks/ab.py``; ``benchmarks/README.md``).

The lane does the same work, in passes as the general path does (every sample's bytes, then each sample's
members, JSON and header, then the conversions into the batch's rows) where the reads are views of maps or
their decompressed frames are small, and builds the batch :func:`~shardio.reading.collate.collate` would:
``tests/reading/test_lane.py`` holds its batches equal to the general path's over generated datasets. It quits
at the first thing it does not expect (a remote shard, a failed read, a member of another key, JSON that
does not parse, a field collate would not list, a WAV header the parser leaves to soundfile, float samples,
which must be checked for NaN, a header that disagrees with the index) before it has counted or logged
anything, and the general path builds the whole batch: its errors, skips and messages stay the only ones.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import ShardioError
from . import blocks
from .batchmemory import audio_rows, columns_behind
from .collate import PLAIN_TYPES, clear_padding
from .decode import EncodedAudio
from .fields import add_member_fields
from .pcm16 import decode_pcm16
from .reader import Reader
from .wav import WavLayout, convert_wav, wav_layout

__all__ = ["Lane"]

_WAV = frozenset({"wav", "wave"})
PASS_BYTES = 32 << 20
"""Decompressed bytes a batch may hold at once to be read in passes (a few batches' worth of cache)."""


class _Unusual(Exception):
    """Something the lane leaves to the general path."""


_COLLATE_OWNS = frozenset({"keys", "lengths", "repeat"})
"""Names of a batch's own fields that a sample's field of the same name would meet in collate."""


class Lane:
    """The common case's batches (see the module) for one process's :class:`Reader`: ``dtype`` is the
    batch's audio dtype (``"float32"`` or ``"int16"``) and ``fields(sample_id)`` the fields a sample has
    before its members' (as :class:`~shardio.reading.assembly.Assembler` takes them)."""

    def __init__(self, reader: Reader, dtype: str, fields: Callable[[int], dict[str, Any]] | None) -> None:
        self.reader = reader
        self.int16 = dtype == "int16"
        self.fields = fields
        columns = reader.index.columns
        self._shard, self._format = columns["shard"], columns["format"]
        self._frames, self._channels, self._rate = columns["num_frames"], columns["channels"], columns["sample_rate"]
        self._member_offset, self._member_size = columns["member_offset"], columns["member_size"]

    @staticmethod
    def serves(reader: Reader, *, batched: bool, keeps_decoded_audio: bool) -> bool:
        """Whether a dataset's batches may take the lane at all (each batch may still leave it)."""
        return batched and keeps_decoded_audio and not reader.index.has_metadata

    def batch(self, ids: np.ndarray, repeats: np.ndarray | None) -> dict[str, Any] | None:
        """The collated batch of sample ids ``ids`` (with its ``repeat`` flags and an empty ``skipped``), as the
        general path would make it; None where the general path must make it."""
        count = len(ids)
        channels = self._channels[ids].tolist()
        if not count or channels.count(channels[0]) != count:
            return None
        formats = self.reader.index.formats
        exts = [formats[number] for number in self._format[ids].tolist()]
        if not _WAV.issuperset(exts):  # before any read: a FLAC dataset's batches leave at once
            return None
        sample_ids, frames = ids.tolist(), self._frames[ids].tolist()
        shape = (channels[0], max(frames))
        dtype = np.dtype(np.int16 if self.int16 else np.float32)
        samples: list[dict[str, Any]] = []
        audio: list[tuple[memoryview, WavLayout]] = []
        block: torch.Tensor | None = None
        try:
            if self._in_passes(ids):
                read = [self._read(sample_id) for sample_id in sample_ids]
                for sample_id, data, ext in zip(sample_ids, read, exts):
                    self._prepare(sample_id, data, ext, shape, samples, audio)
                _check_fields(samples)
                block, rows = audio_rows(frames, shape[0], dtype)
                rates = [self._decode(row, sample, encoded) for row, sample, encoded in zip(rows, samples, audio)]
            else:  # each read, prepared and decoded in turn
                block, rows = audio_rows(frames, shape[0], dtype)
                rates = []
                for sample_id, ext, row in zip(sample_ids, exts, rows):
                    self._prepare(sample_id, self._read(sample_id), ext, shape, samples, audio)
                    rates.append(self._decode(row, samples[-1], audio[-1]))
                _check_fields(samples)
            lengths = [layout.frames for _, layout in audio]
            if rates != self._rate[ids].tolist() or any(map(operator.gt, lengths, frames)):
                raise _Unusual  # a sample unlike its index record: the general path names it
            clear_padding(block, rows, lengths)
        except BaseException as exc:
            blocks.release(block)
            if isinstance(exc, _Unusual):
                return None
            raise
        self.reader.stats.samples += count
        flags = np.zeros(count, dtype=bool) if repeats is None else np.array(repeats, dtype=bool)  # a copy
        return self._collated(samples, block, lengths, rates, flags)

    def _in_passes(self, ids: np.ndarray) -> bool:
        """Whether to read every sample of the batch before preparing any (the general path's passes, see
        :mod:`~shardio.reading.assembly`): where each read is a view of a memory map, or the frames it
        decompresses to hold (at most each sample's frame up to its end) are at most :data:`PASS_BYTES`.
        Decompressed WAV zstd-3 batches were ~7% cheaper so (``benchmarks/ab.py``)."""
        if all(map(self.reader.maps, set(self._shard[ids].tolist()))):
            return True
        held = self._member_offset[ids].sum(dtype=np.int64) + self._member_size[ids].sum(dtype=np.int64)
        return int(held) <= PASS_BYTES

    def _read(self, sample_id: int) -> memoryview:
        data = self.reader.local_bytes(sample_id)
        if data is None:
            raise _Unusual
        return data

    def _prepare(self, sample_id: int, data: memoryview, ext: str, shape: tuple[int, int],
                 samples: list[dict[str, Any]], audio: list[tuple[memoryview, WavLayout]]) -> None:
        """The middle pass over a sample whose audio member is ``ext``: its dict (key and member fields) to
        ``samples``, its audio member with its layout to ``audio``, when the layout fits a row of ``shape``
        (channels, frames)."""
        reader = self.reader
        key = reader.index.keys.key(sample_id)
        try:
            members = reader.split_members(sample_id, data, key, key)
            view = members[ext]
            sample: dict[str, Any] = {"key": key, "audio": None, "sample_rate": None,
                                  **(self.fields(sample_id) if self.fields else {})}
            add_member_fields(sample, members, key)
        except (ShardioError, KeyError):
            raise _Unusual from None
        layout = wav_layout(view)
        if layout is None or not 0 < layout.frames <= shape[1] or layout.channels != shape[0] \
                or layout.scale == 1.0 or (self.int16 and layout.dtype != "<i2"):
            raise _Unusual
        samples.append(sample)
        audio.append((view, layout))

    def _decode(self, row: np.ndarray, sample: dict[str, Any], encoded: tuple[memoryview, WavLayout]) -> int:
        """Decode a sample's audio into its ``row`` of the batch; its rate."""
        view, layout = encoded
        if self.int16:
            stored = decode_pcm16(EncodedAudio(view, "wav", sample["key"], layout), row)
            assert stored is not None  # 16-bit PCM: _prepare saw to it
            sample["audio"], rate = stored
        else:
            sample["audio"], rate, _ = convert_wav(view, layout, row)
        return rate

    @staticmethod
    def _collated(samples: list[dict[str, Any]], block: torch.Tensor, lengths: list[int], rates: list[int],
                  flags: np.ndarray) -> dict[str, Any]:
        """The batch :func:`~shardio.reading.collate.collate` makes of ``samples`` (decoded into the rows of
        ``block``) with the ``repeat`` column ``flags``, and an empty ``skipped``: what it does with fields of
        plain values (lists), in its order (see :func:`_check_fields`), its small tensors behind the audio."""
        int64 = np.dtype(np.int64)
        tensors = columns_behind(block, {"lengths": np.array(lengths, int64), "sample_rate": np.array(rates, int64),
                                         "repeat": flags})
        batch: dict[str, Any] = {"keys": [sample["key"] for sample in samples], "audio": block,
                                 "lengths": tensors["lengths"], "sample_rate": tensors["sample_rate"]}
        for name in _field_names(samples):
            batch[name] = [sample.get(name) for sample in samples]
        batch["repeat"] = tensors["repeat"]
        batch = blocks.outgoing(batch)
        batch["skipped"] = []
        return batch


def _field_names(samples: list[dict[str, Any]]) -> list[str]:
    """The fields collate gives the batch besides key, audio and rate, in its order: every sample's, as first
    met, except that a field ``{name}_lengths`` follows ``name`` (where collate puts a lengths column)."""
    if all(sample.keys() == samples[0].keys() for sample in samples):  # the common case: the same fields
        names = list(samples[0])[3:]
    else:
        names = list(dict.fromkeys(name for sample in samples for name in sample))[3:]
    if not any(name.endswith("_lengths") for name in names):
        return names
    ordered: dict[str, None] = {}
    for name in names:
        ordered[name] = None
        if f"{name}_lengths" in names:
            ordered[f"{name}_lengths"] = None
    return list(ordered)


def _check_fields(samples: list[dict[str, Any]]) -> None:
    """That the fields collate gives the batch (:func:`_field_names`) are lists of plain values, none named as a
    field of the batch's own."""
    names = _field_names(samples)
    if not _COLLATE_OWNS.isdisjoint(names) \
            or any(not PLAIN_TYPES.issuperset([type(sample.get(name)) for sample in samples]) for name in names):
        raise _Unusual
