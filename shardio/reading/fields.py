"""Fields: what a sample's ``json`` and ``txt`` members add to it beside its audio."""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FormatError

__all__ = ["BATCH_FIELDS", "add_batch_fields", "add_member_fields", "check_field_names", "json_object"]

BATCH_FIELDS = frozenset({"keys", "lengths", "repeat", "skipped", "epoch", "batch_index"})
"""Fields shardio gives every batch: a sample's metadata field of one of these names would replace the batch's
own (or be replaced by it) unseen, so such a field is refused (:func:`check_field_names`)."""

# typeshed takes make_scanner for a class
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def json_object(data: memoryview, where: str) -> dict[str, Any]:
    """The object in a json member. Text the scanner takes whole skips json.loads's encoding detection and
    whitespace matching (a third of its cost); anything else (a BOM, UTF-16, surrounding whitespace, an
    error) goes through json.loads, which decides."""
    try:
        text = str(data, "utf-8")
        value, end = _scan_json(text, 0)
        if end != len(text):
            raise ValueError("trailing text")
    except (ValueError, StopIteration, RecursionError):  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        try:
            value = json.loads(bytes(data))
        except (ValueError, RecursionError) as exc:
            detail = f"not UTF-8 at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else str(exc)
            raise FormatError(f"{where}: the json member is not valid JSON ({detail})") from None
    if not isinstance(value, dict):
        raise FormatError(
            f"{where}: the json member holds a JSON {type(value).__name__}, expected an object "
            "of metadata fields"
        )
    return value


def add_member_fields(sample: dict[str, Any], members: Mapping[str, memoryview], where: str) -> None:
    """Add the fields of ``members``' ``json`` object, then its ``txt`` as ``text``, to ``sample``; a field
    the sample has already keeps its value."""
    if "json" in members:
        fields = json_object(members["json"], where)
        check_field_names(fields, where)
        for name, value in fields.items():
            sample.setdefault(name, value)
    if "txt" in members:  # kept beside a .json (webdataset's wav + txt + json); the JSON's "text" wins
        sample.setdefault("text", bytes(members["txt"]).decode("utf-8", errors="replace"))


def add_batch_fields(
    samples: list[dict[str, Any]], members: Sequence[Mapping[str, memoryview]], where: str
) -> None:
    """:func:`add_member_fields` of each of a batch's samples, ``members[i]`` to ``samples[i]``."""
    for sample, found in zip(samples, members):
        add_member_fields(sample, found, where)


def check_field_names(fields: Mapping[str, Any], where: str) -> None:
    """A :class:`~shardio.errors.FormatError` when metadata ``fields`` name one of :data:`BATCH_FIELDS`."""
    if not BATCH_FIELDS.isdisjoint(fields):
        clash = sorted(BATCH_FIELDS.intersection(fields))
        raise FormatError(
            f"{where}: the metadata field(s) {', '.join(map(repr, clash))} have the name of a field "
            f"shardio gives every batch ({', '.join(sorted(BATCH_FIELDS))}); rename them in the "
            "corpus and pack it again"
        )
