"""build_index: an index for existing WebDataset-style shards (``.tar``, ``.tar.gz``,
``.tar.zst``, ``.tar.bz2``).

Shards written by other tools (``webdataset.ShardWriter``, WeNet, ``tar`` + ``zstd``) are walked once as a
stream; members are grouped into samples by key (adjacent members sharing the part of their name before
the first dot of the basename), the audio member is picked by extension and its frames, sample rate and
channels are read with ``soundfile.info``. A sample's bytes run from the end of the previous sample's
last member (so any pax header of its first member is included) to the end of its own last member.

A ``.tar`` is seekable (codec ``none``). A multi-frame ``.tar.zst`` whose frames each hold whole samples
(shardio's own layout) is seekable too (codec ``zstd``); any other ``.tar.zst`` is ``zstd-stream``, and
``.tar.gz`` and ``.tar.bz2`` are ``gzip`` and ``bz2``: for those the offsets are in the decompressed tar.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from ..errors import OptionError, ReadError, shown_path
from ..shards.builder import IndexBuilder
from ..shards.index import INDEX_COLUMNS_V1, INDEX_JSON, Index, ShardInfo
from ..shards.indexheader import FORMAT_VERSION, METADATA_VERSION, UPGRADE_FIELDS, UPGRADED_FROM
from ..shards.outputdir import writable_directory
from ..storage.files import write_atomic
from .foreignshards import HashingReader, index_shard, shard_codec, tar_stream
from .source import not_regular
from .zstdframes import seekable_frames, zstd_frames

__all__ = [
    "HashingReader",
    "build_index",
    "check_index_target",
    "index_shards",
    "shard_codec",
    "tar_stream",
    "upgrade_index",
]

logger = logging.getLogger(__name__)


def build_index(
    shards: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Index:
    """Index existing shards and save the index next to them (or in ``out_dir``); returns the index.

    Shard names in the index are relative to the index's directory. An index already there is an
    :class:`~shardio.errors.OptionError` unless ``overwrite`` (checkpoints of its dataset stop matching).
    Sample keys follow pack's rules (:func:`~shardio.shards.names.key_problem`: relative, no ``..``).
    ``progress``: a tqdm bar of the shard bytes read (of all the shards' sizes), on stderr.
    """
    paths = [os.path.abspath(os.fspath(s)) for s in shards]
    if not paths:
        raise OptionError("build_index needs at least one shard")
    _check_shard_list(paths)
    root = (
        os.path.abspath(os.fspath(out_dir))
        if out_dir is not None
        else os.path.commonpath([os.path.dirname(p) for p in paths])
    )
    check_index_target(root, overwrite)
    index = index_shards(paths, root, progress=progress)
    index.save(root)
    outside = [s.name for s in index.shards if s.name.startswith("..") or os.path.isabs(s.name)]
    if outside:
        logger.warning(
            "%s: %d shards lie outside the index's directory (first: %s): load this dataset "
            "with Index.load(..., allow_outside_root=True), or --allow-outside-root",
            shown_path(root),
            len(outside),
            shown_path(outside[0]),
        )
    return index


def check_index_target(root: str, overwrite: bool) -> None:
    """Refuse to write an index into ``root`` when it is not a writable directory, or (unless ``overwrite``)
    already holds one: an :class:`~shardio.errors.OptionError`."""
    writable_directory(root)
    if os.path.exists(os.path.join(root, INDEX_JSON)) and not overwrite:
        raise OptionError(
            f"{shown_path(root)} already holds an index ({INDEX_JSON}); replacing it would "
            "change the dataset "
            "under every checkpoint of it: pass overwrite=True (--overwrite on the command line) to "
            "replace it, or --out to write the new index elsewhere"
        )


def index_shards(
    paths: Sequence[str],
    root: str,
    *,
    progress: bool = True,
    check: Callable[[str, str, str], None] | None = None,
) -> Index:
    """The index of the shards at absolute ``paths`` (checked first: each a shard name, a regular file, given
    once), its shard names relative to ``root``, not saved. ``check(path, key, audio_ext)`` is called for each
    sample before it is added (it raises to refuse the shards). ``progress``: as :func:`build_index`."""
    _check_shard_list(list(paths))
    builder = IndexBuilder(root)
    keys: set[str] = set()
    with tqdm(
        total=sum(os.path.getsize(p) for p in paths),
        disable=not progress,
        file=sys.stderr,
        unit="B",
        unit_scale=True,
        desc="index",
    ) as bar:
        for path in paths:
            codec = shard_codec(path)
            samples, info = index_shard(path, codec, bar.update)
            if check is not None:
                for key, _, _, ext, _ in samples:
                    check(path, key, ext)
            spans = [(start, end) for _, start, end, _, _ in samples]
            placed = None
            if codec == "zstd-stream":
                frames = zstd_frames(path)
                placed = seekable_frames(frames, spans) if frames and len(frames) > 1 else None
                codec = "zstd" if placed else codec
            number = len(builder.shards)
            duration = 0.0
            repeated = _repeated_keys([key for key, *_ in samples], keys)
            if repeated:
                logger.warning(
                    "%s: %d keys appear earlier in this dataset too (first: %r)",
                    path,
                    len(repeated),
                    repeated[0],
                )
            for i, (key, start, end, ext, (frames_, rate, channels)) in enumerate(samples):
                keys.add(key)
                frame_offset, frame_size, member_offset = placed[i] if placed else (start, end - start, 0)
                builder.add_sample(
                    key,
                    shard=number,
                    frame_offset=frame_offset,
                    frame_size=frame_size,
                    member_offset=member_offset,
                    member_size=end - start,
                    num_frames=frames_,
                    sample_rate=rate,
                    channels=channels,
                    audio_ext=ext,
                )
                duration += frames_ / max(rate, 1)
            builder.add_shard(
                ShardInfo(
                    name=os.path.relpath(path, root),
                    bytes=info[0],
                    sha256=info[1],
                    samples=len(samples),
                    duration=round(duration, 6),
                    codec=codec,
                )
            )
            logger.info("indexed %s: %d samples, codec %s", path, len(samples), codec)
    return builder.build()


def _check_shard_list(paths: list[str]) -> None:
    """Every shard named, checked before any is read (a mistyped last one fails now, not after the others are
    indexed): a shard name, a regular file, and not given twice (its samples would be in the index twice)."""
    seen: dict[str, str] = {}
    for path in paths:
        shard_codec(path)
        _check_shard_file(path)
        real = os.path.realpath(path)
        if real in seen:
            same = "" if seen[real] == path else f" (as {shown_path(seen[real])})"
            raise OptionError(
                f"{shown_path(path)}: this shard is given twice{same}; each shard is indexed once"
            )
        seen[real] = path


def _check_shard_file(path: str) -> None:
    """A :class:`~shardio.errors.ReadError` unless ``path`` is a regular file (a FIFO
    would block the walk)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ReadError(f"{shown_path(path)}: no such shard file") from None
    except OSError as exc:
        raise ReadError(f"{shown_path(path)}: cannot read the shard ({exc.strerror or exc})") from None
    problem = not_regular(mode)
    if problem is not None:
        raise ReadError(f"{shown_path(path)}: cannot read the shard: {problem}; expected a shard file")


def _repeated_keys(shard_keys: list[str], earlier: set[str]) -> list[str]:
    """The keys of one shard that an earlier shard or an earlier sample of this shard also has (a ``tar -r``
    append repeats a key further on in the same shard)."""
    here: set[str] = set()
    repeated = []
    for key in shard_keys:
        if key in earlier or key in here:
            repeated.append(key)
        here.add(key)
    return repeated


def _record_upgrade(directory: str, before: dict[str, Any]) -> None:
    """Record in the upgraded ``index.json`` the fields the upgrade changed, as they were (``upgraded_from``),
    so that its kept fingerprint still checks (:func:`~shardio.shards.indexheader.check_fingerprint`)."""
    path = os.path.join(directory, INDEX_JSON)
    with open(path, "rb") as handle:
        after = json.loads(handle.read())
    changed = {
        key: before.get(key)
        for key in set(before) | set(after)
        if key != "fingerprint" and before.get(key) != after.get(key)
    }
    if not set(changed) <= set(UPGRADE_FIELDS):  # an index an older shardio wrote otherwise: no proof
        logger.warning(
            "%s: the upgrade changed %s besides the format, so the old fingerprint cannot be kept "
            "verifiably: the index gets a new one (states saved on the old index no longer load)",
            path,
            sorted(set(changed) - set(UPGRADE_FIELDS)),
        )
        Index.load(directory).save(directory)
        return
    after[UPGRADED_FROM] = dict(sorted(changed.items()))
    write_atomic(path, json.dumps(after, indent=1).encode())


def upgrade_index(directory: str | os.PathLike[str]) -> str:
    """Rewrite the index of the dataset in local ``directory`` in the current format, with the same content
    and fingerprint (a saved loader state still resumes), and remove a format-1 ``index.npz``. Says what it
    did: ``"1 -> 2"``, or ``"2 (already current)"`` (``3``: format 2 with per-sample metadata)."""
    directory = os.fspath(directory)
    index = Index.load(directory)  # first: it checks index.json is a regular file in the root, and valid JSON
    with open(os.path.join(directory, INDEX_JSON), "rb") as handle:
        before = json.loads(handle.read())
    version = before.get("version")
    if version in (FORMAT_VERSION, METADATA_VERSION):
        return f"{version} (already current)"
    index.save(directory, keep_fingerprint=True)
    _record_upgrade(directory, before)
    old = os.path.join(directory, INDEX_COLUMNS_V1)
    if os.path.exists(old):
        os.unlink(old)
    logger.info("%s: index upgraded from format %s to %s", directory, version, FORMAT_VERSION)
    return f"{version} -> {FORMAT_VERSION}"
