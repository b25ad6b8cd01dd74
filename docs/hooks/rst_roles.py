"""Griffe extension: the docstrings' reStructuredText roles shown as Markdown code spans.

shardio's docstrings name other objects Sphinx's way (``:class:`~shardio.Index```,
``:meth:`title <target>```); mkdocstrings renders Markdown, where those would show as written. Each role
becomes a code span of what Sphinx would show (the last part of a ``~`` target, else the target or the
title), so the reference pages read as the docstrings mean, and no role can become a broken cross-reference
in a strict build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]*?)(?:\s*<([^>`]*)>)?`")


def markdown(text: str) -> str:
    """``text`` with every reStructuredText role replaced by a Markdown code span."""

    def span(match: re.Match[str]) -> str:
        tilde, title, target = match.groups()
        shown = title.strip() if target else (title.rsplit(".", 1)[-1] if tilde else title)
        return f"`{shown}`"

    return _ROLE.sub(span, text)


class RstRoles(griffe.Extension):
    """Rewrite each loaded object's docstring (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
