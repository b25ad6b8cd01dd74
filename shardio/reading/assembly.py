"""Assembly: one planned batch, from sample ids to collated tensors, in three passes over its samples.

The first pass reads each sample's tar bytes (a system call each); the second does each sample's small
work: check its tar members, read its audio header, parse its metadata; the third decodes the audio, each
sample straight into its row of the batch when the batch's shape is known from the index.

Why passes: decoding streams a sample's whole audio through the CPU caches, and a system call runs a good
deal of kernel code, and each evicts what the small per-sample work needs. Interleaved, that work runs
from cold caches: a 74-byte JSON member took 5.6 µs to parse alone and 15.5 µs after each conversion of
150 KB of PCM. Separate passes made a 16 kHz WAV batch about a quarter cheaper (``benchmarks/README.md``,
"The WAV path").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import FormatError, RangeNotSupported, ShardioError
from . import blocks
from .batchmemory import audio_rows, sample_row
from .collate import collate, collate_into, to_tensors
from .decode import EncodedAudio, decode_encoded, read_header
from .decodedcache import DecodedCache
from .fields import add_member_fields, check_field_names
from .lane import Lane
from .options import Decoding, Transform
from .pcm16 import decode_pcm16, decode_steps, to_float32, to_int16
from .reader import Reader

__all__ = ["Assembler", "Decoding", "Transform"]

logger = logging.getLogger(__name__)


def _key_seed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


_SCRATCH_SAMPLES = 2 << 20
"""The most int16 samples (4 MiB) an assembler keeps a buffer for, to decode 16-bit audio into for the decoded
cache: a new array for each sample costs its page faults."""

_Located = tuple[int, int, str, str, memoryview]
"""A sample read: its position in the batch's ids, its id, its key, its name in messages, its tar bytes."""


class _Prepared(NamedTuple):
    position: int  # in the batch's sample ids
    sample: dict[str, Any]  # every field but the audio and its rate
    audio: EncodedAudio
    members: dict[str, memoryview] | None  # its other members, kept in the decoded cache (None: no cache)


class Assembler:
    """Builds one process's batches with its :class:`Reader`.

    ``fields(sample_id)`` gives fields a sample has before its metadata (a mix adds its ``corpus``; ``None``:
    none). ``on_error="skip"`` leaves out (and logs, and counts in the reader's stats) samples that cannot be
    read or decoded; the batch's ``skipped`` lists them as ``"key: error"``, in batch order. ``in_worker``:
    whether the process is a DataLoader worker (its batches' memory is shared with the training process)."""

    def __init__(
        self,
        reader: Reader,
        decoding: Decoding,
        *,
        seed: int,
        batched: bool,
        on_error: str,
        fields: Callable[[int], dict[str, Any]] | None,
        in_worker: bool,
        cache: DecodedCache | None = None,
    ) -> None:
        self.reader = reader
        self.cache = cache if cache is not None and cache.on else None
        """The node's decoded cache that samples are read from and kept in (None: decoded on each read)."""
        self.in_worker = in_worker
        self.decoding = decoding
        self.seed = seed
        self.batched = batched
        self.on_error = on_error
        self.fields = fields
        self._scratch = np.empty(0, np.int16)  # a sample's int16 steps, on their way to the decoded cache
        self.lane = (
            Lane(reader, decoding.dtype, fields, self.general, in_worker, self.cache)
            if Lane.serves(reader, batched=batched, keeps_decoded_audio=decoding.keeps_decoded_audio)
            else None
        )
        """Where this process's batches may take the common case's :class:`~shardio.reading.lane.Lane`, the
        lane, which leaves the batches it cannot make to :meth:`general`: the first stop of a batch (``None``:
        this)."""

    def batch(self, ids: np.ndarray, epoch: int, repeats: np.ndarray | None = None) -> dict[str, Any]:
        """The batch of sample ids ``ids`` (one sample, not batched, when the dataset is unbatched): the
        lane's where it serves, else :meth:`general`'s."""
        return (
            self.general(ids, epoch, repeats) if self.lane is None else self.lane.batch(ids, epoch, repeats)
        )

    def general(self, ids: np.ndarray, epoch: int, repeats: np.ndarray | None = None) -> dict[str, Any]:
        """The batch of sample ids ``ids`` made by the general path, whatever the samples.

        ``repeats`` (a bool per id: planned repeats, see :mod:`shardio.planning.repeats`) becomes the batch's
        ``repeat`` field, a bool tensor over the samples it holds (a bool in an unbatched sample).
        """
        skipped: list[tuple[int, str]] = []
        located = self._located(ids.tolist(), skipped)
        prepared: Iterable[_Prepared]
        if self._in_passes(ids):
            prepared = list(self._prepared(list(located), skipped))
        else:
            # each sample read, prepared and decoded in turn: a batch of decompressed samples outgrows caches
            prepared = self._prepared(located, skipped)
        block, rows = self._audio_block(ids) if self.batched else (None, self._sample_rows(ids))
        samples: list[dict[str, Any]] = []
        kept: list[int] = []
        in_rows = rows is not None
        try:
            for position, sample, audio, members in prepared:
                try:
                    row = None if rows is None else rows[len(samples)]
                    # a failed sample's row is written again
                    samples.append(self._decode(sample, audio, epoch, row, int(ids[position]), members))
                except ShardioError as exc:
                    self._failed(position, int(ids[position]), exc, skipped)
                    continue
                kept.append(position)
                # decoded into its row (decode_encoded returns a view of `row`) or into an array of its own
                in_rows = in_rows and samples[-1]["audio"].base is rows
        except BaseException:
            blocks.release(block)
            raise
        self.reader.stats.samples += len(samples)
        flags = np.zeros(len(kept), dtype=bool) if repeats is None else np.asarray(repeats, dtype=bool)[kept]
        if self.batched:
            if skipped:
                blocks.release(block)
            batch = collate_into(
                samples, audio=block if not skipped else None, in_rows=in_rows, columns={"repeat": flags}
            )
        else:
            batch = to_tensors(samples[0]) if samples else collate([])
            if samples:
                batch["repeat"] = bool(flags[0])
        if "repeat" not in batch:
            batch["repeat"] = torch.zeros(0, dtype=torch.bool)
        batch["skipped"] = [text for _, text in sorted(skipped)]
        return blocks.outgoing(batch)

    def _in_passes(self, ids: np.ndarray) -> bool:
        """Whether to read every sample before preparing any: when each read is a view of a memory map,
        which costs nothing to hold."""
        shards = set(self.reader.index.columns["shard"][ids].tolist())
        return all(self.reader.maps(shard) for shard in shards)

    def _located(self, sample_ids: list[int], skipped: list[tuple[int, str]]) -> Iterator[_Located]:
        """Each sample that could be read, with its key, its name in messages and its tar bytes."""
        reader, keys = self.reader, self.reader.index.keys
        for position, sample_id in enumerate(sample_ids):
            try:
                key = keys.key(sample_id)
                where = reader.where(sample_id, key)
                data = reader.sample_bytes(sample_id, where)
            except ShardioError as exc:
                self._failed(position, sample_id, exc, skipped)
                continue
            yield position, sample_id, key, where, data

    def _prepared(self, located: Iterable[_Located], skipped: list[tuple[int, str]]) -> Iterator[_Prepared]:
        for position, sample_id, key, where, data in located:
            try:
                prepared = self._prepare(position, sample_id, key, where, data)
            except ShardioError as exc:
                self._failed(position, sample_id, exc, skipped)
                continue
            yield prepared

    def _failed(
        self, position: int, sample_id: int, exc: ShardioError, skipped: list[tuple[int, str]]
    ) -> None:
        """Raise ``exc`` again, or (``on_error="skip"``) log it and list the sample as skipped."""
        if self.on_error == "raise" or isinstance(exc, RangeNotSupported):  # that one fails every sample
            raise exc
        skipped.append((position, self._skip(sample_id, exc)))

    def _skip(self, sample_id: int, exc: ShardioError) -> str:
        key = self.reader.index.keys[sample_id]
        logger.warning("skipping sample %r: %s", key, exc)
        self.reader.stats.skip(exc)
        return f"{key}: {exc}"

    def _audio_block(self, ids: np.ndarray) -> tuple[torch.Tensor, np.ndarray] | tuple[None, None]:
        """The batch's audio sized from the index, for samples to decode straight into, and its numpy view;
        None when the decoded audio is not what the batch holds (mono mix, resampling, a transform) or the
        channels differ."""
        if not self.batched or not self.decoding.keeps_decoded_audio or ids.shape[0] == 0:
            return None, None
        columns = self.reader.index.columns
        channels = columns["channels"][ids].tolist()
        if channels.count(channels[0]) != len(channels):
            return None, None
        frames = columns["num_frames"][ids].tolist()
        return audio_rows(frames, channels[0], np.dtype(self.decoding.dtype), self.in_worker)

    def _sample_rows(self, ids: np.ndarray) -> np.ndarray | None:
        """For an unbatched dataset's sample, reused memory sized from the index to decode it into (as a batch
        of one row); None when its decoded audio is not what the sample holds."""
        if not self.decoding.keeps_decoded_audio or ids.shape[0] != 1:
            return None
        columns, sample_id = self.reader.index.columns, int(ids[0])
        frames, channels = int(columns["num_frames"][sample_id]), int(columns["channels"][sample_id])
        if frames <= 0 or channels <= 0:
            return None
        return sample_row(frames, channels, np.dtype(self.decoding.dtype))[None]

    def _prepare(self, position: int, sample_id: int, key: str, where: str, data: memoryview) -> _Prepared:
        """The middle pass over a sample, once its tar bytes are read: its members checked, its audio header
        and metadata read."""
        reader = self.reader
        index = reader.index
        members = reader.split_members(sample_id, data, where, key)
        ext = index.formats[int(index.columns["format"][sample_id])]
        if ext not in members:
            raise FormatError(f"{where}: no '{ext}' audio member, found {sorted(members)}")
        sample: dict[str, Any] = {
            "key": key,
            "audio": None,
            "sample_rate": None,
            **(self.fields(sample_id) if self.fields else {}),
        }
        if index.has_metadata:  # kept in the index (a NeMo dataset's manifest)
            metadata = index.metadata(sample_id)
            check_field_names(metadata, where)
            for name, value in metadata.items():
                sample.setdefault(name, value)
        add_member_fields(sample, members, where)
        columns = index.columns
        return _Prepared(
            position,
            sample,
            read_header(
                members[ext],
                ext,
                where=where,
                frames=int(columns["num_frames"][sample_id]),
                rate=int(columns["sample_rate"][sample_id]),
            ),
            None if self.cache is None else {name: data for name, data in members.items() if name != ext},
        )

    def _steps(self, audio: EncodedAudio, sample_id: int) -> tuple[np.ndarray, int] | None:
        """For the decoded cache, a sample's audio as the int16 steps its float32 decoding is exactly
        ``steps * 2**-15`` of (:func:`~shardio.reading.pcm16.decode_steps`: 16-bit sources), and its rate;
        None where that is not what :func:`~shardio.reading.decode.decode_encoded` makes of it (another
        source, or audio to mix or resample). The cache keeps them as they are: a float32 entry would be
        checked for being int16 steps before it is kept, about a tenth of FLAC decoding's CPU."""
        decoding, columns = self.decoding, self.reader.index.columns
        channels = int(columns["channels"][sample_id])
        if decoding.sample_rate not in (None, audio.rate) or (decoding.mono and channels != 1):
            return None
        frames, out = audio.frames or 0, None
        if 0 < channels * frames <= _SCRATCH_SAMPLES:  # a long recording gets an array of its own
            if self._scratch.size < channels * frames:
                self._scratch = np.empty(channels * frames, np.int16)
            out = self._scratch[: channels * frames].reshape(channels, frames)
        steps = decode_steps(audio, out)
        if steps is None or (decoding.mono and steps[0].shape[0] > 1):  # more channels than the index says
            return None
        return steps

    def _decode(
        self,
        sample: dict[str, Any],
        audio: EncodedAudio,
        epoch: int,
        row: np.ndarray | None,
        sample_id: int,
        members: dict[str, memoryview] | None = None,
    ) -> dict[str, Any]:
        """The last pass over a sample: its audio decoded (into ``row``, a batch row, when it fits) or read
        from the decoded cache (which keeps its other ``members`` with it), then the transform."""
        decoding, cache = self.decoding, self.cache
        int16 = decoding.dtype == "int16"
        if cache is not None and audio.layout is not None and decoding.keeps_decoded_audio:
            cache = None  # a WAV the fast path converts: as cheap as the cache
        entry = None if cache is None else cache.get(sample_id, row)
        if entry is not None:
            sample["audio"], sample["sample_rate"] = entry.audio, entry.rate
            if entry.final:
                return sample
        else:
            stored = decode_pcm16(audio, row) if int16 and decoding.keeps_decoded_audio else None
            if stored is not None:  # 16-bit PCM, as stored
                sample["audio"], sample["sample_rate"] = stored
                if cache is not None:
                    cache.put(sample_id, *stored, members)
                return sample
            steps = None if cache is None or cache.final else self._steps(audio, sample_id)
            if steps is not None and cache is not None:  # 16-bit: kept as decoded; float32 as decoded
                cache.put(sample_id, *steps, members)
                sample["audio"], sample["sample_rate"] = to_float32(steps[0], row), steps[1]
            else:
                sample["audio"], sample["sample_rate"] = decode_encoded(
                    audio,
                    mono=decoding.mono,
                    sample_rate=decoding.sample_rate,
                    check_finite=decoding.check_finite,
                    out=row,
                )
                if cache is not None and not cache.final:
                    cache.put(sample_id, sample["audio"], sample["sample_rate"], members)
        if decoding.transform is not None:
            key = sample["key"]
            sample = decoding.transform(sample, np.random.default_rng([self.seed, epoch, _key_seed(key)]))
        if int16:
            sample["audio"] = to_int16(sample["audio"])
            if cache is not None and cache.final and entry is None:
                cache.put(sample_id, sample["audio"], sample["sample_rate"], members)
        return sample
