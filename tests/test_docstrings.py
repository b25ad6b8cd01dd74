"""The reference is worth reading: every public callable documents its arguments in a Google-style ``Args:``
section (what the API pages render), and that section names exactly the parameters the code takes.

Public callables: the names in ``shardio.__all__`` and in the integrations' ``__all__``; for a class, its
constructor (documented in the class docstring) and its public methods, those it inherits from shardio classes
too. A method that implements a hook of a framework's base class (Lightning's ``Callback``), and a constructor
that passes ``*args, **kwargs`` on to one (a ``Trainer``), are the framework's to document.
``python tests/test_docstrings.py`` lists what is missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import shardio

INTEGRATIONS = ("lightning", "accelerate", "speechbrain", "transformers", "torchdata")
"""The modules of ``shardio.integrations`` whose public names are checked (those that exist and import)."""

_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(\s*\([^)]*\))?:")


def _ours(obj: object) -> bool:
    return getattr(obj, "__module__", "").partition(".")[0] == "shardio"


def documented_args(doc: str | None) -> list[str] | None:
    """The parameter names a docstring's ``Args:`` section lists (``None``: it has no such section)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = next(
            i
            for i, line in enumerate(lines)
            if line.strip() in ("Args:", "Arguments:") and not line.startswith(" ")
        )
    except StopIteration:
        return None
    names = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            if _SECTION.match(line) or line.strip():
                break
        body = line[4:] if line.startswith("    ") else None
        if body is not None and not body.startswith(" "):
            entry = _ENTRY.match(body)
            if entry:
                names.append(entry.group(1))
    return names


def _parameters(function: Callable[..., Any], skip_first: bool) -> list[str]:
    found = []
    for parameter in list(inspect.signature(function).parameters.values())[1 if skip_first else 0 :]:
        prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(
            parameter.kind, ""
        )
        found.append(prefix + parameter.name)
    return found


def _constructor(cls: type) -> list[str] | None:
    """The parameters a class's constructor takes, where a shardio class defines it (else None)."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
    owner = next((base for base in cls.__mro__ if "__init__" in vars(base)), object)
    return _parameters(vars(owner)["__init__"], True) if _ours(owner) else None


def _methods(cls: type) -> Iterator[tuple[str, Callable[..., Any], bool]]:
    """The public methods of ``cls`` that shardio defines: (name, function, whether it takes self or cls)."""
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        owners = [base for base in cls.__mro__ if name in vars(base)]
        if (
            not owners
            or not _ours(owners[0])
            or any(not _ours(base) and base is not object for base in owners)
        ):
            continue  # another library's, or a hook of a framework's base class
        member = vars(owners[0])[name]
        if isinstance(member, staticmethod):
            yield name, member.__func__, False
        elif isinstance(member, classmethod):
            yield name, member.__func__, True
        elif inspect.isfunction(member):
            yield name, member, True


def public_callables() -> Iterator[tuple[str, list[str], str | None]]:
    """(qualified name, parameters, docstring) of every public callable that takes arguments."""
    modules: list[tuple[str, Any, list[str]]] = [("shardio", shardio, list(shardio.__all__))]
    for name in INTEGRATIONS:
        try:
            module = importlib.import_module(f"shardio.integrations.{name}")
        except ImportError as exc:  # an integration not written yet, or its extra missing (not another error)
            if exc.name == f"shardio.integrations.{name}" or "pip install 'shardio[" in str(exc):
                continue
            raise
        modules.append((module.__name__, module, list(module.__all__)))
    for module_name, module, names in modules:
        for name in names:
            obj = getattr(module, name)
            where = f"{module_name}.{name}"
            if inspect.isclass(obj):
                if issubclass(obj, BaseException) and not _ours(obj.__init__):
                    continue
                parameters = _constructor(obj)
                if parameters == ["*args", "**kwargs"] and not all(_ours(base) for base in obj.__mro__[:-1]):
                    parameters = (
                        None  # everything passed on to a framework's class (a Trainer), which documents it
                    )
                if parameters:
                    yield where, parameters, obj.__doc__
                for method, function, bound in _methods(obj):
                    parameters = _parameters(function, bound)
                    if parameters:
                        yield f"{where}.{method}", parameters, function.__doc__
            elif inspect.isfunction(obj):
                parameters = _parameters(obj, False)
                if parameters:
                    yield where, parameters, obj.__doc__


def problems() -> list[str]:
    """What is wrong with the public callables' ``Args:`` sections, one line each."""
    found = []
    for where, parameters, doc in public_callables():
        listed = documented_args(doc)
        if listed is None:
            found.append(f"{where}: no Args: section (takes {', '.join(parameters)})")
            continue
        missing = [p for p in parameters if p not in listed]
        extra = [p for p in listed if p not in parameters]
        if missing:
            found.append(f"{where}: Args: misses {', '.join(missing)}")
        if extra:
            found.append(f"{where}: Args: names {', '.join(extra)}, which it does not take")
    return found


def test_the_args_parser_reads_google_sections() -> None:
    doc = """Summary.

    Args:
        source (str): where.
            More about it: not an entry.
        batch_size: how many.
        **deprecated: old keywords.

    Returns:
        value: not an argument.
    """
    assert documented_args(doc) == ["source", "batch_size", "**deprecated"]
    assert documented_args("Summary only.") is None


def test_every_public_callable_documents_its_arguments() -> None:
    found = problems()
    assert not found, f"{len(found)} public callables' Args: sections are missing or wrong:\n" + "\n".join(
        found
    )


if __name__ == "__main__":
    listed = problems()
    print("\n".join(listed))
    bare = [p.partition(":")[0] for p in listed if "no Args" in p]
    top = [p for p in bare if p.startswith("shardio.") and p.count(".") == 1]
    print(
        f"{len(top)} of shardio.__all__'s callables without an Args: section; {len(bare)} public callables "
        f"(methods and integrations too); {len(listed)} problems in all"
    )
