"""MkDocs hook: the map of shardio's modules, generated from the package so that it cannot drift.

A page holding the line ``<!-- module-map -->`` gets, in its place, one table per package (the top level,
then each subpackage): every module with the first sentence of its docstring, read with :mod:`ast` (nothing
is imported).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "shardio"
MARKER = "<!-- module-map -->"
_SENTENCE = re.compile(r"(.+?\.)(\s|$)", re.S)
_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]*?)(?:\s*<([^>]*)>)?`")


def _markdown(rst: str) -> str:
    """A docstring's reStructuredText roles and double back-quotes as Markdown code spans."""

    def role(match: re.Match[str]) -> str:
        title, target = match.group(2), match.group(3)
        name = title if target else (title.rsplit(".", 1)[-1] if match.group(1) else title)
        return f"`{name}`"

    return _ROLE.sub(role, rst).replace("``", "`")


def _summary(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = docstring.split("\n\n")[0]
    match = _SENTENCE.match(paragraph)
    text = " ".join((match.group(1) if match else paragraph).split())
    return _markdown(text).replace("|", "\\|")


def _table(package: Path) -> list[str]:
    dotted = ".".join(package.relative_to(PACKAGE.parent).parts)
    rows = [
        f"### `{dotted}`",
        "",
        _summary(package / "__init__.py"),
        "",
        "| module | what it holds |",
        "|---|---|",
    ]
    for module in sorted(package.glob("*.py")):
        if module.name != "__init__.py":
            rows.append(f"| `{module.stem}` | {_summary(module)} |")
    return rows + [""]


def module_map() -> str:
    """The Markdown of every package's table."""
    packages = [PACKAGE, *sorted(p.parent for p in PACKAGE.glob("**/__init__.py") if p.parent != PACKAGE)]
    return "\n".join(line for package in packages for line in _table(package))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated map where the page holds :data:`MARKER`."""
    return markdown.replace(MARKER, module_map()) if MARKER in markdown else markdown
