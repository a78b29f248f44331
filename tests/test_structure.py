"""Step modules are pure (facts -> plan): no `apply` methods, no I/O imports, checked on the source. Node-changing
code lives in gpunode/actions/. (Import cycles and which modules may use rich, subprocess or paramiko are checked
in tests/test_import_graph.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

import gpunode

ROOT = Path(gpunode.__file__).parent
IO_MODULES = ("gpunode.connection", "requests", "paramiko", "subprocess", "socket", "time",
              "urllib.request", "http")
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
