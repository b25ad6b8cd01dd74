"""The package's layout as docs/architecture.md describes it: its layers (:data:`LAYERS`, written here once),
no import cycles between modules (imports in functions count), a docstring on every module and subpackage
saying what lives there, and modules of about 300 lines at most.

``python tests/test_layout.py`` prints the figures: cycles (at import time, and counting imports in
functions), the modules in them, and the imports that cross the layers upwards."""

from __future__ import annotations

import ast
from pathlib import Path

import shardio

PACKAGE = Path(shardio.__file__).parent
MAX_LINES = 330  # "about 300": a module past this is due a split

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # From the ground up: a module imports only modules of its own layer or of the layers below it (modules
    # of one layer may import each other, without a cycle). The single written statement of shardio's layers.
    # errors, and the checks of values users hand in
    ("errors", ("shardio.errors", "shardio.checks", "shardio.version")),
    # paths and URLs, fsspec, ranged reads, retries, atomic writes, locks
    ("storage", ("shardio.storage",)),
    # the on-disk format: tar members, index, columns, writer
    ("shards", ("shardio.shards",)),
    # decisions on metadata
    ("planning, world, state", ("shardio.planning", "shardio.world", "shardio.state", "shardio.jobstate")),
    # members -> decoded samples -> padded batches
    ("reading", ("shardio.reading",)),
    # what runs under the datasets: worker instructions, node plans, sharing
    ("runtime", ("shardio.runtime",)),
    # ShardDataset, MixedDataset
    ("datasets", ("shardio.datasets",)),
    # the corpora importers are packing's inputs
    ("packing", ("shardio.packing", "shardio.integrations.importers")),
    # ShardLoader
    ("loader", ("shardio.loader",)),
    ("ledger, integrations", ("shardio.ledger", "shardio.integrations")),
    ("bench", ("shardio.bench", "shardio.synth")),
    # shardio/__init__.py alone
    ("the public API", ("shardio",)),
    ("cli", ("shardio.cli",)),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    name: str, path: Path, modules: dict[str, Path], *, nested: bool = True, typing: bool = False
) -> set[str]:
    """The shardio modules ``name`` imports: at import time, with ``nested`` in functions and classes too
    (they run later, but a cycle through them is one), and with ``typing`` under ``TYPE_CHECKING`` too
    (annotations only, never run)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                if typing:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                found.update(submodules)
                if base in modules and len(submodules) < len(node.names):  # names the package itself defines
                    found.add(base)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if nested:
                    visit(node.body)
            else:  # if/try/with/for/while bodies run at import time
                visit([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    found.discard(name)
    return found


def _graph(*, nested: bool = True, typing: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    # a package imports what its __init__ names; a module inside it importing a sibling goes through the
    # package only when the __init__ imports something, so __init__ files count as modules of their own
    return {
        name: _imports(name, path, modules, nested=nested, typing=typing) for name, path in modules.items()
    }


def layer_of(module: str) -> int:
    """The number of ``module``'s layer in :data:`LAYERS` (its longest listed prefix; the package itself only
    by its own name)."""
    best, found = -1, -1
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "shardio" and module.startswith(prefix + "."))
            if matches and len(prefix) > best:
                best, found = len(prefix), number
    return found


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module of a higher layer than the importer's."""
    return [
        f"{source} ({LAYERS[layer_of(source)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(source)
    ]


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
    """No cycle, counting the imports made in functions too (a lazy import is a dependency all the same);
    ``TYPE_CHECKING`` imports are exempt (never run: an annotation may name a module
    that imports this one)."""
    assert _cycles(_graph()) == []


def test_every_module_has_a_layer() -> None:
    assert [name for name in _modules() if layer_of(name) < 0] == []


def test_a_layer_imports_only_the_layers_below_it() -> None:
    """Function-level imports included, and ``TYPE_CHECKING`` ones: an annotation names a layer above too."""
    assert _crossings(_graph(typing=True)) == []


def test_one_module_asks_torch_which_worker_this_process_is() -> None:
    """The ambient context (rank, world, DataLoader worker) is detected in shardio.world and
    handed on as a value."""

    def asks(path: Path) -> bool:
        return any(
            isinstance(node, ast.Call) and "get_worker_info" in ast.unparse(node.func)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )

    assert [name for name, path in _modules().items() if asks(path)] == ["shardio.world"]


def test_the_layer_check_finds_an_import_from_above() -> None:
    assert _crossings(
        {"shardio.shards.index": {"shardio.reading.reader"}, "shardio.reading.reader": set()}
    ) == ["shardio.shards.index (shards) imports shardio.reading.reader (reading)"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_and_subpackage_says_what_lives_there() -> None:
    missing = [
        name
        for name, path in _modules().items()
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert missing == []


def test_modules_stay_about_300_lines() -> None:
    long = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def _defined_names(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, classes, assigned names and attributes, keyword names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def _private_uses() -> list[str]:
    """Every use of another shardio module's private name (``_name``, not a dunder): imported from it, or read
    from a module, class or instance other than ``self``/``cls`` (a subclass may use its base's), where the
    using module does not define that name itself."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in _modules().items()}
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for defined in _defined_names(tree):
            owners.setdefault(defined, set()).add(name)
    found = []
    for name, tree in sorted(trees.items()):
        own = _defined_names(tree)
        for node in ast.walk(tree):
            private = []
            if isinstance(node, ast.ImportFrom):
                private = [alias.name for alias in node.names]
            elif isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                private = [node.attr] if node.attr not in own else []
            for attr in private:
                if attr.startswith("_") and not attr.startswith("__") and owners.get(attr, set()) - {name}:
                    found.append(f"{name}:{node.lineno} uses {attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    assert _private_uses() == []


def _report() -> None:
    for nested, what in ((False, "import-time imports"), (True, "all imports (functions too)")):
        graph = _graph(nested=nested)
        cycles = _cycles(graph)
        print(
            f"{what}: {sum(map(len, graph.values()))} edges, {len(cycles)} cycles, "
            f"{sum(map(len, cycles))} modules in them"
        )
        for cycle in cycles:
            print("  cycle:", ", ".join(cycle))
    private = _private_uses()
    print(f"{len(private)} uses of another module's private names")
    for line in private:
        print("  " + line)
    crossings = _crossings(_graph(typing=True))
    print(f"{len(crossings)} imports cross the layers upwards")
    for line in crossings:
        print("  " + line)


if __name__ == "__main__":
    _report()
