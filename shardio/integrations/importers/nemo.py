"""NeMo tarred audio datasets as a corpus: ``tarred_audio_manifest.json`` joined with its ``audio_{shard_id}.tar``.

Each manifest line names its tar member (``audio_filepath``) and tar (``shard_id``). NeMo writes a file that
occurs twice in one shard once, and names the repeats ``{name}-sub{n}.{ext}`` in the manifest: such an entry
reads the first copy's member, under its own key (``{name}-sub{n}``), with its own text. The other fields
(``text``, ``duration``, ...) become metadata; member bytes are copied as they are.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from ...errors import InputProblem
from ...packing.source import Problems, Source
from .kinds import first_json_object

__all__ = ["is_nemo_manifest", "read_nemo"]

_SUB = re.compile(r"^(?P<base>.*)-sub\d+(?P<ext>\.[^.]*)$")


def is_nemo_manifest(path: Path) -> bool:
    """Whether ``path`` is a JSON-lines manifest whose first entry has ``audio_filepath`` and ``shard_id``."""
    if path.is_dir() or path.suffix not in (".json", ".jsonl"):
        return False
    entry = first_json_object(path)
    return entry is not None and "shard_id" in entry and "audio_filepath" in entry


def _listing(tar: Path) -> dict[str, int]:
    with tarfile.open(tar, "r:") as archive:
        return {info.name: info.size for info in archive if info.isfile()}


def read_nemo(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The entries of a tarred NeMo manifest (see the module docstring), in manifest order."""
    listings: dict[int, dict[str, int] | None] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                entry = json.loads(line)
                name, shard = str(entry["audio_filepath"]), int(entry["shard_id"])
            except (ValueError, KeyError, TypeError) as exc:
                problems.append(InputProblem(where, "", f"not a tarred NeMo entry with audio_filepath and shard_id "
                                             f"({type(exc).__name__})"))
                continue
            tar = path.parent / f"audio_{shard}.tar"
            if shard not in listings:
                try:
                    listings[shard] = _listing(tar)
                except (OSError, tarfile.TarError) as exc:
                    listings[shard] = None
                    problems.append(InputProblem(str(tar), "", f"cannot read the tar ({exc})"))
            listing = listings[shard]
            if listing is None:
                continue
            member = name
            repeat = _SUB.match(name)
            if member not in listing and repeat is not None:
                member = repeat["base"] + repeat["ext"]
            key = name.rsplit(".", 1)[0]
            if member not in listing:
                problems.append(InputProblem(where, key, f"{tar.name} has no member {name!r}"))
                continue
            meta = {k: v for k, v in entry.items() if k not in ("audio_filepath", "shard_id")}
            yield Source(key, str(tar), meta=meta, origin=f"{path.name}:{number}", member=member, size=listing[member])
