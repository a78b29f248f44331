"""The Ansible module's argument_spec and DOCUMENTATION agree with the option table (gpunode/options.py): names,
types, list elements, defaults and choices. The module file must load without gpunode, so its copy of the spec
(module_utils/specs.py) is written from the table; this test fails while that copy is out of date."""

from __future__ import annotations

import ast

import yaml

from gpunode import ansible_spec
from gpunode.options import ANSIBLE, choices_of, options_for

MODULE = ansible_spec.SPECS_FILE.parent.parent / "modules" / "node.py"


def _documentation() -> dict:
    tree = ast.parse(MODULE.read_text())
    text = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "DOCUMENTATION" for t in n.targets))
    return yaml.safe_load(text)["options"]


def test_the_module_utils_copy_is_the_tables_spec():
    text = ansible_spec.SPECS_FILE.read_text()
    assert ansible_spec.current(text) == ansible_spec.rendered(), "run: python -m gpunode.ansible_spec"
    namespace: dict = {}
    exec(compile(ansible_spec.current(text), str(ansible_spec.SPECS_FILE), "exec"), namespace)  # noqa: S102
    assert namespace["NODE_SPEC"] == ansible_spec.node_spec()


def test_documentation_agrees_with_the_table():
    documented = _documentation()
    rows = {o.name: o for o in options_for(ANSIBLE)}
    assert set(documented) == {*rows, "state"}
    for name, row in rows.items():
        doc = documented[name]
        assert doc.get("type", "str") == row.type, name
        assert doc.get("elements") == row.elements, name
        assert doc.get("choices") == (list(choices_of(row)) if choices_of(row) else None), name
        assert doc.get("default") == row.default, name  # no default documented <-> None in the table
        if row.default is not None:
            assert type(doc["default"]) is type(row.default), name
    state = documented["state"]
    assert (state["type"], state["choices"], state["default"]) == ("str", ["present", "absent"], "present")


def test_a_row_whose_documentation_disagrees_is_caught(monkeypatch):
    """The check above can fail: a default changed in the table and not in DOCUMENTATION."""
    import dataclasses

    from gpunode import options

    changed = tuple(dataclasses.replace(o, default=300.0) if o.name == "lock_timeout" else o
                    for o in options.OPTION_TABLE)
    monkeypatch.setattr(options, "option_table", lambda: changed)
    documented = _documentation()
    assert documented["lock_timeout"]["default"] != next(o for o in options_for(ANSIBLE)
                                                          if o.name == "lock_timeout").default
    assert ansible_spec.current(ansible_spec.SPECS_FILE.read_text()) != ansible_spec.rendered()
