"""The import graph of tinyvllm/, debugger/ and kernels_numba/, read from the source (every import statement,
those inside functions too): no circle, nothing in tinyvllm/ imports the debugger, the engine imports no
kernels. Command modules named as strings (tinyvllm/cli's COMMANDS) are not imports, by design."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tinyvllm", "debugger", "kernels_numba")


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of PACKAGES (a package is its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement of `tree` can load: `import a.b` -> a.b; `from a import b` -> a.b
    and a (b may be a name defined in a's __init__); relative imports resolved against `module`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports (a name that is not a module counts as its package)."""
    modules = module_files() if modules is None else modules
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = set()
        for name in imported_names(tree, module, path.name == "__init__.py"):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def imports_of(graph, prefix: str, target: str) -> list[tuple[str, str]]:
    """(importer, imported) for the modules under `prefix` that import something under `target`."""
    def under(name, package):
        return name == package or name.startswith(package + ".")
    return sorted((m, t) for m, ts in graph.items() if under(m, prefix) for t in ts if under(t, target))


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def test_tinyvllm_does_not_import_the_debugger(graph):
    assert imports_of(graph, "tinyvllm", "debugger") == []


def test_the_engine_imports_no_kernels(graph):
    assert imports_of(graph, "tinyvllm.engine", "kernels_numba") == []


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path):
    """An import inside a function of engine/args.py, of a debugger module that imports engine/args.py: an
    upward import and a circle, and both checks see it."""
    modules = module_files()
    planted = tmp_path / "args.py"
    planted.write_text(modules["tinyvllm.engine.args"].read_text(encoding="utf-8")
                       + "\n\ndef _planted():\n    from debugger.trace import run\n", encoding="utf-8")
    graph = import_graph({**modules, "tinyvllm.engine.args": planted})
    assert imports_of(graph, "tinyvllm", "debugger") == [("tinyvllm.engine.args", "debugger.trace")]
    assert cycles(graph) == [["debugger.trace", "tinyvllm.engine.args"]]
