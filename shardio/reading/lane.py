"""Lane: a batch of the common case in fewer steps, each taking the whole batch; else the general assembly's.

The common case is how shardio packs speech: local shards (plain ``.tar`` read as views of their memory maps,
or compressed), integer PCM WAV that the decoder's header parser reads, audio decoded straight into the batch
(no mono mix, resampling or transform) as float32 or as stored 16-bit samples, and an index without
per-sample metadata. There the general path's layers (a sample's name in messages built before any error
could need it, a record per sample between the passes, the decoder's dispatch, collate's checks of each row
and of each field's values) cost a good part of what reading, checking and converting the samples does:
the lane makes a WAV batch ~10% cheaper (``benchmarks/ab.py``; ``benchmarks/README.md``).

The lane does the same work, in passes as the general path does, each one call for the batch: its keys
(:meth:`~shardio.shards.keys.Keys.keys_of`), its samples' bytes (views of each shard's map, a shard at a time:
:meth:`~shardio.storage.localshard.LocalShard.views`; the shards stay open for the iteration), their members
(:func:`~shardio.shards.tarformat.split_samples`), JSON and text
(:func:`~shardio.reading.fields.add_batch_fields`) and WAV headers (:func:`~shardio.reading.wav.wav_layouts`),
then the conversions into the batch's rows (:func:`~shardio.reading.wav.decode_rows`). Compressed shards'
samples are read one by one, and taken in passes where their decompressed frames are small. It builds the
batch :func:`~shardio.reading.collate.collate` would: ``tests/reading/test_lane.py`` holds its batches equal
to the general path's over generated datasets. It quits at the first thing it does not expect (a remote shard,
a failed read, a member of another key, JSON that does not parse, a field collate would not list, a WAV header
the parser leaves to soundfile, float samples, which must be checked for NaN, a header that disagrees with the
index) before it has counted or logged anything, and the general path builds the whole batch: its errors,
skips and messages stay the only ones.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import FormatError, ShardioError
from ..shards.keys import Keys
from ..shards.tarformat import split_samples
from ..storage.localshard import LocalShard
from . import blocks
from .batchmemory import audio_rows, clear_padding, columns_behind
from .collate import PLAIN_TYPES
from .decodedcache import DecodedCache
from .fields import add_batch_fields
from .reader import Reader
from .wav import WavLayout, decode_rows, wav_layouts

__all__ = ["Lane"]

_WAV = frozenset({"wav", "wave"})
PASS_BYTES = 32 << 20
"""Decompressed bytes a batch may hold at once to be read in passes (a few batches' worth of cache)."""


class _Unusual(Exception):
    """Something the lane leaves to the general path."""


_COLLATE_OWNS = frozenset({"keys", "lengths", "repeat"})
"""Names of a batch's own fields that a sample's field of the same name would meet in collate."""

General = Callable[[np.ndarray, int, "np.ndarray | None"], dict[str, Any]]
"""The general path's ``batch(ids, epoch, repeats)`` (:meth:`~shardio.reading.assembly.Assembler.general`)."""


class Lane:
    """The common case's batches (see the module) for one process's :class:`Reader`, made in the process that
    iterates (it keeps the shards it reads open, and knows whether it is a DataLoader worker): ``dtype`` is
    the batch's audio dtype (``"float32"`` or ``"int16"``), ``fields(sample_id)`` the fields a sample has
    before its members' (as :class:`~shardio.reading.assembly.Assembler` takes them), and ``general`` makes
    the batches the lane leaves."""

    def __init__(
        self,
        reader: Reader,
        dtype: str,
        fields: Callable[[int], dict[str, Any]] | None,
        general: General,
        in_worker: bool,
        cache: DecodedCache | None = None,
    ) -> None:
        self.reader = reader
        self.cache = cache
        """The decoded cache whose entries stand in for audio the lane does not decode (FLAC, ...)."""
        self.int16 = dtype == "int16"
        self.fields = fields
        self.general = general
        index = reader.index
        self._formats, columns = index.formats, index.columns
        try:
            self._keys: Keys | None = index.keys
        except FormatError:  # an index without keys: the general path says so, sample by sample
            self._keys = None
        self._shard, self._format = columns["shard"], columns["format"]
        self._frames, self._channels, self._rate = (
            columns["num_frames"],
            columns["channels"],
            columns["sample_rate"],
        )
        self._offset, self._member_offset = columns["frame_offset"], columns["member_offset"]
        self._member_size = columns["member_size"]
        self._in_worker = in_worker
        # shard -> open, its samples views of its map (None: not)
        self._shards: dict[int, LocalShard | None] = {}

    @staticmethod
    def serves(reader: Reader, *, batched: bool, keeps_decoded_audio: bool) -> bool:
        """Whether a dataset's batches may take the lane at all (each batch may still leave it)."""
        return batched and keeps_decoded_audio and not reader.index.has_metadata

    def batch(self, ids: np.ndarray, epoch: int, repeats: np.ndarray | None = None) -> dict[str, Any]:
        """The batch of sample ids ``ids`` in epoch ``epoch`` with its ``repeat`` flags: the lane's
        (:meth:`common`), else the general path's."""
        made = self.common(ids, repeats)
        return made if made is not None else self.general(ids, epoch, repeats)

    def common(self, ids: np.ndarray, repeats: np.ndarray | None) -> dict[str, Any] | None:
        """The collated batch of sample ids ``ids`` (with its ``repeat`` flags and an empty ``skipped``), as
        the general path would make it; None where the general path must make it."""
        count = len(ids)
        channels = self._channels[ids].tolist()
        if not count or self._keys is None or channels.count(channels[0]) != count:
            return None
        exts = [self._formats[number] for number in self._format[ids].tolist()]
        # before any read: a FLAC dataset's batches leave at once, unless the decoded cache holds them
        cached = not _WAV.issuperset(exts)
        if cached and (self.cache is None or not self.cache.holds(ids)):
            return None
        frames = self._frames[ids].tolist()
        shape = (channels[0], max(frames))
        dtype = np.dtype(np.int16 if self.int16 else np.float32)
        block: torch.Tensor | None = None
        samples: list[dict[str, Any]] = []
        audio: list[tuple[memoryview, WavLayout]] = []
        try:
            keys = self._keys.keys_of(ids)
            views = None if cached else self._mapped(ids)
            if cached:  # audio and members from the decoded cache: the shard is not read
                block, rows = audio_rows(frames, shape[0], dtype, self._in_worker)
                lengths, rates, members = self._from_cache(ids, rows)
                samples = self._samples(ids, keys, members)
            elif views is None and not self._in_passes(ids):  # each read, prepared and decoded in turn
                block, rows = audio_rows(frames, shape[0], dtype, self._in_worker)
                for position, sample_id in enumerate(ids.tolist()):
                    one = slice(position, position + 1)
                    prepared = self._prepared(ids[one], keys[one], [self._read(sample_id)], exts[one], shape)
                    decode_rows(prepared[1], rows[one])
                    samples += prepared[0]
                    audio += prepared[1]
            else:  # in passes: every sample read, then every one prepared, then decoded
                if views is None:
                    views = [self._read(sample_id) for sample_id in ids.tolist()]
                samples, audio = self._prepared(ids, keys, views, exts, shape)
                block, rows = audio_rows(frames, shape[0], dtype, self._in_worker)
                decode_rows(audio, rows)
            if not cached:
                lengths = [layout.frames for _, layout in audio]
                rates = [layout.sample_rate for _, layout in audio]
            _check_fields(samples)
            if rates != self._rate[ids].tolist() or any(map(operator.gt, lengths, frames)):
                raise _Unusual  # a sample unlike its index record: the general path names it
            clear_padding(block, rows, lengths)
        except BaseException as exc:
            blocks.release(block)
            if isinstance(exc, (_Unusual, ShardioError)):
                return None
            raise
        self.reader.stats.samples += count
        flags = np.zeros(count, dtype=bool) if repeats is None else np.array(repeats, dtype=bool)  # a copy
        return self._collated(samples, block, lengths, rates, flags)

    def _mapped(self, ids: np.ndarray) -> list[memoryview] | None:
        """The tar bytes of each sample, views of the maps of their plain local shards, taken a shard at a
        time; None where a shard is not read so (compressed, or where the kernel cannot map it)."""
        shards = self._shard[ids]
        offsets, sizes = self._offset[ids], self._member_size[ids]
        views: list[Any] = [None] * len(ids)
        for shard in dict.fromkeys(shards.tolist()):
            handle = self._shards.get(shard)
            if handle is None and shard in self._shards:  # a shard read sample by sample
                return None
            if handle is None or handle.closed:  # not seen yet, or closed by the reader since: opened again
                handle = self._shards[shard] = self.reader.local_shard(shard)
                if handle is None:
                    return None
            at = np.flatnonzero(shards == shard)
            found = handle.views(offsets[at].tolist(), sizes[at].tolist(), "")
            if found is None or len(at) == len(ids):
                return found
            for position, view in zip(at.tolist(), found):
                views[position] = view
        return views

    def _from_cache(
        self, ids: np.ndarray, rows: np.ndarray
    ) -> tuple[list[int], list[int], list[dict[str, memoryview]]]:
        """The decoded cache's entries of samples ``ids`` written into ``rows``; their lengths, rates and
        other members."""
        lengths, rates, members = [], [], []
        for sample_id, row in zip(ids.tolist(), rows):
            entry = self.cache.get(sample_id, row)  # type: ignore[union-attr]  # only with a cache
            if entry is None or not entry.in_out or entry.members is None:  # changed since holds(), or not
                raise _Unusual  # written into its row
            lengths.append(entry.audio.shape[1])
            rates.append(entry.rate)
            members.append(entry.members)
        return lengths, rates, members

    def _in_passes(self, ids: np.ndarray) -> bool:
        """Whether to read every sample of a batch of compressed shards before preparing any (the general
        path's passes, see :mod:`~shardio.reading.assembly`): where the frames it decompresses to hold (at
        most each sample's frame up to its end) are at most :data:`PASS_BYTES`. Decompressed WAV zstd-3
        batches were ~7% cheaper so (``benchmarks/ab.py``)."""
        held = self._member_offset[ids].sum(dtype=np.int64) + self._member_size[ids].sum(dtype=np.int64)
        return int(held) <= PASS_BYTES

    def _read(self, sample_id: int) -> memoryview:
        data = self.reader.local_bytes(sample_id)
        if data is None:
            raise _Unusual
        return data

    def _prepared(
        self,
        ids: np.ndarray,
        keys: list[str],
        views: list[memoryview],
        exts: list[str],
        shape: tuple[int, int],
    ) -> tuple[list[dict[str, Any]], list[tuple[memoryview, WavLayout]]]:
        """The middle pass over samples ``ids`` whose tar bytes are ``views`` and audio members ``exts``:
        their dicts (:meth:`_samples`), and their audio members with their layouts, which must fit rows of
        ``shape`` (channels, frames)."""
        members = split_samples(views, keys, "")
        samples = self._samples(ids, keys, members)
        audio = [found.get(ext) for found, ext in zip(members, exts)]
        if None in audio:
            raise _Unusual
        layouts = wav_layouts(audio)  # type: ignore[arg-type]  # no None left
        for layout in layouts:
            if (
                layout is None
                or not 0 < layout.frames <= shape[1]
                or layout.channels != shape[0]
                or layout.scale == 1.0
                or (self.int16 and layout.dtype != "<i2")
            ):
                raise _Unusual
        return samples, list(zip(audio, layouts))  # type: ignore[arg-type]  # checked above

    def _samples(
        self, ids: np.ndarray, keys: list[str], members: list[dict[str, memoryview]]
    ) -> list[dict[str, Any]]:
        """The dicts of samples ``ids`` (key, fields, and the fields of their ``members``), audio to come."""
        fields = self.fields
        samples = [
            {"key": key, "audio": None, "sample_rate": None, **(fields(sample_id) if fields else {})}
            for key, sample_id in zip(keys, ids.tolist())
        ]
        add_batch_fields(samples, members, "")
        return samples

    def _collated(
        self,
        samples: list[dict[str, Any]],
        block: torch.Tensor,
        lengths: list[int],
        rates: list[int],
        flags: np.ndarray,
    ) -> dict[str, Any]:
        """The batch :func:`~shardio.reading.collate.collate` makes of ``samples`` (decoded into the rows of
        ``block``) with the ``repeat`` column ``flags``, and an empty ``skipped``: what it does with fields of
        plain values (lists), in its order (see :func:`_check_fields`), its small tensors behind the audio."""
        int64 = np.dtype(np.int64)
        tensors = columns_behind(
            block,
            {"lengths": np.array(lengths, int64), "sample_rate": np.array(rates, int64), "repeat": flags},
            self._in_worker,
        )
        batch: dict[str, Any] = {
            "keys": [sample["key"] for sample in samples],
            "audio": block,
            "lengths": tensors["lengths"],
            "sample_rate": tensors["sample_rate"],
        }
        for name in _field_names(samples):
            batch[name] = [sample.get(name) for sample in samples]
        batch["repeat"] = tensors["repeat"]
        # a batch in a worker's shared block travels as one (the iterating process's never do)
        if self._in_worker:
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
    """That the fields collate gives the batch (:func:`_field_names`) are lists of plain values, none named as
    a field of the batch's own."""
    names = _field_names(samples)
    if not _COLLATE_OWNS.isdisjoint(names) or any(
        not PLAIN_TYPES.issuperset([type(sample.get(name)) for sample in samples]) for name in names
    ):
        raise _Unusual
