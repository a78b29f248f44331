"""The collection as Ansible's own tools see it: ansible-galaxy builds it (and the built artifact installs and
documents itself), ansible-doc shows both modules, and ansible-test's sanity tests pass (all of them, on this
Python, without containers)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from gpunode.api import PIPELINE_OPTIONS
from tests.ansible.conftest import COLLECTION, ROOT, ansible_tool

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# ansible-test bootstraps pip in each sanity venv with a get-pip.py it downloads from ci-files.testing.ansible.com;
# this stand-in does the same with ensurepip and the configured package index (where that host is unreachable)
GET_PIP = '''"""Stand-in for get-pip.py: ensurepip's pip installs the requested pip and packages from the configured index."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])  # in a child: it sets PIP_CONFIG_FILE
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--upgrade", *args]))
'''


def tool_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(home),
            "LANG": "C.UTF-8", "ANSIBLE_CONFIG": str(tmp_path / "none.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
            "ANSIBLE_NOCOLOR": "1", "PYTHONPATH": str(ROOT), **extra}


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_galaxy_builds_an_artifact_that_installs_and_documents_itself(tmp_path):
    env = tool_env(tmp_path)
    built = run([ansible_tool("ansible-galaxy"), "collection", "build", str(COLLECTION), "--output-path",
                 str(tmp_path / "dist")], env)
    assert built.returncode == 0, built.stdout + built.stderr
    artifact = tmp_path / "dist" / "gpunode-gpu-0.1.0.tar.gz"
    names = set(tarfile.open(artifact).getnames())
    assert {"plugins/action/node.py", "plugins/action/doctor.py", "plugins/modules/node.py",
            "plugins/modules/doctor.py", "plugins/module_utils/specs.py", "plugins/plugin_utils/gpunode_bridge.py",
            "playbooks/converge.yml", "playbooks/tasks/converge_pass.yml", "meta/runtime.yml", "MANIFEST.json",
            "README.md"} <= names
    assert not any(n.startswith("tests/output") or n.endswith(".pyc") for n in names)

    installed = run([ansible_tool("ansible-galaxy"), "collection", "install", str(artifact), "-p",
                     str(tmp_path / "collections")], env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = tool_env(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "collections"))
    doc = run([ansible_tool("ansible-doc"), "--json", "gpunode.gpu.node", "gpunode.gpu.doctor"], env)
    assert doc.returncode == 0, doc.stderr
    data = json.loads(doc.stdout)
    node = data["gpunode.gpu.node"]["doc"]
    assert {"driver", "driver_run", "sha256", "only", "skip", "engines", "k8s", "toolkit_version"} <= set(node["options"])
    assert node["attributes"]["check_mode"]["support"] == "full"
    # every library option is documented (and no other), plus the module's own state; unset holds are "unset"
    assert set(node["options"]) == {*PIPELINE_OPTIONS, "state"}
    for name in ("hold_kernel", "hold_driver"):
        assert node["options"][name]["type"] == "bool" and "default" not in node["options"][name], node["options"][name]
    assert node["options"]["state"]["choices"] == ["present", "absent"] and node["options"]["state"]["default"] == "present"
    assert node["options"]["stop_gpu_services"]["default"] is False and "bake_kernel" in node["options"]
    assert "nothing_to_undo" in data["gpunode.gpu.node"]["return"]
    assert "reboot_required" in data["gpunode.gpu.node"]["return"]
    assert "fail_when_not_ready" in data["gpunode.gpu.doctor"]["doc"]["options"]
    assert "installed_path" not in data  # sanity: nothing else was listed

    # the example playbook is addressable by name from the installed collection
    check = run([ansible_tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", "gpunode.gpu.converge"], env)
    assert check.returncode == 0, check.stdout + check.stderr


def test_ansible_doc_shows_the_module_from_the_worktree(tmp_path):
    env = tool_env(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(ROOT))
    doc = run([ansible_tool("ansible-doc"), "gpunode.gpu.node"], env)
    assert doc.returncode == 0, doc.stderr
    assert "> MODULE gpunode.gpu.node" in doc.stdout and "Runs gpunode's pipeline" in doc.stdout
    assert "reboot_required" in doc.stdout and "check_mode" in doc.stdout


def _pip_config(env: dict[str, str]) -> str:
    """This machine's pip configuration (index, certificates) as one file for the sanity venvs' pip, which sees
    only HOME (ansible-test passes no other variable)."""
    listed = run([sys.executable, "-m", "pip", "config", "list"], {**os.environ}).stdout
    values = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if "." in key:
            values[key.split(".", 1)[1]] = value.strip().strip("'")
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


def test_ansible_test_sanity_passes(tmp_path, request):
    """Every sanity test ansible-test has (24 in 2.19: validate-modules, pylint, pep8, import, compile, yamllint,
    ansible-doc, action-plugin-docs ...) on this Python, `--local` (no containers). The venvs it creates are kept
    in pytest's cache between runs."""
    ansible_tool("ansible-test")
    home = Path(request.config.cache.mkdir("ansible-test-home"))
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = tool_env(tmp_path)
    env["HOME"] = str(home)
    (home / ".config" / "pip").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "pip" / "pip.conf").write_text(_pip_config(env))
    for version in _pip_versions():
        (cache / f"get_pip_{version.replace('.', '_')}.py").write_text(GET_PIP)
    result = run([ansible_tool("ansible-test"), "sanity", "--python", PY, "--local", "--color", "no"], env,
                 cwd=COLLECTION, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    ran = [line.split('"')[1] for line in output.splitlines() if line.startswith("Running sanity test")]
    assert {"validate-modules", "pylint", "pep8", "import", "compile", "yamllint", "ansible-doc",
            "action-plugin-docs", "runtime-metadata"} <= set(ran), ran


def _pip_versions() -> set[str]:
    """The pip versions ansible-test bootstraps into its venvs (written in its python_requirements module)."""
    import ansible_test

    source = (Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
    return set(re.findall(r"pip='([0-9.]+)'", source)) or {"24.2"}


# -- what the docs tell a user with Python-less hosts --------------------------------------------------------

DOCS = (ROOT / "docs" / "ansible.md").read_text()
RAW_ROUTE_OK = {"ansible.builtin.raw", "ansible.builtin.pause", "gpunode.gpu.node", "gpunode.gpu.doctor"}


def _tasks(tasks: list[dict]) -> list[dict]:
    found = []
    for task in tasks:
        found.append(task)
        found += _tasks(task.get("block", []) + task.get("rescue", []) + task.get("always", []))
    return found


def test_the_docs_say_first_that_fact_gathering_must_be_off():
    import yaml
    first_command = DOCS.index("ansible-playbook ")
    assert DOCS.index("gather_facts: false") < first_command and DOCS.index("First: turn fact gathering off") < first_command
    readme = (COLLECTION / "README.md").read_text()
    assert "gather_facts: false" in readme
    converge = yaml.safe_load((COLLECTION / "playbooks" / "converge.yml").read_text())
    assert all(play["gather_facts"] is False for play in converge)  # the example does what the docs say


def test_the_docs_name_the_group_the_example_playbook_targets():
    import yaml
    (play,) = yaml.safe_load((COLLECTION / "playbooks" / "converge.yml").read_text())
    group = re.fullmatch(r"\{\{ gpunode_hosts \| default\('(\w+)'\) \}\}", play["hosts"])
    assert group is not None
    for text in (DOCS[:DOCS.index("ansible-playbook ")], (COLLECTION / "README.md").read_text(),
                 (ROOT / "README.md").read_text()):
        assert f"inventory group `{group[1]}`" in text and "gpunode_hosts=GROUP" in text


def test_the_docs_raw_reboot_route_needs_no_python_on_the_host_and_parses(tmp_path):
    import yaml
    assert DOCS.index("needs Python on the host") < DOCS.index("ansible-playbook ")  # said before the quick start
    section = DOCS[DOCS.index("### Rebooting a host without Python"):]
    snippet = section[section.index("```yaml\n") + 8:section.index("\n```", section.index("```yaml\n"))]
    plays = yaml.safe_load(snippet)
    assert all(play["gather_facts"] is False for play in plays)
    used = []
    for task in _tasks([t for play in plays for t in play["tasks"]]):
        module = next((k for k in task if "." in k), None)
        if module is None:
            continue
        used.append(module)
        assert module in RAW_ROUTE_OK or (module == "ansible.builtin.wait_for"
                                          and task.get("delegate_to") == "localhost"), module
    assert "ansible.builtin.raw" in used and "ansible.builtin.reboot" not in used
    path = tmp_path / "raw_route.yml"
    path.write_text(snippet)
    env = tool_env(tmp_path, ANSIBLE_COLLECTIONS_PATH=str(ROOT))
    check = run([ansible_tool("ansible-playbook"), "--syntax-check", "-i", "gpu-01,", str(path)], env)
    assert check.returncode == 0, check.stdout + check.stderr
