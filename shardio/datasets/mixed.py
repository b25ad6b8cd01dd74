"""MixedDataset: a ShardDataset over several corpora mixed by weight, planned by :mod:`shardio.planning.mix`.

Every sample and batch records its corpus; one state (with every index fingerprint and the mix options)
describes the whole mix, with the same resume and equal-batch guarantees as a single corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import OptionError, shown
from ..planning.mix import CorpusColumns, check_epoch_size, corpus_offsets
from ..planning.mixoptions import EpochSize, Mix
from ..planning.plan import Batching, Ordering
from ..planning.planner import Planner
from ..reading.options import Decoding, Reading
from ..shards.chained import ChainedColumn
from ..shards.index import COLUMNS, Index, ShardInfo, ShardTable
from ..shards.keys import ChainedKeys, Keys
from ..storage.files import join
from ..world import World
from .dataset import ShardDataset
from .options import option_groups

__all__ = ["MixIndex", "MixedDataset"]

logger = logging.getLogger(__name__)


@dataclass
class MixIndex(Index):
    """Several indexes as one: columns chained in corpus-name order (views of each corpus's columns, never a
    concatenated copy: :class:`~shardio.shards.chained.ChainedColumn`), shards named by full location.

    Global sample id ``offsets[c] + i`` is sample ``i`` of corpus ``names[c]``; keys load lazily from the
    parts. The fingerprint hashes the corpus names and their index fingerprints. Pickled (for a DataLoader
    worker), it carries its parts, each by reference to its mapped columns file.
    """

    names: list[str] = field(default_factory=list)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    shard_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    parts: list[Index] = field(default_factory=list, repr=False)
    format_tables: list[np.ndarray] = field(default_factory=list, repr=False)
    """Per corpus: its format numbers' numbers in the mix's ``formats``."""

    @classmethod
    def combine(cls, indexes: Mapping[str, Index]) -> MixIndex:
        """The combined index of ``indexes`` (name to index)."""
        names = sorted(indexes)
        formats: list[str] = []
        shards: list[ShardInfo] = []
        tables = []
        for name in names:
            index = indexes[name]
            tables.append(np.array([_position(formats, ext) for ext in index.formats] or [0], dtype=np.uint8))
            shards += [replace(s, name=join(index.root, s.name)) for s in index.shards]
        remote = [indexes[n].storage_options for n in names if indexes[n].storage_options is not None]
        fingerprint = hashlib.sha256(
            json.dumps([[n, indexes[n].fingerprint] for n in names]).encode()
        ).hexdigest()
        combined = cls(
            root="",
            shards=shards,
            formats=formats,
            columns={},
            fingerprint=fingerprint[:32],
            names=names,
            offsets=corpus_offsets([len(indexes[n]) for n in names]),
            shard_offsets=corpus_offsets([len(indexes[n].shards) for n in names]),
            parts=[indexes[n] for n in names],
            format_tables=tables,
            storage_options=remote[0] if remote else None,
        )
        combined.columns = combined._chained()
        return combined

    def __post_init__(self) -> None:
        super().__post_init__()
        kinds = [part.remote for part in self.parts]
        self.remote = any(kinds)
        # per shard, where the corpora are of both kinds (a byte a shard; a look-up per sample read)
        self._shard_remote = np.repeat(kinds, np.diff(self.shard_offsets)) if len(set(kinds)) > 1 else None

    def is_remote(self, shard: int) -> bool:
        """Whether a shard is a remote object: whether its corpus's is.

        Args:
            shard: The shard's number in the mix.

        Returns:
            Whether the corpus holding the shard has a URL for its root.
        """
        return self.remote if self._shard_remote is None else bool(self._shard_remote[shard])

    @property
    def content_id(self) -> str:
        """The corpus names and each part's :attr:`~shardio.shards.index.Index.content_id`, as one digest."""
        if not self._content_id:
            parts = json.dumps([[name, part.content_id] for name, part in zip(self.names, self.parts)])
            self._content_id = hashlib.sha256(parts.encode()).hexdigest()[:32]
        return self._content_id

    def _chained(self) -> dict[str, Any]:
        columns = {}
        for column, dtype in COLUMNS.items():
            parts = [part.columns[column] for part in self.parts]
            shifts = self.shard_offsets[:-1].tolist() if column == "shard" else None
            tables = self.format_tables if column == "format" else None
            columns[column] = ChainedColumn(parts, self.offsets, dtype, shifts=shifts, tables=tables)
        return columns

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "columns": None, "_keys": None}  # the parts carry the columns

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.columns = self._chained()

    @property
    def fingerprinted(self) -> bool:
        """Whether the fingerprint names this mix: every corpus's index is fingerprinted
        (see :class:`Index`)."""
        return all(part.fingerprinted for part in self.parts)

    def share_tables(self, convert: Callable[[ShardTable], ShardTable]) -> None:
        """Replace the mix's shard table and each corpus's by ``convert(table)``, in place."""
        super().share_tables(convert)
        for part in self.parts:
            part.share_tables(convert)

    def shard_options(self, shard: int) -> dict[str, Any] | None:
        """The fsspec options of the corpus that shard number ``shard`` belongs to (corpora may differ)."""
        part = int(np.searchsorted(self.shard_offsets, shard, side="right")) - 1
        return self.parts[part].storage_options

    @property
    def keys(self) -> Keys:
        """Every sample's key, in global id order (each decoded from its corpus's index when asked for)."""
        if self._keys is None:
            self._keys = ChainedKeys([part.keys for part in self.parts])
        return self._keys

    def metadata(self, sample: int) -> dict[str, Any]:
        """The metadata its corpus's index keeps for global id ``sample``."""
        part = int(np.searchsorted(self.offsets, sample, side="right")) - 1
        return self.parts[part].metadata(sample - int(self.offsets[part]))

    @property
    def has_metadata(self) -> bool:
        """Whether some corpus's index keeps per-sample metadata."""
        return any(part.has_metadata for part in self.parts)

    def member_key(self, sample: int) -> str:
        """The key of the tar members global id ``sample`` reads (see :meth:`Index.member_key`)."""
        part = int(np.searchsorted(self.offsets, sample, side="right")) - 1
        return self.parts[part].member_key(sample - int(self.offsets[part]))

    def corpus(self, sample_id: int) -> str:
        """The name of the corpus global id ``sample_id`` belongs to."""
        return self.names[int(np.searchsorted(self.offsets, sample_id, side="right")) - 1]

    def columns_of(self) -> dict[str, CorpusColumns]:
        """Each corpus's planner columns (its own, as mapped: nothing is concatenated)."""
        return {
            name: CorpusColumns(part.shard_ids, part.durations, len(part.shards))
            for name, part in zip(self.names, self.parts)
        }

    def save(self, directory: str | None = None, *, keep_fingerprint: bool = False) -> None:
        """A combined index lives in memory only; save each corpus's own index instead."""
        raise OptionError("a MixIndex is not saved: each corpus keeps its own index")


def _position(items: list[str], item: str) -> int:
    if item not in items:
        items.append(item)
    return items.index(item)


class MixedDataset(ShardDataset):
    """A weighted mix of several shardio datasets, planned and resumed as one `ShardDataset`.

    Each sample carries `corpus` (a batch: `batch["corpus"]`, a list). `state_dict()` is one state for the
    whole mix: it records every corpus's index fingerprint and the mix options, and refuses to load into
    another mix. The option groups, shortcuts and deprecated keywords are `ShardDataset`'s.

    Args:
        sources: Corpus names to dataset locations, or to loaded indexes: corpora on different stores or
            protocols (`http://` and `s3://`) can each come as an `Index.load(url, options)`, and every shard
            is read with its own corpus's options.
        weights: The same names to their shares of the mix (positive, finite; normalised).
        epoch_size: What an epoch is (an `EpochSize`: hours, batches, or one pass of a primary corpus).
        weight_by: `"duration"` (the default): the weights share audio time; `"samples"`: sample counts.
        single_corpus_batches: Each batch from one corpus (default `False`: batches mix corpora). Part of
            the plan.
        batching: As `ShardDataset`'s; the duration filters apply to every corpus.
        ordering: As `ShardDataset`'s.
        decoding: As `ShardDataset`'s.
        reading: As `ShardDataset`'s; `storage_options` go to every corpus given by location.
        seed: As `ShardDataset`'s.
        world: As `ShardDataset`'s.
        batch_size: Shortcut for `batching.batch_size`.
        max_duration: Shortcut for `batching.max_duration`.
        num_buckets: Shortcut for `batching.num_buckets`.
        shuffle: Shortcut for `ordering.shuffle`.
        sample_rate: Shortcut for `decoding.sample_rate`.
        on_error: Shortcut for `reading.on_error`.
        **deprecated: The other fields' old keywords, as `ShardDataset`'s.

    Raises:
        OptionError: As `ShardDataset`'s; `sources` and `weights` naming different corpora, a weight or epoch
            size that cannot work, or an epoch size the corpora cannot fill.
    """

    index: MixIndex

    def __init__(
        self,
        sources: Mapping[str, str | os.PathLike[str] | Index],
        weights: Mapping[str, float],
        epoch_size: EpochSize,
        *,
        weight_by: str = "duration",
        single_corpus_batches: bool = False,
        batching: Batching | None = None,
        ordering: Ordering | None = None,
        decoding: Decoding | None = None,
        reading: Reading | None = None,
        seed: int = 0,
        world: World | None = None,
        batch_size: int | None = None,
        max_duration: float | None = None,
        num_buckets: int | None = None,
        shuffle: bool | None = None,
        sample_rate: int | None = None,
        on_error: str | None = None,
        **deprecated: Any,
    ) -> None:
        groups = option_groups(
            type(self).__name__,
            dict(batching=batching, ordering=ordering, decoding=decoding, reading=reading),
            dict(
                batch_size=batch_size,
                max_duration=max_duration,
                num_buckets=num_buckets,
                shuffle=shuffle,
                sample_rate=sample_rate,
                on_error=on_error,
            ),
            deprecated,
        )
        self.mix = Mix(weights, epoch_size, weight_by, single_corpus_batches)
        if not isinstance(sources, Mapping) or set(sources) != set(self.mix.weights):
            names = sorted(sources) if isinstance(sources, Mapping) else shown(sources)
            raise OptionError(f"sources name corpora {names}, weights name {sorted(self.mix.weights)}")
        storage = groups.reading.storage_options  # for the corpora given by location, not the combined index
        indexes = {n: s if isinstance(s, Index) else Index.load(s, storage) for n, s in sources.items()}
        super().__init__(
            MixIndex.combine(indexes),
            batching=groups.batching,
            ordering=groups.ordering,
            decoding=groups.decoding,
            reading=replace(groups.reading, storage_options=None),
            seed=seed,
            world=world,
        )
        self.reading = groups.reading
        self._use(
            Planner(
                self.index,
                self.seed,
                self.batching,
                self.ordering,
                self.mix,
                tuple(zip(self.index.names, self.index.parts)),
            )
        )

    def _check_plannable(self, batching: Batching) -> None:
        # the epoch's size, checked against each corpus here rather than when the first epoch is planned
        planned = (
            batching if batching.batch_size or batching.max_duration else replace(batching, batch_size=1)
        )
        check_epoch_size(self.index.columns_of(), self.mix, planned)
