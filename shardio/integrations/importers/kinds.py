"""The corpus kinds importers add to :func:`shardio.packing.corpus.read_corpus`,
detected and imported lazily."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...packing.manifestlines import MAX_LINE_BYTES, json_entry
from ...packing.source import NotRegularFile, Problems, Source, open_regular_input

__all__ = ["IMPORTED_KINDS", "detect_imported", "first_json_object", "imported_reader"]

IMPORTED_KINDS: dict[str, tuple[str, str, str]] = {
    "hf": ("hf", "is_hf_dataset", "read_hf"),
    "lhotse": ("lhotse_cuts", "is_lhotse", "read_lhotse"),
    "nemo": ("nemo", "is_nemo_manifest", "read_nemo"),
}
"""kind -> (module of :mod:`shardio.integrations.importers`, its detector, its reader)."""


def _function(module: str, name: str) -> Callable[..., object]:
    function: Callable[..., object] = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return function


def first_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object on the first line of the manifest at ``path``, or None (a detector's look at a file
    that may be any other kind of corpus). The line is read as the manifest reader reads it
    (:func:`~shardio.packing.manifestlines.json_entry`: at most
    :data:`~shardio.packing.manifestlines.MAX_LINE_BYTES`, nested at most
    :data:`~shardio.packing.manifestlines.MAX_DEPTH` deep); a file that is not regular (a FIFO would
    block) or a line that reader refuses is None here, and the reader then names the problem."""
    try:
        with open_regular_input(path) as handle:
            first = handle.readline(MAX_LINE_BYTES + 1)
    except NotRegularFile:
        return None
    if len(first) > MAX_LINE_BYTES:
        return None
    try:
        return json_entry(first.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return None


def detect_imported(location: Path) -> str | None:
    """The imported kind of the existing corpus at ``location``, or None."""
    for kind, (module, detector, _) in IMPORTED_KINDS.items():
        if _function(module, detector)(location):
            return kind
    return None


def imported_reader(kind: str) -> Callable[[Path, Problems, Counter[str]], Iterator[Source]]:
    """A reader for ``kind`` that imports its module on first use."""
    module, _, name = IMPORTED_KINDS[kind]

    def read(path: Path, problems: Problems, left_out: Counter[str]) -> Iterator[Source]:
        return _function(module, name)(path, problems, left_out)  # type: ignore[return-value]

    read.__name__ = f"_read_{kind}"
    read.__doc__ = f"A {kind} corpus (see :mod:`shardio.integrations.importers.{module}`)."
    return read
