"""The quick loop (`pytest -m "not slow"`, CONTRIBUTING.md) still covers every kernel family and every package.

Read from the source: a test file is in the quick loop when it has a test not marked slow (neither by the
module's `pytestmark` nor its class nor its own decorator); what it covers is every project module its import
statements load, those inside functions and those of the code it runs in a subprocess (a string that parses as
Python) too, a name imported from a package counting as the module that package re-exports it from. Marking a
family's last quick test file slow fails here, naming the family.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.test_layering import imported_names, module_files

TESTS = Path(__file__).resolve().parent
THIS = Path(__file__).name

# Modules no test imports by name, and the quick test file that covers them.
COVERED_INDIRECTLY = {
    # run by kernels_numba.common before numba.cuda is imported: test_no_gpu starts fresh processes for it
    "kernels_numba.gpu_probe": "test_no_gpu.py",
}


def is_slow_mark(node: ast.expr) -> bool:
    """`pytest.mark.slow` (or a list of marks holding it)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(is_slow_mark(n) for n in node.elts)
    return (isinstance(node, ast.Attribute) and node.attr == "slow" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark")


def marked_slow(body: list[ast.stmt]) -> bool:
    """Whether a module or class body sets `pytestmark` to include pytest.mark.slow."""
    return any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
               and is_slow_mark(s.value) for s in body)


def quick_tests(tree: ast.Module) -> list[str]:
    """The names of the module's tests that `-m "not slow"` selects."""
    if marked_slow(tree.body):
        return []

    def tests_in(body, prefix=""):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if not any(is_slow_mark(d) for d in node.decorator_list):
                    yield prefix + node.name
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                if not marked_slow(node.body) and not any(is_slow_mark(d) for d in node.decorator_list):
                    yield from tests_in(node.body, f"{node.name}.")
    return list(tests_in(tree.body))


def reexports(modules: dict[str, Path]) -> dict[str, str]:
    """package.name -> the module of that package the package's __init__ imports `name` from."""
    found = {}
    for package, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom):
                source = f"{package}.{node.module}" if node.level == 1 else node.module
                if source in modules:
                    found.update({f"{package}.{alias.asname or alias.name}": source for alias in node.names})
    return found


def covered_modules(tree: ast.Module, modules: dict[str, Path], reexported: dict[str, str]) -> set[str]:
    """The project modules that the import statements of `tree` (and of the Python code in its strings) name."""
    trees = [tree] + [code for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and "import " in node.value for code in [parse_or_none(node.value)] if code is not None]
    found = set()
    for t in trees:
        for name in imported_names(t, "tests.x", False):
            name = reexported.get(name, name)
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def parse_or_none(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


@functools.cache
def project_modules() -> dict[str, Path]:
    return module_files()


def quick_coverage(test_files: dict[str, str]) -> dict[str, list[str]]:
    """Project module -> the quick test files (of `test_files`: file name -> source) that import it."""
    modules = project_modules()
    reexported = reexports(modules)
    coverage: dict[str, list[str]] = {}
    for name, source in sorted(test_files.items()):
        tree = ast.parse(source)
        if quick_tests(tree):
            for module in covered_modules(tree, modules, reexported):
                coverage.setdefault(module, []).append(name)
    return coverage


def families_and_packages() -> list[str]:
    """Every kernels_numba module (a package's __init__ aside: each submodule loads it) and every package of
    tinyvllm and the debugger."""
    modules = project_modules()
    kernels = [m for m, p in modules.items() if m.startswith("kernels_numba.") and p.name != "__init__.py"]
    packages = [m for m, p in modules.items() if m.partition(".")[0] in ("tinyvllm", "debugger")
                and p.name == "__init__.py"]
    return sorted(kernels + packages)


def uncovered(test_files: dict[str, str]) -> list[str]:
    """The kernel modules and packages no quick test file imports (a package: one of its own modules)."""
    modules = project_modules()
    coverage = quick_coverage(test_files)
    missing = []
    for target in families_and_packages():
        if modules[target].name == "__init__.py":  # a package: itself or a module directly in it
            hits = [m for m in coverage if m == target or m.rpartition(".")[0] == target]
        else:
            hits = [target] if target in coverage else []
        indirect = COVERED_INDIRECTLY.get(target)
        if not hits and not (indirect and indirect in {f for fs in coverage.values() for f in fs}):
            missing.append(target)
    return missing


def repo_test_files() -> dict[str, str]:
    """The test files (this one aside: its examples are not tests) by name."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(TESTS.glob("test_*.py")) if p.name != THIS}


def test_every_kernel_family_and_package_has_a_quick_test():
    assert uncovered(repo_test_files()) == [], "no test file outside `-m slow` imports these: keep one quick"


def test_a_family_whose_quick_test_files_are_marked_slow_is_reported():
    files = repo_test_files()
    for name in quick_coverage(files)["kernels_numba.rope"]:
        files[name] = "import pytest\npytestmark = pytest.mark.slow\n" + files[name]
    assert "kernels_numba.rope" in uncovered(files)


def test_the_coverage_reads_marks_and_imports_as_pytest_and_python_would():
    files = {
        "test_module_mark.py": "import pytest\npytestmark = pytest.mark.slow\nimport kernels_numba.rope\n"
                               "def test_a(): pass\n",
        "test_mark_list.py": "import pytest\npytestmark = [pytest.mark.filterwarnings('error'), pytest.mark.slow]\n"
                             "import kernels_numba.mma\ndef test_a(): pass\n",
        "test_class_mark.py": "import pytest\n@pytest.mark.slow\nclass TestA:\n    def test_a(self):\n"
                              "        from kernels_numba.rmsnorm import rmsnorm_ref\n",
        "test_every_test_marked.py": "import pytest\nfrom kernels_numba.matmul import matmul\n"
                                     "@pytest.mark.slow\ndef test_a(): pass\n",
        "test_no_test.py": "from kernels_numba.logprobs import logprobs_ref\n",
        "test_quick.py": "import pytest\nfrom kernels_numba.attention import paged_attention_per_query\n"
                         "CODE = 'import kernels_numba.sampling as s; print(s)'\n"
                         "@pytest.mark.slow\ndef test_a(): pass\n"
                         "def test_b():\n    from tinyvllm.engine.scheduler import Scheduler\n",
    }
    # the re-exported name counts as attention/per_query.py; the subprocess code and the import in a test count
    assert quick_coverage(files) == {m: ["test_quick.py"] for m in (
        "kernels_numba.attention", "kernels_numba.attention.per_query", "kernels_numba.sampling",
        "tinyvllm.engine.scheduler")}
