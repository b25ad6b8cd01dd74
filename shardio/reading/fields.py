"""Fields: what a sample's ``json`` and ``txt`` members add to it beside its audio."""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Mapping
from typing import Any

from ..errors import FormatError

__all__ = ["add_member_fields", "json_object"]

_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed takes it for a class


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
        raise FormatError(f"{where}: the json member holds a JSON {type(value).__name__}, expected an object "
                          "of metadata fields")
    return value


def add_member_fields(sample: dict[str, Any], members: Mapping[str, memoryview], where: str) -> None:
    """Add the fields of ``members``' ``json`` object, then its ``txt`` as ``text``, to ``sample``; a field
    the sample has already keeps its value."""
    if "json" in members:
        for name, value in json_object(members["json"], where).items():
            sample.setdefault(name, value)
    if "txt" in members:  # kept beside a .json (webdataset's wav + txt + json); the JSON's "text" wins
        sample.setdefault("text", bytes(members["txt"]).decode("utf-8", errors="replace"))
