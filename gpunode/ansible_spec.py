"""The Ansible module gpunode.gpu.node's argument_spec, made from the option table (gpunode/options.py).

The action plugin (on the controller, where gpunode is installed) validates a task's arguments with node_spec().
The module file itself must load without gpunode (ansible-doc, ansible-test), so the same spec is also written
into the collection's plugins/module_utils/specs.py between two marker lines: `python -m gpunode.ansible_spec`
rewrites it after the table changes, and a test fails while it is out of date (tests/test_ansible_spec.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpunode.options import ANSIBLE, choices_of, options_for

# the module's own option: what to do (install or uninstall), not one of gpunode's
STATE = {"type": "str", "choices": ["present", "absent"], "default": "present"}
SPECS_FILE = Path(__file__).resolve().parent.parent / "ansible_collections/gpunode/gpu/plugins/module_utils/specs.py"
BEGIN = "# BEGIN NODE_SPEC: written by `python -m gpunode.ansible_spec` from gpunode/options.py; do not edit"
END = "# END NODE_SPEC"


def gpunode_options() -> list[str]:
    """The module options that are gpunode's (the library's names, gpunode/api.py)."""
    return [o.name for o in options_for(ANSIBLE)]


def node_spec() -> dict[str, dict[str, Any]]:
    spec: dict[str, dict[str, Any]] = {"state": dict(STATE)}
    for row in options_for(ANSIBLE):
        entry: dict[str, Any] = {"type": row.type}
        if row.elements:
            entry["elements"] = row.elements
        choices = choices_of(row)
        if choices:
            entry["choices"] = list(choices)
        if row.default is not None:
            entry["default"] = row.default
        if row.no_log is not None:
            entry["no_log"] = row.no_log
        spec[row.name] = entry
    return spec


def rendered() -> str:
    """NODE_SPEC as Python source, between the markers."""
    lines = [BEGIN, "NODE_SPEC = dict("]
    for name, entry in node_spec().items():
        line = f"    {name}=dict(" + ", ".join(f"{k}={v!r}" for k, v in entry.items()) + "),"
        if len(line) > 120:  # ansible-test's pep8 takes 160: one argument a line
            line = f"    {name}=dict(\n" + "".join(f"        {k}={v!r},\n" for k, v in entry.items()) + "    ),"
        lines.append(line)
    return "\n".join([*lines, ")", END])


def current(text: str) -> str:
    """The marked part of specs.py as it is."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main() -> int:
    text = SPECS_FILE.read_text()
    updated = text.replace(current(text), rendered())
    if updated != text:
        SPECS_FILE.write_text(updated)
        print(f"rewrote NODE_SPEC in {SPECS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
