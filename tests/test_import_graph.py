"""The import graph of ``loadlab`` and ``reference_server`` runs with the data flow.

Every ``import`` statement counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING``): a lazy import hides a cycle from the interpreter, not from a reader.
An import names the most specific module it loads (``from loadlab.workloads import base`` is an
edge to ``loadlab.workloads._base``; ``from loadlab.workloads import build_requests`` one to the
package ``loadlab.workloads``). The parent packages an import also runs are left out: counting
them would make every package ``__init__`` that re-exports a submodule a cycle.

Two rules:

- no cycle, of any length;
- the data layers (workloads, records, results, metrics) never import the layers that drive a
  run (runner, clients, commands): requests are described before anything sends them, and a
  results file is read without loading the HTTP client.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("loadlab", "reference_server")

DATA_LAYERS = ("loadlab.workloads", "loadlab.records", "loadlab.results", "loadlab._analysis")
DRIVING_LAYERS = ("loadlab._runner", "loadlab.clients", "loadlab._commands")


def _module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that one import statement loads."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield from _known_prefix(alias.name, known)
        return
    if not isinstance(node, ast.ImportFrom):
        return
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in known:
            yield sub
        else:
            yield from _known_prefix(target, known)


def _known_prefix(name: str, known: set[str]) -> Iterator[str]:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            yield candidate
            return


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (itself excluded)."""
    files = _module_files()
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges = {
            target
            for node in ast.walk(tree)
            for target in _imported(node, module, is_package, known)
        }
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _within(module: str, layers: tuple[str, ...]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def test_the_walk_sees_lazy_and_relative_imports() -> None:
    graph = import_graph()
    assert "loadlab.records" in graph["loadlab._analysis.metrics"]
    assert "loadlab._runner.runner" in graph
    assert "reference_server.engine" in graph
    # a function-level import is an edge (commands/run.py loads the runner when it runs)
    assert any(_within(m, ("loadlab._runner",)) for m in graph["loadlab._commands.run"])


def test_the_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_there_is_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_data_layers_never_import_the_layers_that_drive_a_run() -> None:
    bad = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if _within(module, DATA_LAYERS)
        for target in targets
        if _within(target, DRIVING_LAYERS)
    )
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def test_no_module_imports_the_package_it_belongs_to() -> None:
    """A package ``__init__`` re-exports its modules (``loadlab``'s is the public API), so a
    module importing it closes a cycle as soon as that ``__init__`` imports the module.
    ``from loadlab._analysis import metrics`` names the module, not the package, and is fine."""
    graph = import_graph()
    bad = sorted(
        f"{module} imports {package}"
        for package in PACKAGES
        for module, targets in graph.items()
        if package in targets and module != package
    )
    assert not bad, "import the module, not the package:\n" + "\n".join(bad)


def test_the_offline_report_loads_neither_runner_nor_client() -> None:
    """``loadlab report`` reads a file: it needs no HTTP client and no run machinery."""
    loaded = _reachable(import_graph(), "loadlab._commands.report")
    assert not sorted(m for m in loaded if _within(m, ("loadlab._runner", "loadlab.clients")))
