"""Lhotse corpora as a corpus: a CutSet manifest (``cuts.jsonl[.gz]``) or a Lhotse Shar directory.

A cut of a CutSet becomes a segment of its recording's file (``start``/``duration``; the whole file when the
cut covers it; a relative path is taken from the manifest's folder); a Shar directory's ``cuts.N.jsonl[.gz]``
pairs with ``recording.N.tar``, whose ``{cut id}.{ext}`` member is copied as it is. The supervisions' texts
(joined by spaces) are the transcript; their speaker and language, the cut's ``custom`` fields and the
recording id become metadata. The manifests are read as JSON, so the ``lhotse`` package is not needed to read
them. Recordings that are URLs, commands or one file per channel are listed as problems.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tarfile
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import InputProblem, shown
from ...packing.manifestlines import numbered_lines
from ...packing.source import NotRegularFile, Problems, Source, open_regular_input
from .kinds import first_json_object

__all__ = ["is_lhotse", "read_lhotse"]

_SHAR_CUTS = re.compile(r"cuts\.(\d+)\.jsonl(\.gz)?")
_MAX_LINE = 16 << 20  # bytes of one cut: a gzip bomb of one endless line must not be read into memory whole


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


def _lines(path: Path, problems: Problems) -> Iterator[tuple[int, str]]:
    """The manifest's numbered lines (gunzipped for ``.gz``); a file that is not a regular file, not gzip or
    ends early is a problem naming it, and a line that is not UTF-8 or longer than :data:`_MAX_LINE`, one
    naming the line."""
    number = 0
    try:
        with open_regular_input(path) as raw:
            handle = gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw
            with handle:
                for number, line in numbered_lines(handle, str(path), problems, _MAX_LINE):
                    yield number, line
    except (NotRegularFile, OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, NotRegularFile) else shown(str(exc))
        problems.append(
            InputProblem(
                f"{path}:{number + 1}" if number else str(path),
                "",
                f"cannot read the manifest ({reason}); expected a JSONL or gzipped JSONL file of cuts",
            )
        )


def _seconds(value: Any, name: str, *, positive: bool = False) -> float:
    """A cut's or recording's time field as finite seconds (>= 0, or > 0 when
    ``positive``), else ValueError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise ValueError(
            f"{name} is {shown(value)}, expected a finite number of seconds {'> 0' if positive else '>= 0'}"
        )
    return float(value)


def _channel_set(value: Any) -> list[str]:
    """A cut's ``channel`` or a recording's ``channel_ids`` (a number or a list) in a comparable form."""
    return sorted(map(str, value if isinstance(value, list) else [value]))


def _span(cut: dict[str, Any]) -> tuple[float | None, float | None]:
    """The cut's ``(offset, duration)`` in its recording, ``(None, None)`` when it is the whole recording;
    ValueError for a time that is not finite seconds, or a channel selection that is not every channel."""
    recording = cut["recording"]
    start = _seconds(cut.get("start", 0.0), "'start'")
    duration = _seconds(cut.get("duration"), "'duration'", positive=True)
    total = _seconds(recording.get("duration"), "the recording's 'duration'", positive=True)
    channels = recording.get("channel_ids")
    wanted = cut.get("channel")
    if wanted is not None and channels is not None and _channel_set(wanted) != _channel_set(channels):
        raise ValueError(
            f"the cut takes channel(s) {shown(wanted)} of a recording with channels "
            f"{shown(channels)}; pack keeps every channel of the file, so expected all of them"
        )
    if start == 0.0 and abs(duration - total) < 1e-3:
        return None, None
    return start, duration


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
    for number, line in _lines(path, problems):
        if not line.strip():
            continue
        origin = f"{path.name}:{number}"
        try:
            cut = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            problems.append(InputProblem(f"{path}:{number}", "", f"not a JSON cut ({reason})"))
            continue
        if not (
            isinstance(cut, dict)
            and isinstance(cut.get("id"), str)
            and isinstance(cut.get("recording"), dict)
        ):
            problems.append(InputProblem(f"{path}:{number}", "", "not a cut with an 'id' and a 'recording'"))
            continue
        yield origin, cut


def read_lhotse(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """The cuts of a CutSet manifest or a Shar directory (see the module docstring), in manifest order."""
    if path.is_dir():
        yield from _read_shar(path, problems)
        return
    for origin, cut in _cuts(path, problems):
        sources = cut["recording"].get("sources")
        sources = sources if isinstance(sources, list) else []
        kinds = [s.get("type") for s in sources if isinstance(s, dict)]
        if (
            len(sources) != 1
            or kinds != ["file"]
            or not isinstance(sources[0].get("source"), str)
            or not sources[0]["source"]
        ):
            problems.append(
                InputProblem(
                    f"{path} ({origin})",
                    cut["id"],
                    f"recording sources {shown(kinds)}: only "
                    "one 'file' source (a path) per recording is supported (not URLs, "
                    "commands, or a file per channel)",
                )
            )
            continue
        try:
            offset, duration = _span(cut)
        except ValueError as exc:
            problems.append(InputProblem(f"{path} ({origin})", cut["id"], str(exc)))
            continue
        audio = Path(sources[0]["source"])
        audio = audio if audio.is_absolute() else path.parent / audio
        yield Source(cut["id"], str(audio), offset=offset, duration=duration, meta=_meta(cut), origin=origin)


def _read_shar(path: Path, problems: Problems) -> Iterator[Source]:
    for cuts_file in _shar_cut_files(path):
        shard = _SHAR_CUTS.fullmatch(cuts_file.name).group(1)  # type: ignore[union-attr]
        tar = path / f"recording.{shard}.tar"
        try:
            with open_regular_input(tar) as raw, tarfile.open(fileobj=raw, mode="r:") as archive:
                audio = {
                    name.rsplit(".", 1)[0]: (name, info.size)
                    for info in archive
                    if info.isfile() and not (name := info.name).endswith(".json")
                }
        except (OSError, tarfile.TarError) as exc:  # a FIFO is refused, not read (it would block)
            reason = exc.strerror if isinstance(exc, NotRegularFile) else exc
            problems.append(InputProblem(str(tar), "", f"cannot read the Shar recordings ({reason})"))
            continue
        for origin, cut in _cuts(cuts_file, problems):
            member = audio.get(cut["id"])
            if member is None:
                problems.append(
                    InputProblem(
                        f"{cuts_file} ({origin})",
                        cut["id"],
                        f"{tar.name} has no audio member for this cut (expected {cut['id']}.<ext>)",
                    )
                )
                continue
            yield Source(
                cut["id"], str(tar), meta=_meta(cut), origin=origin, member=member[0], size=member[1]
            )
