"""The reading options of a dataset: what a sample's audio becomes (:class:`Decoding`) and how its bytes are
fetched, and what a sample that cannot be had does (:class:`Reading`). Neither shapes the plan: a state saved
under one value loads under another.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks.options import flag, integer
from ..errors import OptionError, shown
from ..storage.retries import RetryPolicy

__all__ = ["DTYPES", "ON_ERROR", "Decoding", "Reading", "Transform"]

Transform = Callable[[dict[str, Any], np.random.Generator], dict[str, Any]]
"""``transform(sample, rng) -> sample``: runs per sample in the worker; ``rng`` is seeded by
``(seed, epoch, key)``, so augmentation is the same after a resume and for any number of workers."""

DTYPES = ("float32", "int16")
"""The audio dtypes a dataset yields (:mod:`shardio.reading.pcm16` makes int16 batches)."""
ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class Decoding:
    """What a sample's audio becomes: mixed to mono, resampled, checked, transformed, converted, in order.

    The defaults keep the audio as stored, as float32: the decoder then writes each sample straight into its
    row of the batch. ``mono``, ``sample_rate`` and ``transform`` give each sample an array of its own first
    (a copy per sample).

    Args:
        mono: Mix multi-channel audio down to one channel (the channels' mean; CPU per sample).
        sample_rate: Resample every sample to this rate in Hz (soxr, high quality; the costliest step, a
            multiple of decoding's CPU). `None` (the default): each sample at its stored rate (a warning when
            the dataset holds several). At most 64 times the dataset's lowest rate.
        check_finite: Refuse audio with NaN or infinity (a `DecodeError`). On by default: a scan of each
            sample's floats, skipped where the stored format cannot hold them (integer PCM).
        transform: `transform(sample, rng) -> sample` (see `Transform`), per sample in the process that reads
            it, with a generator seeded by `(seed, epoch, key)`. A module-level function, so that spawned
            workers can pickle it. Default: none.
        dtype: `"float32"` (the default) or `"int16"`: 16-bit PCM copied as stored, half the bytes to move
            and hold; other audio is decoded (and mixed, resampled, transformed) as float32, then rounded.

    Raises:
        OptionError: A value of the wrong type or out of range.
    """

    mono: bool = False
    sample_rate: int | None = None
    check_finite: bool = True
    transform: Transform | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise OptionError(f"dtype must be one of {', '.join(DTYPES)}, not {shown(self.dtype)}")
        object.__setattr__(self, "mono", flag("mono", self.mono))
        object.__setattr__(self, "check_finite", flag("check_finite", self.check_finite))
        if self.sample_rate is not None:
            object.__setattr__(self, "sample_rate", integer("sample_rate", self.sample_rate, 1))
        if self.transform is not None and not callable(self.transform):
            raise OptionError(
                f"transform must be a function transform(sample, rng) -> sample, not {shown(self.transform)}"
            )

    @property
    def keeps_decoded_audio(self) -> bool:
        """Whether a sample's audio is what its decoder produced (so it can be decoded into the batch)."""
        return not self.mono and self.sample_rate is None and self.transform is None


@dataclass(frozen=True)
class Reading:
    """How a dataset's samples are fetched, and what a sample that cannot be read or decoded does.

    Args:
        on_error: `"raise"` (the default): the first sample that cannot be read or decoded fails the
            iteration. `"skip"`: it is logged and left out of its batch (listed in the batch's `skipped`,
            counted in the dataset's `stats`); every planned batch is still yielded, some smaller.
        retry: Bounds the retries of remote reads (a `RetryPolicy`; default: 4 attempts, 0.2 s backoff
            doubling up to 5 s). Local reads are not retried.
        storage_options: fsspec options (endpoint, credentials) for a source given by URL; see `Index.load`.
            Refused with a loaded `Index`, which reads with its own. Default: none.
        read_ahead: Bytes of remote reads each process fetches ahead of the batch it builds, coalesced per
            shard and concurrent (64 MiB by default: that much memory per process, and requests made early).
            0 reads each sample when it is needed; local shards are read as they go either way.
        cache_bytes: Above 0, remote shards are read whole through a node-local disk cache of at most this
            many bytes under `$SHARDIO_CACHE_DIR` (default `~/.cache/shardio`), shared by every process of
            the node: a shard is downloaded whole when first read (checked against its SHA-256), and later
            epochs read it from disk. 0 (the default): ranged reads, no disk.
        decoded_cache: A directory of node-local disk where each sample's decoded audio is kept the first time
            a process of the node decodes it, and read back after that instead of decoding again (see the
            guide's "Decoded cache" page): the same batches, bit for bit, for far less CPU on FLAC, MP3 or
            Opus, and for any corpus with `mono` or `sample_rate`. Shared by every rank, worker and job of the
            node (entries are keyed by the index's content and the decoding options), checked on every read.
            The directory must be this user's and writable by no one else. Default `None`: no cache.
        decoded_cache_bytes: The most bytes the decoded cache's directory holds (every dataset together);
            default 16 GiB. About 115 MB per hour of 16 kHz mono 16-bit audio, twice that where the audio
            is resampled or mixed (kept as float32).

    Raises:
        OptionError: A value of the wrong type or out of range.
    """

    on_error: str = "raise"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    storage_options: dict[str, Any] | None = field(default=None, compare=False)
    read_ahead: int = 64 << 20
    cache_bytes: int = 0
    decoded_cache: str | None = None
    decoded_cache_bytes: int = 16 << 30

    def __post_init__(self) -> None:
        if not isinstance(self.on_error, str) or self.on_error not in ON_ERROR:
            raise OptionError(f"on_error must be 'raise' or 'skip', not {shown(self.on_error)}")
        if not isinstance(self.retry, RetryPolicy):
            raise OptionError(f"retry must be a shardio.RetryPolicy, not {shown(self.retry)}")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise OptionError(
                f"storage_options must be a dict of fsspec options, not {shown(self.storage_options)}"
            )
        object.__setattr__(self, "read_ahead", integer("read_ahead", self.read_ahead, 0))
        object.__setattr__(self, "cache_bytes", integer("cache_bytes", self.cache_bytes, 0))
        if self.decoded_cache is not None:
            if not isinstance(self.decoded_cache, (str, os.PathLike)) or not os.fspath(self.decoded_cache):
                raise OptionError(f"decoded_cache must be a directory path, not {shown(self.decoded_cache)}")
            object.__setattr__(self, "decoded_cache", os.fspath(self.decoded_cache))
        object.__setattr__(
            self, "decoded_cache_bytes", integer("decoded_cache_bytes", self.decoded_cache_bytes, 1 << 20)
        )
