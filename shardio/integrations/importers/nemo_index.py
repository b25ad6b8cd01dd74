"""A NeMo tarred audio dataset indexed in place: ``shardio index DIR --nemo-manifest
tarred_audio_manifest.json``.

NeMo's ``convert_to_tarred_audio_dataset`` writes shards ``audio_{shard_id}.tar`` and one manifest,
``tarred_audio_manifest.json``, a JSON line per sample with ``audio_filepath`` (the tar member's name) and
``shard_id`` (and the same lines shard by shard in ``sharded_manifests/manifest_{shard_id}.json``). Give
shardio the directory that holds the tars, or the pattern a NeMo config names them with
(``audio__OP_0..N_CL_.tar``: those shards only, :mod:`~shardio.integrations.importers.nemo_patterns`); and the
manifest, or the sharded manifests' pattern (``sharded_manifests/manifest__OP_0..N_CL_.json``: each file holds
its own shard's lines). Instead of copying the audio into new shards (``shardio pack
tarred_audio_manifest.json``), :func:`index_nemo` writes a shardio index next to the tars, so the dataset
reads as it is:

- each manifest line is one sample, its key the member name up to the first dot; the other fields (``text``,
  ``duration``, ...) are kept in the index (:mod:`shardio.shards.metadata`) and reach the loader's samples
  where a ``{key}.json`` member's fields would;
- NeMo stores a file listed twice in one shard once and names the repeats ``{name}-sub{n}.{ext}`` in the
  manifest: such a line reads the first copy's member (the same bytes of the tar), under its own key
  ``{name}-sub{n}`` and with its own text;
- samples are ordered by shard (ascending ``shard_id``), then by manifest line.

The manifest is read as ``shardio pack`` reads one (:mod:`shardio.packing.manifestlines`): a regular file,
lines of at most 1 MiB, each one JSON object with every field once. Strict joins, never silent: a manifest
line that is not a tarred entry, names a path rather than a plain member name (``../x``), a shard that does
not exist or a member its tar lacks; a member no line names; a tar ``audio_{n}.tar`` in the directory (in the
pattern, when one is given) that no line names; a line of a shard outside the tars' pattern, or in another
shard's sharded manifest; a sharded manifest the pattern names that does not exist; a duplicate key; a name
that is not ``{key}.{audio ext}`` (keys end at the first dot, so ``a.b.wav`` cannot be one); a field named
like one a batch carries (``keys``, ``lengths``, ...: :data:`~shardio.reading.fields.BATCH_FIELDS`); a tar
named ``audio_01.tar`` (NeMo writes no leading zeros) or one that resolves, through a symbolic link, outside
the directory: each is an :class:`~shardio.errors.InputProblem`, and all of them are raised together as one
:class:`~shardio.errors.InputError`. A tar that cannot be parsed is a :class:`~shardio.errors.FormatError`.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import soundfile as sf
from tqdm import tqdm

from ...errors import FormatError, InputError, InputProblem, OptionError, shown_path
from ...packing.foreignshards import HashingReader
from ...shards.builder import IndexBuilder
from ...shards.index import INDEX_JSON, Index, ShardInfo
from ...shards.metadata import MEMBER_FIELD
from ...shards.names import split_name
from ...shards.outputdir import writable_directory
from ...shards.tarformat import walk
from .nemo_manifest import ManifestLine, read_manifests
from .nemo_patterns import is_pattern, parse_pattern

__all__ = ["MANIFEST", "index_nemo"]

logger = logging.getLogger(__name__)

MANIFEST = "tarred_audio_manifest.json"
"""The manifest's name in NeMo's layout (the default of :func:`index_nemo`)."""
_SUB = re.compile(r"^(?P<base>.*)-sub\d+(?P<ext>\.[^.]*)$")
_SHARD = re.compile(r"^audio_(\d+)\.tar$", re.ASCII)


@dataclass(frozen=True)
class _Member:
    start: int
    end: int
    ext: str
    facts: tuple[int, int, int]  # frames, sample rate, channels


def _members(
    path: str, wanted: set[str], problems: list[InputProblem], read: Callable[[int], object] | None = None
) -> tuple[dict[str, _Member], int, str]:
    """The members of the tar at ``path`` that ``wanted`` names (their spans and audio facts), and the tar's
    ``(bytes, sha256)``; a member not wanted (every wanted name is a valid ``{key}.{ext}``) is a problem.
    ``read(count)`` is told of each read's bytes (a progress bar)."""
    found: dict[str, _Member] = {}
    with open(path, "rb") as handle:
        hashing = HashingReader(handle, read)
        raw = io.BufferedReader(hashing, 1 << 20)
        boundary = 0
        for member, data in walk(raw, path):
            start, boundary = boundary, member.end  # a member's span includes its extended headers
            with data:
                where = f"{path}: member {member.name!r}"
                if member.name not in wanted:
                    problems.append(InputProblem(where, "", "no manifest line names this member"))
                    continue
                key, ext = split_name(member.name)
                try:
                    info = sf.info(data)
                except (sf.LibsndfileError, RuntimeError) as exc:
                    reason = getattr(exc, "error_string", None) or exc
                    problems.append(InputProblem(where, key, f"the audio cannot be read ({reason})"))
                    continue
                if info.frames <= 0:
                    problems.append(InputProblem(where, key, "the audio has no frames"))
                    continue
                found[member.name] = _Member(
                    start, member.end, ext, (int(info.frames), int(info.samplerate), int(info.channels))
                )
        while raw.read(1 << 20):  # the rest of the file (end-of-archive blocks), for its size and digest
            pass
    return found, hashing.size, hashing.sha256.hexdigest()


def _joined(
    lines: list[ManifestLine], members: dict[str, _Member], tar: str, problems: list[InputProblem]
) -> Iterator[tuple[ManifestLine, str, _Member, dict[str, Any]]]:
    """Each line of one shard as ``(line, key, member, metadata)``: a ``-sub{n}`` line the first copy's
    member. Then a member no line read is a problem."""
    used: set[str] = set()
    for line in lines:
        member_name, repeat = line.name, _SUB.match(line.name)
        if member_name not in members and repeat is not None:
            member_name = repeat["base"] + repeat["ext"]
        key, member = line.key, members.get(member_name)
        if member is None:
            nor = f" (nor {member_name!r})" if member_name != line.name else ""
            problems.append(
                InputProblem(
                    line.where,
                    key,
                    f"{os.path.basename(tar)} has no readable audio member {line.name!r}{nor}",
                )
            )
            continue
        used.add(member_name)
        meta = dict(line.meta)
        member_key = split_name(member_name)[0]
        if member_key != key:
            meta[MEMBER_FIELD] = member_key
        yield line, key, member, meta
    for name in sorted(set(members) - used):
        problems.append(InputProblem(f"{tar}: member {name!r}", "", "no manifest line names this member"))


def _present_shards(root: str, problems: list[InputProblem], selected: range | None) -> set[int]:
    """The shard ids of the ``audio_{n}.tar`` files in ``root`` (those in ``selected``, when given). A name
    NeMo does not write (``audio_01.tar``: the shard id with leading zeros) and a tar that resolves (through a
    symbolic link) outside ``root`` are problems: the loader would never read the one, and refuses the
    other."""
    present: set[int] = set()
    real_root = os.path.realpath(root)
    for name in sorted(os.listdir(root)):
        match = _SHARD.match(name)
        if match is None or (selected is not None and int(match[1]) not in selected):
            continue
        path = os.path.join(root, name)
        if name != f"audio_{int(match[1])}.tar":
            problems.append(
                InputProblem(
                    path,
                    "",
                    f"not a shard name NeMo writes (audio_{int(match[1])}.tar, "
                    "without leading zeros): rename it, or move it out of the directory",
                )
            )
            continue
        if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            problems.append(
                InputProblem(
                    path,
                    "",
                    "resolves (through a symbolic link) to a file outside the "
                    "dataset directory, which the loader refuses to read: copy the tar in",
                )
            )
            continue
        present.add(int(match[1]))
    return present


def _check_directory(directory: str) -> tuple[str, range | None]:
    """The dataset's directory, and the shards a pattern selects (None: every tar there)."""
    if is_pattern(directory):
        pattern = parse_pattern(directory, "the tars")
        if (pattern.head, pattern.tail) != ("audio_", ".tar"):
            raise OptionError(
                f"{shown_path(directory)}: expected NeMo's tar names, audio__OP_0..N_CL_.tar "
                "(convert_to_tarred_audio_dataset writes audio_{shard_id}.tar)"
            )
        return pattern.directory, pattern.numbers
    if not os.path.isdir(directory):
        raise OptionError(
            f"{shown_path(directory)}: expected the directory that holds the dataset's "
            "audio_{shard_id}.tar files, or their pattern (audio__OP_0..N_CL_.tar)"
        )
    return os.path.abspath(directory), None


def index_nemo(
    directory: str | os.PathLike[str],
    manifest: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> Index:
    """Index the NeMo tarred dataset in ``directory`` in place (see the module
    docstring) and return the index.

    ``directory``: the directory of the tars, or their pattern (``DIR/audio__OP_0..N_CL_.tar``). ``manifest``
    defaults to ``tarred_audio_manifest.json`` there; a pattern (``manifest__OP_0..N_CL_.json``) reads each
    sharded manifest it names. The index (``index.json``, ``index.columns``) is written into the tars'
    directory; an index already there is an :class:`~shardio.errors.OptionError` unless ``overwrite``. No
    audio is copied or changed. ``progress``: a tqdm bar of the bytes read, on stderr.
    """
    root, selected = _check_directory(os.fspath(directory))
    manifest = os.path.join(root, MANIFEST) if manifest is None else os.fspath(manifest)
    problems: list[InputProblem] = []
    lines = read_manifests(manifest, problems)
    writable_directory(root)
    if os.path.exists(os.path.join(root, INDEX_JSON)) and not overwrite:
        raise OptionError(
            f"{shown_path(root)} already holds an index ({INDEX_JSON}): pass overwrite=True "
            "(--overwrite) to replace it"
        )
    by_shard: dict[int, list[ManifestLine]] = {}
    for line in lines:
        if selected is not None and line.shard not in selected:
            problems.append(
                InputProblem(line.where, line.key, f"shard_id {line.shard} is outside the tars' pattern")
            )
            continue
        by_shard.setdefault(line.shard, []).append(line)
    present = _present_shards(root, problems, selected)
    for shard in selected or ():
        if shard not in by_shard and shard not in present:
            tar = os.path.join(root, f"audio_{shard}.tar")
            problems.append(InputProblem(tar, "", "the tars' pattern names it: no such file"))
    for shard in sorted(present - set(by_shard)):
        problems.append(
            InputProblem(os.path.join(root, f"audio_{shard}.tar"), "", "no manifest line names this shard")
        )
    builder = IndexBuilder(root)
    first_line: dict[str, str] = {}
    tars = {shard: os.path.join(root, f"audio_{shard}.tar") for shard in sorted(by_shard)}
    bar = tqdm(
        total=sum(
            os.path.getsize(tar) for shard, tar in tars.items() if shard in present and os.path.isfile(tar)
        ),
        disable=not progress,
        file=sys.stderr,
        unit="B",
        unit_scale=True,
        desc="index",
    )
    for shard, tar in tars.items():
        lines = by_shard[shard]
        if shard not in present or not os.path.isfile(tar):
            if shard not in present and os.path.lexists(tar):
                continue  # refused by _present_shards
            problems += [
                InputProblem(line.where, "", f"shard_id {shard}: no file {os.path.basename(tar)} in {root}")
                for line in lines[:1]
            ]
            continue
        repeated = (_SUB.match(line.name) for line in lines)
        wanted = {line.name for line in lines} | {m["base"] + m["ext"] for m in repeated if m}
        members, size, digest = _members(tar, wanted, problems, bar.update)
        number, count, duration = len(builder.shards), 0, 0.0
        for line, key, member, meta in _joined(lines, members, tar, problems):
            if key in first_line:
                problems.append(InputProblem(line.where, key, f"duplicate key (first at {first_line[key]})"))
                continue
            first_line[key] = line.where
            frames, rate, channels = member.facts
            builder.add_sample(
                key,
                shard=number,
                frame_offset=member.start,
                frame_size=member.end - member.start,
                member_offset=0,
                member_size=member.end - member.start,
                num_frames=frames,
                sample_rate=rate,
                channels=channels,
                audio_ext=member.ext,
                meta=meta,
            )
            count, duration = count + 1, duration + frames / max(rate, 1)
        builder.add_shard(
            ShardInfo(
                name=os.path.basename(tar),
                bytes=size,
                sha256=digest,
                samples=count,
                duration=round(duration, 6),
                codec="none",
            )
        )
        logger.info("indexed %s: %d samples", tar, count)
    bar.close()
    if problems:
        raise InputError(problems)
    if not builder.shards:
        raise FormatError(f"{manifest}: names no samples")
    index = builder.build()
    index.save(root)
    return index
