"""The package's layout as the README describes it: no import cycles between modules, a docstring on every
module and subpackage saying what lives there, and modules of about 300 lines at most."""

from __future__ import annotations

import ast
from pathlib import Path

import shardio

PACKAGE = Path(shardio.__file__).parent
MAX_LINES = 330  # "about 300": a module past this is due a split


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_time_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The shardio modules that importing ``name`` imports: its module-level imports, outside ``TYPE_CHECKING``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                found.update(submodules)
                if base in modules and len(submodules) < len(node.names):  # names the package itself defines
                    found.add(base)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_no_module_imports_itself_back() -> None:
    modules = _modules()
    # a package imports what its __init__ names; a module inside it importing a sibling goes through the
    # package only when the __init__ imports something, so __init__ files count as modules of their own
    graph = {name: _import_time_imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_and_subpackage_says_what_lives_there() -> None:
    missing = [name for name, path in _modules().items()
               if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))]
    assert missing == []


def test_modules_stay_about_300_lines() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
