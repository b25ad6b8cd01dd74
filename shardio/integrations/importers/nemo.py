"""NeMo tarred audio datasets as a corpus: ``tarred_audio_manifest.json`` joined with its
``audio_{shard_id}.tar``.

Each manifest line names its tar member (``audio_filepath``) and tar (``shard_id``). NeMo writes a file that
occurs twice in one shard once, and names the repeats ``{name}-sub{n}.{ext}`` in the manifest: such an entry
reads the first copy's member, under its own key (``{name}-sub{n}``), with its own text. The other fields
(``text``, ``duration``, ...) become metadata; member bytes are copied as they are, except for an entry with a
non-zero ``offset``: as NeMo's tarred loaders do, it takes ``[offset, offset + duration]`` of the member (a
segment, encoded as pack encodes segments).
"""

from __future__ import annotations

import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import InputProblem, shown
from ...packing.manifestlines import json_entry, manifest_lines
from ...packing.source import NotRegularFile, Problems, Source, open_regular_input, seconds_field
from .kinds import first_json_object

__all__ = ["UNNAMED_TARS", "UNREAD_MEMBERS", "is_nemo_manifest", "read_nemo"]

_SUB = re.compile(r"^(?P<base>.*)-sub\d+(?P<ext>\.[^.]*)$")
UNREAD_MEMBERS = "NeMo tar members no manifest line reads"
UNNAMED_TARS = "NeMo audio_*.tar files no manifest line names"


def is_nemo_manifest(path: Path) -> bool:
    """Whether ``path`` is a JSON-lines manifest whose first entry has ``audio_filepath`` and ``shard_id``."""
    if path.is_dir() or path.suffix not in (".json", ".jsonl"):
        return False
    entry = first_json_object(path)
    return entry is not None and "shard_id" in entry and "audio_filepath" in entry


def _listing(tar: Path) -> dict[str, int]:
    """The regular members of ``tar`` and their sizes; a FIFO or device is refused, not
    read (it would block)."""
    with open_regular_input(tar) as raw, tarfile.open(fileobj=raw, mode="r:") as archive:
        return {info.name: info.size for info in archive if info.isfile()}


def _entry(line: str) -> tuple[dict[str, Any], str, int]:
    """A manifest line as ``(entry, audio_filepath, shard_id)``; ValueError when it is not a tarred entry, or
    its ``offset``/``duration`` are not seconds
    (:func:`~shardio.packing.manifestlines.json_entry`'s rules)."""
    entry = json_entry(line)
    name, shard = entry.get("audio_filepath"), entry.get("shard_id")
    if not isinstance(name, str) or not name:
        raise ValueError(f"audio_filepath is {shown(name)}, expected a tar member's name")
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"shard_id is {shown(shard)}, expected an integer >= 0")
    for field in ("offset", "duration"):
        if not (seconds_field(entry.get(field), field) or 0.0) < float("inf"):
            raise ValueError(
                f"field {field!r} is {shown(entry.get(field))}, expected a finite number of seconds"
            )
    return entry, name, shard


def read_nemo(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The entries of a tarred NeMo manifest (see the module docstring), in manifest order. Tar members no
    entry reads, and ``audio_{n}.tar`` files no entry names, are counted in ``left_out``."""
    listings: dict[int, dict[str, int] | None] = {}
    read: dict[int, set[str]] = {}
    for number, line in manifest_lines(path, problems):
        where = f"{path}:{number}"
        try:
            entry, name, shard = _entry(line)
        except ValueError as exc:
            problems.append(
                InputProblem(where, "", f"not a tarred NeMo entry with audio_filepath and shard_id ({exc})")
            )
            continue
        tar = path.parent / f"audio_{shard}.tar"
        if shard not in listings:
            try:
                listings[shard] = _listing(tar)
            except (OSError, tarfile.TarError) as exc:
                listings[shard] = None
                reason = exc.strerror if isinstance(exc, NotRegularFile) else exc
                problems.append(InputProblem(str(tar), "", f"cannot read the tar ({reason})"))
        listing = listings[shard]
        if listing is None:
            continue
        member = name
        repeat = _SUB.match(name)
        if member not in listing and repeat is not None:
            member = repeat["base"] + repeat["ext"]
        key = name.rsplit(".", 1)[0]
        if member not in listing:
            problems.append(InputProblem(where, key, f"{tar.name} has no member {shown(name)}"))
            continue
        read.setdefault(shard, set()).add(member)
        meta = {k: v for k, v in entry.items() if k not in ("audio_filepath", "shard_id", "offset")}
        offset = (
            seconds_field(entry.get("offset"), "offset") or None
        )  # NeMo reads [offset, offset + duration]
        duration = seconds_field(entry.get("duration"), "duration") if offset is not None else None
        yield Source(
            key,
            str(tar),
            offset=offset,
            duration=duration,
            meta=meta,
            origin=f"{path.name}:{number}",
            member=member,
            size=listing[member],
        )
    unread = sum(
        len(listing.keys() - read.get(shard, set())) for shard, listing in listings.items() if listing
    )
    if unread:
        left_out[UNREAD_MEMBERS] += unread
    unnamed = [tar for tar in path.parent.glob("audio_*.tar") if _shard_of(tar.name) not in listings]
    if unnamed:
        left_out[UNNAMED_TARS] += len(unnamed)


def _shard_of(name: str) -> int | None:
    """The shard id in a tar's name ``audio_{n}.tar`` (None: another name)."""
    digits = name[len("audio_") : -len(".tar")]
    return int(digits) if digits.isdecimal() and digits.isascii() else None
