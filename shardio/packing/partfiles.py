"""The files of a partitioned pack under ``_parts``: named here, read back as untrusted data, removed by name.

A partitioned pack writes ``_parts/plan.json`` (its plan's fingerprint) and, for each partition ``p``,
``_parts/{p:05d}/`` holding ``report.json`` (rejected inputs, input bytes, the plan), ``index.columns`` and
``index.json`` (the commit marker). Anyone who can write the output folder can write these files, so they
are read as any state file is (:func:`~shardio.storage.statefiles.read_state_bytes`: a regular file, bounded,
never waited on; :func:`~shardio.storage.statefiles.parse_state_json`: nesting and values bounded) and their
fields checked, each failure a :class:`~shardio.errors.FormatError` naming the file. Only these names are ever
removed (regular files, never a folder's other contents: a file the pack did not write is never deleted); a
folder is removed only once empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, InputProblem, shown, shown_path
from ..shards.index import INDEX_COLUMNS, INDEX_JSON
from .output import Output

__all__ = [
    "PARTS_DIR",
    "PLAN_FILE",
    "REPORT_FILE",
    "PartReport",
    "part_dir",
    "read_plan_fingerprint",
    "read_report",
    "remove_part",
    "remove_parts",
]

logger = logging.getLogger(__name__)

PARTS_DIR = "_parts"
PLAN_FILE = f"{PARTS_DIR}/plan.json"
REPORT_FILE = "report.json"
MAX_PLAN_BYTES = 1 << 16
"""The largest ``plan.json`` read: a fingerprint and two counts."""
MAX_INPUT_BYTES = 1 << 62
"""The most input bytes a report may claim (an exabyte and more: a count, not a bound on memory)."""


def part_dir(number: int) -> str:
    """Where partition ``number``'s index part and report go, relative to the output directory."""
    return f"{PARTS_DIR}/{number:05d}"


def _part_files(number: int) -> list[str]:
    """Partition ``number``'s files, its commit marker first (removed first, it uncommits the part)."""
    return [f"{part_dir(number)}/{name}" for name in (INDEX_JSON, INDEX_COLUMNS, REPORT_FILE)]


def read_plan_fingerprint(output: Output) -> str:
    """The plan fingerprint recorded in ``_parts/plan.json`` under ``output``.

    Raises:
        FormatError: the file is not a regular file, is too large or too deep, or is not a JSON object with
            a string ``fingerprint``; the message names it.
    """
    where = output.path(PLAN_FILE)
    document = output.load_json(PLAN_FILE, "partitioned pack's plan", MAX_PLAN_BYTES)
    fingerprint = document.get("fingerprint") if isinstance(document, dict) else None
    if not isinstance(fingerprint, str) or not fingerprint.isascii() or not fingerprint.isalnum():
        raise FormatError(
            f"{shown_path(where)}: not a partitioned pack's plan (a JSON object whose 'fingerprint' is a "
            f"string of letters and digits; it holds {shown(document, 60)}): remove "
            f"{shown_path(output.path(PARTS_DIR))} or use another directory"
        )
    return fingerprint


@dataclass(frozen=True)
class PartReport:
    """What a partition's ``report.json`` records."""

    problems: list[InputProblem]
    input_bytes: int
    plan: str


def read_report(output: Output, number: int, inputs: int) -> PartReport:
    """Partition ``number``'s report, checked: at most ``inputs`` rejected inputs (the partition's count),
    each three strings, a non-negative count of input bytes, and a plan fingerprint string.

    Raises:
        FormatError: the report is not a regular file, too large or deep, or any field is not as above; the
            message names the file and the field.
    """
    name = f"{part_dir(number)}/{REPORT_FILE}"
    where = shown_path(output.path(name))
    report = output.load_json(name, "partition's report")

    def bad(field: str, expected: str, value: Any) -> FormatError:
        return FormatError(
            f"{where}: not a partition's report: {field} is {expected}, not {shown(value, 60)}; remove "
            f"{shown_path(output.path(part_dir(number)))} and pack again"
        )

    if not isinstance(report, dict):
        raise bad("the document", "a JSON object", report)
    problems, input_bytes, plan = report.get("problems"), report.get("input_bytes"), report.get("plan", "")
    if not isinstance(problems, list) or len(problems) > inputs:
        raise bad("'problems'", f"a list of at most {inputs} (the partition's inputs)", problems)
    parsed = []
    for problem in problems:
        if (
            not isinstance(problem, dict)
            or set(problem) != {"source", "key", "reason"}
            or not all(isinstance(value, str) for value in problem.values())
        ):
            raise bad("a problem", "an object of strings 'source', 'key' and 'reason'", problem)
        parsed.append(InputProblem(problem["source"], problem["key"], problem["reason"]))
    if type(input_bytes) is not int or not 0 <= input_bytes <= MAX_INPUT_BYTES:
        raise bad("'input_bytes'", f"an integer from 0 to {MAX_INPUT_BYTES}", input_bytes)
    if not isinstance(plan, str):
        raise bad("'plan'", "a string", plan)
    return PartReport(parsed, input_bytes, plan)


def remove_part(output: Output, number: int) -> None:
    """Remove partition ``number``'s files (its commit marker first), and its folder if nothing else is in
    it."""
    for name in _part_files(number):
        output.remove_file(name)
    output.remove_empty_dir(part_dir(number))


def remove_parts(output: Output, partitions: int) -> None:
    """Remove what a plan of ``partitions`` partitions wrote under ``_parts`` (each partition's files, then
    ``plan.json``), and ``_parts`` itself if nothing else is left in it; anything else is left in place,
    with a warning naming the folder."""
    for number in range(partitions):
        remove_part(output, number)
    output.remove_file(PLAN_FILE)
    if not output.remote:
        _remove_killed_attempts(output.path(PARTS_DIR))
    output.remove_empty_dir(PARTS_DIR)
    if output.exists(PARTS_DIR):
        logger.warning(
            "%s: left in place: it holds files this pack did not write (or an attempt killed mid-way left)",
            shown_path(output.path(PARTS_DIR)),
        )


_ATTEMPT = re.compile(r"^\.attempt-[0-9]{5}-[0-9a-f]{32}$")  # pack_partition's folder of one local attempt
_ATTEMPT_FILE = re.compile(r"^(\.shardio\.lock|\.tmp-.*|\..*\.(writing|partial)|[^.].*\.tar(\.zst)?)$")
"""What a ShardWriter writes in an attempt's folder: its lock, temporary files, journal, partial and whole
shards."""


def _remove_killed_attempts(parts: str) -> None:
    """The folders of attempts killed mid-way (a finished attempt removes its own): each one's files of the
    names a ShardWriter writes (regular files, never a link), then the folder if nothing else is in it."""
    try:
        entries = [e for e in os.scandir(parts) if _ATTEMPT.match(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries:
        with contextlib.suppress(OSError):
            for inner in os.scandir(entry.path):
                if _ATTEMPT_FILE.match(inner.name) and inner.is_file(follow_symlinks=False):
                    os.unlink(inner.path)
            os.rmdir(entry.path)
