"""The lines of a NeMo tarred manifest, for an index in place
(:mod:`shardio.integrations.importers.nemo_index`): each a tarred entry with a plain member name
``{key}.{audio ext}``, a shard id, and fields an index can keep; any other line is a problem naming it. The
lines come from one manifest, or from the sharded manifests a pattern names (each of its own shard)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import InputProblem, ReadError, shown, shown_path
from ...packing.manifestlines import check_manifest_file, json_entry, manifest_lines
from ...packing.source import AUDIO_EXTENSIONS
from ...reading.fields import BATCH_FIELDS
from ...shards.metadata import MAX_ENTRY_BYTES, MEMBER_FIELD
from ...shards.names import key_problem
from .nemo_patterns import ShardPattern, is_pattern, parse_pattern

__all__ = ["ManifestLine", "parse_manifest", "read_manifests"]

_MAX_SHARD_ID = 1 << 31
_NAME_LIMIT = 255


@dataclass(frozen=True)
class ManifestLine:
    """One manifest line: where it is, its member name, shard and the fields it adds."""

    where: str
    name: str
    key: str
    shard: int
    meta: dict[str, Any]


def _split(name: str) -> tuple[str, str] | str:
    """A manifest's ``audio_filepath`` as ``(key, ext)``, or why it cannot name a member of a NeMo tar: a
    plain file name ``{key}.{audio ext}`` whose key follows pack's rules (no '.', so
    ``a.b.wav`` is refused)."""
    if not name or len(name) > _NAME_LIMIT or any(ord(ch) < 32 for ch in name):
        return "is not a file name"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "is a path; a tarred NeMo manifest names tar members by their plain file name"
    key, _, ext = name.partition(".")
    if ext.lower() not in AUDIO_EXTENSIONS or key_problem(key) is not None:
        return (
            f"is not {{key}}.{{ext}} with a key that has no '.' and an audio ext (one of "
            f"{', '.join(AUDIO_EXTENSIONS)})"
        )
    return key, ext


def parse_manifest(manifest: str, problems: list[InputProblem]) -> list[ManifestLine]:
    """Every line of the manifest that is a tarred entry with a plain member name and a shard id."""
    lines: list[ManifestLine] = []
    for number, text in manifest_lines(manifest, problems):
        where = f"{manifest}:{number}"
        try:
            entry = json_entry(text)
        except ValueError as exc:
            problems.append(InputProblem(where, "", f"not a valid manifest line: {exc}"))
            continue
        name, shard = entry.get("audio_filepath"), entry.get("shard_id")
        if not isinstance(name, str) or isinstance(shard, bool) or not isinstance(shard, int):
            problems.append(
                InputProblem(
                    where,
                    "",
                    "not a tarred NeMo entry: expected a string 'audio_filepath' and an integer 'shard_id'",
                )
            )
            continue
        named = name if len(name) <= 80 else name[:80] + "..."
        split = _split(name)
        if isinstance(split, str):
            problems.append(InputProblem(where, "", f"audio_filepath {named!r} {split}"))
            continue
        if not 0 <= shard < _MAX_SHARD_ID:
            problems.append(
                InputProblem(where, "", f"shard_id {shard} is not between 0 and {_MAX_SHARD_ID - 1}")
            )
            continue
        meta = {k: v for k, v in entry.items() if k not in ("audio_filepath", "shard_id")}
        if meta.get("offset") not in (None, 0):
            problems.append(
                InputProblem(
                    where,
                    split[0],
                    f"offset {shown(meta['offset'])}: NeMo reads "
                    "[offset, offset + duration] of the member, and an index in place "
                    "reads whole members; pack the manifest (shardio pack) to cut the "
                    "segment",
                )
            )
            continue
        size = len(json.dumps(meta, ensure_ascii=False).encode())
        reserved = sorted(BATCH_FIELDS.union([MEMBER_FIELD]).intersection(meta))
        if reserved or size > MAX_ENTRY_BYTES:
            reason = (
                f"uses the field name(s) {', '.join(map(repr, reserved))}, which shardio reserves (a batch's "
                f"own fields: {', '.join(sorted(BATCH_FIELDS))}); rename them"
                if reserved
                else f"has {size} bytes of fields, more than the {MAX_ENTRY_BYTES} an index keeps per sample"
            )
            problems.append(InputProblem(where, "", reason))
            continue
        lines.append(ManifestLine(where, name, split[0], shard, meta))
    return lines


def read_manifests(manifest: str, problems: list[InputProblem]) -> list[ManifestLine]:
    """The lines of ``manifest``, or of each sharded manifest its pattern names (a line of another shard
    than its file's is a problem)."""
    if not is_pattern(manifest):
        try:
            check_manifest_file(manifest)
        except FileNotFoundError:
            raise ReadError(f"{shown_path(manifest)}: no such manifest file") from None
        return parse_manifest(manifest, problems)
    pattern: ShardPattern = parse_pattern(manifest, "the sharded manifests")
    lines: list[ManifestLine] = []
    for number in pattern.numbers:
        path = pattern.path(number)
        try:
            check_manifest_file(path)
        except FileNotFoundError:
            problems.append(InputProblem(path, "", f"no such manifest file (named by {pattern.given})"))
            continue
        for line in parse_manifest(path, problems):
            if line.shard != number:
                problems.append(
                    InputProblem(
                        line.where, line.key, f"shard_id {line.shard} in the manifest of shard {number}"
                    )
                )
                continue
            lines.append(line)
    return lines
