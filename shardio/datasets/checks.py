"""Checks of a :class:`~shardio.ShardDataset`'s source and options against its index, made when the dataset is
(not at its first batch): what the source is, the sample rates a batch would mix or resample, and whether the
duration filters leave any sample to plan."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from ..errors import OptionError, shown
from ..planning.options import Batching
from ..reading.decode import MAX_RESAMPLING
from ..shards.index import Index
from .planned import Planned

__all__ = ["check_accumulation", "check_rates", "check_some_eligible", "source_index"]

logger = logging.getLogger("shardio.datasets.dataset")  # the dataset's own logger: these are its warnings


def source_index(source: object, storage_options: Any) -> Index:
    """The index of a dataset's ``source`` (a directory or URL, loaded with ``storage_options``; or an
    :class:`Index`, which reads with its own)."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise OptionError(f"storage_options must be a dict of fsspec options, not {shown(storage_options)}")
    if isinstance(source, Index):
        if storage_options is not None:
            raise OptionError(
                "storage_options are for a source given by location; a loaded Index reads with "
                "its own (give them to Index.load(location, storage_options))"
            )
        return source
    if isinstance(source, (str, os.PathLike)):
        return Index.load(source, storage_options)
    raise OptionError(f"source must be a dataset directory or URL, or a shardio.Index, not {shown(source)}")


def check_rates(index: Index, sample_rate: int | None) -> None:
    """Without ``sample_rate``, a warning where the samples have several rates (a batch would mix them); with
    one, an :class:`OptionError` where it is beyond what shardio resamples the lowest rate to."""
    rates = np.asarray(index.columns["sample_rate"])  # a mix's chained column, concatenated once
    if not len(rates):
        return
    if sample_rate is not None:
        if sample_rate > MAX_RESAMPLING * int(rates.min()):
            raise OptionError(
                f"sample_rate {sample_rate} Hz is more than {MAX_RESAMPLING} times the dataset's "
                f"lowest sample rate ({int(rates.min())} Hz): shardio resamples by at most "
                f"{MAX_RESAMPLING}x"
            )
        return
    if rates.min() == rates.max():  # O(N) without a sort, for the common case
        return
    found, counts = np.unique(rates, return_counts=True)
    logger.warning(
        "the dataset holds samples at %s: batches mix sample rates unless sample_rate= resamples "
        "every sample to one",
        ", ".join(f"{rate} Hz ({count})" for rate, count in zip(found.tolist(), counts.tolist())),
    )


def check_some_eligible(index: Index, batching: Batching) -> None:
    """An :class:`OptionError` where the duration filters leave no sample to plan (every epoch would be
    empty)."""
    durations = index.durations
    if len(durations) and not batching.eligible(durations).any():
        limits = ("min_duration", "max_sample_duration", "max_duration")
        given = ", ".join(
            f"{name}={getattr(batching, name):g} s" for name in limits if getattr(batching, name) is not None
        )
        raise OptionError(
            f"no sample can be planned with {given}: the dataset's samples last "
            f"{float(durations.min()):.3f} to {float(durations.max()):.3f} s"
        )


def check_accumulation(dataset: Planned, given: object, setting: str) -> None:
    """An :class:`OptionError` naming both numbers where a trainer's gradient accumulation (``given``, its
    ``setting``) is not ``dataset.accumulation`` (nothing to check without ``step_batches``): the trainer's
    optimizer steps would not be the dataset's steps."""
    accumulation = dataset.accumulation
    if accumulation is None or given == accumulation:
        return
    world_size = dataset.ranks().world_size
    raise OptionError(
        f"{setting} is {shown(given, 40)}, but the dataset's step_batches={accumulation * world_size} on "
        f"{world_size} ranks makes {accumulation} batches per rank per optimizer step (ds.accumulation): "
        f"set {setting} to ds.accumulation ({accumulation})"
    )
