"""Kaldi data dirs as a corpus: ``wav.scp`` (plain paths), ``text``, ``utt2spk`` and ``segments`` read as
sources (behind :func:`shardio.packing.corpus.read_kaldi`)."""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError, InputProblem
from .source import Problems, Source, manifest_text, resolve_path

__all__ = ["kaldi_sources"]


def _kaldi_table(path: Path, problems: Problems, fields: int) -> dict[str, tuple[list[str], str]]:
    """``{first field: (the other fields, 'file:line')}``; the last of ``fields`` takes
    the rest of the line."""
    table: dict[str, tuple[list[str], str]] = {}
    if not path.is_file():
        return table
    with io.StringIO(manifest_text(path, "utf-8")) as handle:
        for number, line in enumerate(handle, 1):
            parts = line.strip().split(maxsplit=fields - 1)
            if not parts:
                continue
            where = f"{path}:{number}"
            if len(parts) < fields and not (fields == 2 and path.name == "text"):
                problems.append(
                    InputProblem(where, parts[0], f"expected {fields} fields, found {len(parts)}")
                )
                continue
            if parts[0] in table:
                problems.append(
                    InputProblem(
                        where,
                        parts[0],
                        f"{parts[0]!r} is listed twice in {path.name} (first at {table[parts[0]][1]})",
                    )
                )
                continue
            table[parts[0]] = (parts[1:], where)
    return table


_ARCHIVE_OFFSET = re.compile(r".+:[0-9]+")


def _kaldi_extended(command: str) -> str | None:
    """What a ``wav.scp`` entry that is no plain file asks of Kaldi's I/O, as words (None for a plain path):
    a piped command, standard input, an offset into an archive or a range of a file."""
    if command.endswith("|"):
        return "a piped command"
    if command == "-":
        return "standard input"
    if _ARCHIVE_OFFSET.fullmatch(command):
        return "an offset into a Kaldi archive"
    if command.endswith("]") and "[" in command:
        return "a range of a file"
    return None


def kaldi_sources(data_dir: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
    """A Kaldi data dir: ``wav.scp`` (plain paths), ``text``, optional ``utt2spk`` and ``segments``. Lines of
    ``text`` and ``utt2spk`` whose id is no utterance's are counted in ``left_out``."""
    if not (data_dir / "wav.scp").is_file():
        raise InputError([InputProblem(str(data_dir), "", "not a Kaldi data dir: no wav.scp")])
    recordings = _kaldi_table(data_dir / "wav.scp", problems, 2)
    texts = _kaldi_table(data_dir / "text", problems, 2)
    speakers = _kaldi_table(data_dir / "utt2spk", problems, 2)
    paths: dict[str, str] = {}
    for rec, ([command], where) in recordings.items():
        unsupported = _kaldi_extended(command)
        if unsupported and not Path(resolve_path(data_dir, command)).is_file():
            problems.append(
                InputProblem(
                    where,
                    rec,
                    f"wav.scp entry is {unsupported} ({command!r}); only plain "
                    "file paths are supported: write the audio to files first",
                )
            )
            continue
        resolved = Path(resolve_path(data_dir, command))
        # Kaldi paths are relative to the recipe directory the tools run in, usually the cwd.
        paths[rec] = str(
            resolved if resolved.exists() or Path(command).is_absolute() else Path(command).resolve()
        )
    segments = _kaldi_table(data_dir / "segments", problems, 4)
    if segments:
        items = [(utt, fields, where) for utt, (fields, where) in segments.items()]
    else:
        items = [(rec, [rec], where) for rec, (_, where) in recordings.items()]
    for utt, fields, where in items:
        rec = fields[0]
        if rec not in paths:
            if rec not in recordings:
                problems.append(InputProblem(where, utt, f"recording {rec!r} is not in wav.scp"))
            continue
        offset = duration = None
        meta: dict[str, Any] = {}
        if segments:
            try:
                start, end = float(fields[1]), float(fields[2])
            except ValueError:
                problems.append(InputProblem(where, utt, f"segment times {fields[1:]} are not numbers"))
                continue
            if start < 0 or (end >= 0 and end <= start):
                problems.append(InputProblem(where, utt, f"segment [{start}, {end}] is empty or negative"))
                continue
            offset, duration = start, (end - start if end >= 0 else None)
            meta["recording"] = rec
        if utt in texts:
            meta["text"] = texts[utt][0][0] if texts[utt][0] else ""
        if utt in speakers:
            meta["speaker"] = speakers[utt][0][0]
        yield Source(
            key=utt, audio_path=paths[rec], offset=offset, duration=duration, meta=meta, origin=where
        )
    utterances = {utt for utt, _, _ in items}
    for name, table in (("text", texts), ("utt2spk", speakers)):
        stray = len(table.keys() - utterances)  # keyed by recording where segments name utterances, say
        if stray:
            left_out[f"{name} lines naming no utterance"] += stray
