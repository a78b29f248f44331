"""Structure rules of the package, checked on the source: no import cycles, and step modules are pure (facts
-> plan): no `apply` methods, no I/O imports. Node-changing code lives in gpunode/actions/."""

from __future__ import annotations

import ast
from pathlib import Path

import gpunode

ROOT = Path(gpunode.__file__).parent
IO_MODULES = ("gpunode.connection", "requests", "paramiko", "subprocess", "socket", "time",
              "urllib.request", "http")
# Import edges known to close a cycle, each with the change that removes it.
KNOWN_CYCLE_EDGES = {
    # installer.ProgressBar imports gpunode.ui inside a function (ui -> runner -> steps -> driver -> installer);
    # the installer split (downloads report progress through a callback) removes it: delete this entry then.
    ("gpunode.installer", "gpunode.ui"),
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `name` imports, at any depth of its code, resolved to modules of the package or to
    external top-level names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports(name, path, known) if m in known and m != name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_in_gpunode_imports_in_a_cycle():
    edges = graph()
    assert "gpunode.steps.driver" in edges and "gpunode.actions.driver" in edges["gpunode.steps.driver"]
    # a package's __init__ importing its own submodules is how a package is built, not a cycle between modules
    edges = {m: {n for n in deps if not (m.startswith(n + ".") and modules()[n].name == "__init__.py")
                 and (m, n) not in KNOWN_CYCLE_EDGES}
             for m, deps in edges.items()}
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def step_modules() -> dict[str, Path]:
    return {n: p for n, p in modules().items() if n.startswith("gpunode.steps.")}


def test_step_modules_define_no_apply_method():
    assert "gpunode.steps.driver" in step_modules()
    offenders = [f"{name}:{node.lineno}" for name, path in step_modules().items()
                 for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                 for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                 and item.name == "apply"]
    assert offenders == []


def test_step_modules_do_no_io():
    """Steps construct actions (gpunode/actions/) but themselves import nothing that reaches a node or the
    network."""
    known = set(modules())
    offenders = {name: sorted(m for m in imports(name, path, known)
                              if any(m == io or m.startswith(io + ".") for io in IO_MODULES))
                 for name, path in step_modules().items()}
    assert {n: found for n, found in offenders.items() if found} == {}


def test_the_io_rule_would_catch_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom gpunode.connection.base import Connection\n"
                   "class X:\n    def apply(self, conn):\n        return None\n")
    found = imports("gpunode.steps.bad", bad, set(modules()))
    assert "time" in found and "gpunode.connection.base" in found
