"""Names: what a tar member's name, a sample's key or a shard's name may hold.

WebDataset's convention splits a member name ``{key}.{ext}`` at the basename's first dot; a key is a
relative path with no empty, ``.`` or ``..`` parts; and no name may hold a character that a terminal obeys
instead of showing (controls, bidi overrides), so a name never reads as another in a message.
"""

from __future__ import annotations

import re
import unicodedata

from ..errors import FormatError

__all__ = ["has_hidden", "key_problem", "split_name"]

_KEY_EXT = re.compile(r"((?:.*/|)[^./]+)\.([^/]+)", re.DOTALL)


def split_name(name: str) -> tuple[str, str]:
    """Split a member name into ``(key, ext)``: the key is the path up to the basename's first dot."""
    match = _KEY_EXT.fullmatch(name)
    if match is None:
        raise FormatError(f"member name {name!r} is not of the form '{{key}}.{{ext}}'")
    return match.group(1), match.group(2)


_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Format characters that reorder the text around them (embeddings, overrides, isolates, marks)."""


def has_hidden(text: str) -> bool:
    """Whether ``text`` holds a control character (C0 or C1) or a bidi control, which a terminal obeys when it
    prints them: a name that reads as another. Other format characters stay (ZERO WIDTH NON-JOINER is part of
    Persian words)."""
    if text.isprintable():  # in C, and printable text has neither
        return False
    return any(unicodedata.category(ch) == "Cc" or ch in _BIDI_CONTROLS for ch in text)


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a WebDataset key, or None when it can."""
    if not key:
        return "the key is empty"
    if "." in key.rsplit("/", 1)[-1]:
        return "the key's basename contains a '.', which readers take as the start of the extension"
    if key.startswith("/") or key.endswith("/") or "//" in key:
        return "the key must be a relative path with no empty parts"
    if any(part in (".", "..") for part in key.split("/")):
        return "the key must not contain '.' or '..' path parts"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "the key is not valid UTF-8 (a file or folder name with bytes that are not UTF-8)"
    if has_hidden(key):
        return "the key contains a control character or a bidi control (such as a right-to-left override)"
    return None
