"""The package's import structure, read from the source (nothing is imported):

- no import cycle among gpunode's modules, counting what runs at import time (module-level imports, including
  those in class bodies, `try` and ordinary `if` blocks; not imports inside functions or under
  `if TYPE_CHECKING:`), and counting that `import a.b.c` first runs the packages a and a.b;
- only the CLI (gpunode/cli/*, gpunode/ui.py) imports rich;
- only gpunode/connection/* imports subprocess or paramiko (the one way gpunode reaches a node);
- nothing in gpunode/ imports the tests' fake connection.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpunode"


@dataclass(frozen=True)
class Import:
    target: str  # absolute dotted name: a module, or a package and the name imported from it ("a.b" + "c")
    names: tuple[str, ...]  # for `from X import a, b`: ("a", "b"); () for `import X`
    line: int
    at_import_time: bool


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def imports(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import statement of one file, each marked with whether it runs when the module is imported."""
    module = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_bytes(), filename=str(path))
    found: list[Import] = []

    def visit(node: ast.AST, live: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, (), node.lineno, live) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module)
            found.append(Import(target, tuple(a.name for a in node.names), node.lineno, live))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in ast.iter_child_nodes(node):
                visit(child, False)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, live)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, live)

    visit(tree, True)
    return found


def package_modules(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(package.rglob("*.py"))}


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def graph(modules: dict[str, Path], root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module it imports at import time -> line}. `import a.b.c` runs a, a.b and a.b.c. The packages
    that contain the importing module are already running when it runs, so reaching a submodule through them adds
    no edge; but `from a import NAME` (not a submodule) needs a's __init__ to have got that far: that is an edge."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        own = set(_ancestors(name)) | ({name} if path.name == "__init__.py" else set())
        found: list[tuple[str, int]] = []
        for imp in imports(path, root):
            if not imp.at_import_time:
                continue
            submodules = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in modules]
            for target in [imp.target, *submodules]:
                found += [(c, imp.line) for c in [*_ancestors(target), target] if c not in own]
            if len(submodules) < len(imp.names):  # a name defined in the package's own __init__
                found.append((imp.target, imp.line))
        out: dict[str, int] = {}
        for candidate, line in found:
            if candidate in modules and candidate != name:
                out.setdefault(candidate, line)
        edges[name] = out
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One concrete cycle (a, b, ..., a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                strongconnect(w)
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
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return [_one_cycle(c, edges) for c in components]


def _one_cycle(component: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first back to it)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in previous and w != start:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # unreachable for a strongly connected component


def describe(cycle: list[str], edges: dict[str, dict[str, int]]) -> str:
    hops = [f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join([*hops, cycle[-1]])


def importers(forbidden: tuple[str, ...], allowed: tuple[str, ...]) -> Iterator[str]:
    """`path:line imports X` for every import (anywhere in the file) of a forbidden top-level package from a
    module whose name does not start with one of `allowed`."""
    for name, path in package_modules().items():
        if name.startswith(allowed):
            continue
        for imp in imports(path):
            top = imp.target.split(".")[0]
            if top in forbidden:
                yield f"{path.relative_to(ROOT)}:{imp.line} imports {imp.target}"


# -- the checks on gpunode ------------------------------------------------------------------------------------
def test_gpunode_has_no_import_cycle() -> None:
    edges = graph(package_modules())
    found = [describe(c, edges) for c in cycles(edges)]
    assert not found, "import cycles in gpunode/:\n" + "\n".join(found)


def test_only_the_cli_imports_rich() -> None:
    found = list(importers(("rich",), ("gpunode.cli", "gpunode.ui")))
    assert not found, "rich is for the CLI only (gpunode/cli/*, gpunode/ui.py):\n" + "\n".join(found)


def test_only_connections_start_processes_or_ssh() -> None:
    found = list(importers(("subprocess", "paramiko"), ("gpunode.connection.",)))
    assert not found, "only gpunode/connection/* may use subprocess or paramiko:\n" + "\n".join(found)


def test_the_package_does_not_use_the_test_fakes() -> None:
    found = list(importers(("tests",), ()))
    assert not found, "the test fakes are not shipped; gpunode/ must not import them:\n" + "\n".join(found)
    assert not (PACKAGE / "connection" / "fake.py").exists()


# -- the checker itself, on small packages written here -------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package_modules(root / "pkg", root)


def test_checker_finds_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    # the old shape: a -> ui -> steps (its __init__ imports steps.driver) -> a
    modules = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import ui\n",
        "pkg/ui.py": "from pkg.steps.base import Step\n",
        "pkg/steps/__init__.py": "from pkg.steps import driver\n",
        "pkg/steps/base.py": "class Step: ...\n",
        "pkg/steps/driver.py": "import pkg.a\nfrom pkg.steps.base import Step\n",
    })
    edges = graph(modules, tmp_path)
    found = cycles(edges)
    assert found == [["pkg.a", "pkg.ui", "pkg.steps", "pkg.steps.driver", "pkg.a"]]
    assert describe(found[0], edges) == ("pkg.a (line 1) -> pkg.ui (line 1) -> pkg.steps (line 1) -> "
                                         "pkg.steps.driver (line 1) -> pkg.a")


def test_checker_ignores_function_and_type_checking_imports(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nelse:\n    pass\n"
                     "def f():\n    from pkg import a\n    return a\n"),
        "pkg/c.py": "from . import d\n",  # relative imports are resolved
        "pkg/d.py": "class K:\n    from .c import x\n",  # a class body runs at import time
    })
    edges = graph(modules, tmp_path)
    assert edges["pkg.b"] == {}
    assert cycles(edges) == [["pkg.c", "pkg.d", "pkg.c"]]


def test_a_subpackage_importing_its_own_package_is_not_a_cycle(tmp_path: Path) -> None:
    modules = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/steps/__init__.py": "from pkg.steps import driver\n",
        "pkg/steps/base.py": "",
        "pkg/steps/driver.py": "from pkg.steps.base import x\nfrom pkg import steps\n",
    })
    assert cycles(graph(modules, tmp_path)) == []


def test_a_name_from_a_package_that_imports_the_module_is_a_cycle(tmp_path: Path) -> None:
    # pkg/__init__ runs `from pkg import a` before it defines X: a's `from pkg import X` fails at import time
    modules = _write(tmp_path, {
        "pkg/__init__.py": "from pkg import a\nX = 1\n",
        "pkg/a.py": "from pkg import X\n",
    })
    assert cycles(graph(modules, tmp_path)) == [["pkg", "pkg.a", "pkg"]]


@pytest.mark.parametrize("source, live", [
    ("import rich\n", True),
    ("def f():\n    import rich\n", False),
    ("if TYPE_CHECKING:\n    import rich\n", False),
    ("try:\n    import rich\nexcept ImportError:\n    pass\n", True),
])
def test_imports_marks_what_runs_at_import_time(tmp_path: Path, source: str, live: bool) -> None:
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(source)
    assert [(i.target, i.at_import_time) for i in imports(path, tmp_path)] == [("rich", live)]


# the install side: what only a run that changes a node needs. gpunode.options is not on it: it holds the option
# table every command's parameters come from (doctor's --host as install's --driver).
INSTALL_SIDE = ("gpunode.steps", "gpunode.actions", "gpunode.undo", "gpunode.runner", "gpunode.preflight",
                "gpunode.artifacts", "gpunode.runrecord", "gpunode.plan")


def closure(start: str, edges: dict[str, dict[str, int]]) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("command", ["gpunode.cli.doctor", "gpunode.cli.status", "gpunode.cli.explain"])
def test_read_only_commands_load_nothing_of_the_install_side(command):
    loaded = closure(command, graph(package_modules()))
    installer = sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in INSTALL_SIDE))
    assert installer == [], f"{command} loads {len(installer)} install-side modules: {installer}"


def test_the_closure_sees_the_install_side_where_it_is():
    # the CLI commands import the install side inside their functions (so that --help need not): the views and the
    # undo engine import it at their top. The step modules themselves load when gpunode.steps.PIPELINE is first
    # read (gpunode/steps/__init__.py), not at import time: a real run's modules are guarded by tests/cli/test_startup.
    edges = graph(package_modules())
    assert {"gpunode.runner", "gpunode.steps"} <= closure("gpunode.cli._pipeline_view", edges)
    assert {"gpunode.runner", "gpunode.undo.engine", "gpunode.steps"} <= closure("gpunode.undo.engine", edges)
