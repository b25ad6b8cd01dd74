"""Importing an optional trainer with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(extra: str, *modules: str) -> list[ModuleType]:
    """The importable modules among ``modules`` (at least one), else an ImportError naming ``extra``."""
    found = []
    for name in modules:
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            continue
    if not found:
        raise ImportError(
            f"shardio's {extra} integration needs {' or '.join(modules)}: pip install 'shardio[{extra}]'"
        )
    return found
