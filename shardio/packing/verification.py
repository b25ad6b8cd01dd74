"""verify: check a dataset's shards against its index, and optionally decode every sample.

Checks, per shard: the file exists and has the indexed size and SHA-256; every sample's bytes, read at the
index's offsets (and decompressed as the shard's codec says), parse as tar members named ``{key}.{ext}`` with
the indexed key (or, for a sample that reads another's members, such as a NeMo ``-sub`` repeat, that
key) and audio format, and metadata the index keeps decodes; every audio member passes pack's structure checks
(:func:`shardio.packing.structure.structure_facts`: FLAC's frame CRCs and sample count, a WAV's chunks and
sizes, Ogg's page CRCs, MP3's frame chain) and, where its headers give them exactly, has the indexed frames,
sample rate and channels. A shard's SHA-256 shows its bytes are those indexed, not that they are sound: shards
indexed where they are (``shardio index`` over another tool's tars, a NeMo dataset) were read only as far as
their audio headers. With ``decode=True`` every audio member must also decode to non-empty, finite audio with
the indexed frames, sample rate and channels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

import numpy as np
from tqdm import tqdm

from ..errors import OptionError, ShardioError, shown_path
from ..reading.decode import decode_audio
from ..reading.reader import Reader
from ..shards.index import Index
from ..storage.files import file_size, is_url, open_input
from ..storage.localshard import NotRegular, open_regular
from ..storage.retries import RetryPolicy, retrying
from .structure import Malformed, structure_facts
from .truncation import truncation_problem

__all__ = ["verify_dataset"]

logger = logging.getLogger(__name__)

_MAX_PER_SHARD = 20


def verify_dataset(
    directory: str | os.PathLike[str],
    decode: bool = False,
    *,
    allow_outside_root: bool = False,
    progress: bool = True,
) -> list[str]:
    """Every problem found in the dataset at ``directory``, one line each; empty when it is sound.
    ``allow_outside_root`` is :meth:`Index.load`'s (for a trusted index whose shards live elsewhere);
    ``progress``: a tqdm bar of the shard bytes checked, on stderr. A local ``directory`` (or ``index.json``)
    that does not exist is an :class:`~shardio.errors.OptionError` (a mistyped path, not a damaged
    dataset), and so is a file other than ``index.json``; a directory without an index is a problem found."""
    directory = os.fspath(directory)
    if directory.startswith("file://"):
        directory = directory.removeprefix("file://").removeprefix("localhost")  # as Index.load reads it
    if not is_url(os.fspath(directory)) and not os.path.exists(directory):
        raise OptionError(f"{shown_path(directory)}: no such dataset directory or index file")
    if (
        not is_url(os.fspath(directory))
        and not os.path.isdir(directory)
        and os.path.basename(os.fspath(directory)) != "index.json"
    ):
        raise OptionError(
            f"{shown_path(directory)}: a file, not a dataset directory; expected a directory holding "
            "index.json, or that index.json"
        )
    try:
        index = Index.load(directory, allow_outside_root=allow_outside_root)
    except ShardioError as exc:
        return [str(exc)]
    problems: list[str] = []
    reader = Reader(index)
    by_shard = np.argsort(index.columns["shard"], kind="stable")
    bounds = np.searchsorted(index.columns["shard"][by_shard], np.arange(len(index.shards) + 1))
    bar = tqdm(
        total=sum(shard.bytes for shard in index.shards),
        disable=not progress,
        file=sys.stderr,
        unit="B",
        unit_scale=True,
        desc="verify",
    )
    try:
        for number, shard in enumerate(index.shards):
            rows = by_shard[bounds[number] : bounds[number + 1]]
            found = list(_verify_shard(index, reader, number, rows, decode))
            if len(found) > _MAX_PER_SHARD:
                found = found[:_MAX_PER_SHARD] + [
                    f"{shard.name}: ... and {len(found) - _MAX_PER_SHARD} more problems"
                ]
            problems += found
            logger.info("verified %s: %s", shard.name, "ok" if not found else f"{len(found)} problems")
            bar.update(shard.bytes)
    finally:
        bar.close()
        reader.close()
    return problems


def _sha256(handle: IO[bytes], size: int) -> str:
    """The SHA-256 of the first ``size`` bytes of ``handle`` (no further: a file that grows as it is read),
    which it closes."""
    digest = hashlib.sha256()
    with handle:
        left = size
        while left > 0 and (chunk := handle.read(min(1 << 20, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _verify_shard(index: Index, reader: Reader, number: int, rows: np.ndarray, decode: bool) -> Iterator[str]:
    shard = index.shards[number]
    path = index.shard_path(number)
    try:
        if is_url(
            path
        ):  # retried as the loader's reads are; a server's error is a ReadError naming its status
            options, retry = index.shard_options(number), RetryPolicy()
            size = retrying(lambda: file_size(path, options), path, retry)
            digest = retrying(lambda: _sha256(open_input(path, options), size), path, retry)
        else:
            fd, size = open_regular(path)
            digest = _sha256(os.fdopen(fd, "rb"), size)
    except FileNotFoundError:
        yield f"{shard.name}: the shard file is missing ({shown_path(path)})"
        return
    except (NotRegular, IsADirectoryError) as exc:
        if isinstance(exc, NotRegular) and not exc.directory:
            yield f"{shard.name}: not a regular file ({exc}: {shown_path(path)}); expected the shard file"
        else:
            yield (
                f"{shard.name}: a directory is where the shard file should be "
                f"({shown_path(path)}); expected a file"
            )
        return
    except (OSError, ShardioError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        yield f"{shard.name}: the shard file cannot be read ({reason}); its samples were not checked"
        return
    if digest != shard.sha256:
        yield f"{shard.name}: SHA-256 {digest}, the index says {shard.sha256}"
    if size != shard.bytes:
        yield (
            f"{shard.name}: {size} bytes, the index says {shard.bytes} (truncated or replaced); its samples "
            "were not checked"
        )
        return
    for row in rows:
        yield from _check_sample(index, reader, int(row), decode)


def _check_sample(index: Index, reader: Reader, row: int, decode: bool) -> Iterator[str]:
    """Parse the sample at its indexed offsets (the loader's own reader) and optionally decode its audio."""
    key = index.keys[row]
    where = f"{index.shards[int(index.columns['shard'][row])].name}: sample {key!r}"
    audio_ext = index.formats[int(index.columns["format"][row])]
    try:
        index.metadata(row)  # metadata the index keeps must decode (a NeMo dataset indexed in place)
        members = reader.members(row)
    except ShardioError as exc:
        yield f"{where}: {exc}"
        return
    if audio_ext not in members:
        yield f"{where}: no .{audio_ext} member (found {', '.join('.' + e for e in members)})"
        return
    expected = (
        int(index.columns["num_frames"][row]),
        int(index.columns["sample_rate"][row]),
        int(index.columns["channels"][row]),
    )
    try:
        facts = structure_facts(members[audio_ext], audio_ext)
    except Malformed as exc:
        yield f"{where}: the .{audio_ext} member is malformed: {exc}"
        return
    if facts is not None and facts != expected:
        yield f"{where}: its headers say {_described(facts)}, the index says {_described(expected)}"
        return
    if not decode:
        return
    try:
        audio, rate = decode_audio(members[audio_ext], audio_ext, where=where)
    except ShardioError as exc:
        yield str(exc)
        return
    truncated = truncation_problem(members[audio_ext], audio_ext, audio.shape[1])
    if truncated is not None:
        yield f"{where}: {truncated}"
    actual = (audio.shape[1], rate, audio.shape[0])
    if actual != expected:
        yield f"{where}: decodes to {_described(actual)}, the index says {_described(expected)}"


def _described(facts: tuple[int, int, int]) -> str:
    return f"{facts[0]} frames at {facts[1]} Hz x {facts[2]} channels"
