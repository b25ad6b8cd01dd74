"""Per-sample metadata kept in the index: one JSON object a sample, as a UTF-8 blob plus end offsets.

Datasets indexed in place from another tool's layout (a NeMo tarred dataset, whose text lives in a manifest
rather than in ``{key}.json`` members) keep each sample's fields here; the loader yields them where a
``{key}.json`` member's fields would be. Like the keys (:mod:`shardio.shards.keys`) the blob is mapped
read-only from the columns file and each entry is decoded only when asked for, so no process holds N
dictionaries.

One field name is shardio's own: :data:`MEMBER_FIELD` names the key of the tar members a sample reads when
it is not the sample's own key (a NeMo ``-sub`` repeat reads the first copy's member under its own key).
Entries are bounded (:data:`MAX_ENTRY_BYTES`), and the whole section by :data:`MAX_BYTES_PER_SAMPLE` times
the sample count, which :func:`check_size` checks against the header before anything is mapped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import FormatError, shown_path
from .spans import Spans, join_spans

__all__ = [
    "MAX_BYTES_PER_SAMPLE",
    "MAX_ENTRY_BYTES",
    "MEMBER_FIELD",
    "Metadata",
    "check_size",
    "encode_metadata",
]

MEMBER_FIELD = "__member_key__"
"""The entry field that names the tar members' key when it differs from the sample's key."""
_MEMBER_BYTES = MEMBER_FIELD.encode()
MAX_ENTRY_BYTES = 1 << 16
"""The most bytes one sample's metadata may take (a transcript and a few fields need far less)."""
MAX_BYTES_PER_SAMPLE = 4096
"""The most metadata bytes an index may hold per sample on average (the bound :func:`check_size` applies)."""


def encode_metadata(entries: Sequence[Mapping[str, Any]], where: str = "index") -> tuple[bytes, np.ndarray]:
    """The blob and end offsets (``uint64``) of ``entries``, each a JSON object of at most
    :data:`MAX_ENTRY_BYTES` (:class:`FormatError` naming entry and size otherwise)."""
    encoded = []
    for number, entry in enumerate(entries):
        data = json.dumps(dict(entry), ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
        if len(data) > MAX_ENTRY_BYTES:
            raise FormatError(
                f"{shown_path(where)}: the metadata of sample {number} takes {len(data)} bytes, more than "
                f"{MAX_ENTRY_BYTES}"
            )
        encoded.append(data)
    blob, ends = join_spans(encoded)
    check_size(len(encoded), len(blob), where)
    return blob, ends


def check_size(samples: int, meta_bytes: object, where: str) -> int:
    """``meta_bytes`` (the header's claim) as an integer, at most :data:`MAX_BYTES_PER_SAMPLE` per sample."""
    if isinstance(meta_bytes, bool) or not isinstance(meta_bytes, int) or meta_bytes < 0:
        raise FormatError(
            f"{shown_path(where)}: 'meta_bytes' must be a non-negative integer, not {meta_bytes!r}"
        )
    if meta_bytes > samples * MAX_BYTES_PER_SAMPLE:
        raise FormatError(
            f"{shown_path(where)}: 'meta_bytes' is {meta_bytes}, more than "
            f"{MAX_BYTES_PER_SAMPLE} bytes for each "
            f"of the {samples} samples"
        )
    return meta_bytes


class Metadata(Spans):
    """Every sample's metadata over ``blob`` (bytes or a memory map) and ``ends`` (each entry's end offset);
    ``where`` names the file in errors."""

    _what = "the metadata of sample {}"

    @classmethod
    def of(cls, entries: Sequence[Mapping[str, Any]], where: str = "index") -> Metadata:
        """Metadata held in memory (for an index being built)."""
        blob, ends = encode_metadata(entries, where)
        return cls(blob, ends, where)

    def _raw(self, i: int) -> bytes:
        start, end = self._span(i, MAX_ENTRY_BYTES)
        return bytes(self._blob[start:end])

    def entry(self, i: int, raw: bytes | None = None) -> dict[str, Any]:
        """Entry number ``i`` as stored (``MEMBER_FIELD`` included), checked to be a bounded JSON object."""
        raw = self._raw(i) if raw is None else raw
        try:
            value = json.loads(raw.decode("utf-8"))  # str: json.loads skips its encoding detection
        except (ValueError, RecursionError):
            raise FormatError(
                f"{self._where}: the metadata of sample {i} is not valid JSON: the index is damaged"
            ) from None
        if not isinstance(value, dict):
            raise FormatError(
                f"{self._where}: the metadata of sample {i} is a JSON {type(value).__name__}, "
                "expected an object"
            )
        return value

    def fields(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s metadata fields (the user's: without :data:`MEMBER_FIELD`)."""
        value = self.entry(i)
        value.pop(MEMBER_FIELD, None)
        return value

    def member_key(self, i: int) -> str | None:
        """The key of the tar members sample ``i`` reads, when it is not its own key; else None."""
        raw = self._raw(i)
        if _MEMBER_BYTES not in raw:  # the usual case, without decoding the entry
            return None
        member = self.entry(i, raw).get(MEMBER_FIELD)
        if member is not None and not isinstance(member, str):
            raise FormatError(
                f"{self._where}: sample {i}'s {MEMBER_FIELD!r} is not a string: the index is damaged"
            )
        return member
