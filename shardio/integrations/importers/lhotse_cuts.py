"""Lhotse corpora as a corpus: a CutSet manifest (``cuts.jsonl[.gz]``) or a Lhotse Shar directory.

A cut of a CutSet becomes a segment of its recording's file (``start``/``duration``; the whole file when the
cut covers it; a relative path is taken from the manifest's folder); a Shar directory's ``cuts.N.jsonl[.gz]`` pairs with ``recording.N.tar``, whose ``{cut id}.{ext}``
member is copied as it is. The supervisions' texts (joined by spaces) are the transcript; their speaker and
language, the cut's ``custom`` fields and the recording id become metadata. The manifests are read as JSON,
so the ``lhotse`` package is not needed to read them. Recordings that are URLs, commands or one file per
channel are listed as problems.
"""

from __future__ import annotations

import gzip
import json
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import InputProblem
from ...packing.source import Problems, Source
from .kinds import first_json_object

__all__ = ["is_lhotse", "read_lhotse"]

_SHAR_CUTS = re.compile(r"cuts\.(\d+)\.jsonl(\.gz)?")


def _shar_cut_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if _SHAR_CUTS.fullmatch(p.name))


def is_lhotse(path: Path) -> bool:
    """Whether ``path`` is a Shar directory, a ``.jsonl.gz`` manifest, or a JSONL manifest of cuts."""
    if path.is_dir():
        return bool(_shar_cut_files(path))
    if path.name.endswith(".jsonl.gz"):
        return True
    if path.suffix != ".jsonl":
        return False
    entry = first_json_object(path)
    return entry is not None and "recording" in entry and "supervisions" in entry


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        yield from enumerate(handle, 1)


def _meta(cut: dict[str, Any]) -> dict[str, Any]:
    supervisions = [s for s in cut.get("supervisions") or [] if isinstance(s, dict)]
    meta: dict[str, Any] = {"recording_id": (cut.get("recording") or {}).get("id")}
    texts = [str(s["text"]) for s in supervisions if s.get("text")]
    if texts:
        meta["text"] = " ".join(texts)
    for name in ("speaker", "language", "gender"):
        values = [s[name] for s in supervisions if s.get(name) is not None]
        if values:
            meta[name] = values[0] if len(set(map(str, values))) == 1 else values
    if isinstance(cut.get("custom"), dict):
        meta.update({k: v for k, v in cut["custom"].items() if k not in meta})
    return meta


def _cuts(path: Path, problems: Problems) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in _lines(path):
        if not line.strip():
            continue
        origin = f"{path.name}:{number}"
        try:
            cut = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(InputProblem(f"{path}:{number}", "", f"not a JSON cut ({exc.msg})"))
            continue
        if not (isinstance(cut, dict) and isinstance(cut.get("id"), str) and isinstance(cut.get("recording"), dict)):
            problems.append(InputProblem(f"{path}:{number}", "", "not a cut with an 'id' and a 'recording'"))
            continue
        yield origin, cut


def read_lhotse(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The cuts of a CutSet manifest or a Shar directory (see the module docstring), in manifest order."""
    if path.is_dir():
        yield from _read_shar(path, problems)
        return
    for origin, cut in _cuts(path, problems):
        sources = cut["recording"].get("sources") or []
        kinds = [s.get("type") for s in sources if isinstance(s, dict)]
        if len(sources) != 1 or kinds != ["file"]:
            problems.append(InputProblem(f"{path} ({origin})", cut["id"], f"recording sources {kinds}: only one "
                                         "'file' source per recording is supported (not URLs, commands, or a "
                                         "file per channel)"))
            continue
        audio = Path(str(sources[0].get("source", "")))
        audio = audio if audio.is_absolute() else path.parent / audio
        start, duration = float(cut.get("start") or 0.0), cut.get("duration")
        whole = start == 0.0 and duration is not None and \
            abs(float(duration) - float(cut["recording"].get("duration") or -1)) < 1e-3
        yield Source(cut["id"], str(audio), offset=None if whole else start,
                     duration=None if whole or duration is None else float(duration), meta=_meta(cut), origin=origin)


def _read_shar(path: Path, problems: Problems) -> Iterator[Source]:
    for cuts_file in _shar_cut_files(path):
        shard = _SHAR_CUTS.fullmatch(cuts_file.name).group(1)  # type: ignore[union-attr]
        tar = path / f"recording.{shard}.tar"
        try:
            with tarfile.open(tar, "r:") as archive:
                audio = {name.rsplit(".", 1)[0]: (name, info.size) for info in archive
                         if info.isfile() and not (name := info.name).endswith(".json")}
        except (OSError, tarfile.TarError) as exc:
            problems.append(InputProblem(str(tar), "", f"cannot read the Shar recordings ({exc})"))
            continue
        for origin, cut in _cuts(cuts_file, problems):
            member = audio.get(cut["id"])
            if member is None:
                problems.append(InputProblem(f"{cuts_file} ({origin})", cut["id"], f"{tar.name} has no audio "
                                             f"member for this cut (expected {cut['id']}.<ext>)"))
                continue
            yield Source(cut["id"], str(tar), meta=_meta(cut), origin=origin, member=member[0], size=member[1])
