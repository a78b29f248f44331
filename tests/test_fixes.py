"""Fixes as data (gpunode/fixes.py): their plain text, how the CLI renders them for a node, and the rule that only
the renderers spell `gpunode <command>`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpunode import fixes
from gpunode.cli._target import runnable
from gpunode.options import Options

ROOT = Path(__file__).resolve().parent.parent
_COMMAND = re.compile(r"(?<![\w./-])gpunode (plan|install|doctor|verify|status|facts|uninstall|explain|compat)(?![\w-])")
# the renderers: the CLI, this module, the Ansible action plugins and their bridge
RENDERERS = ("gpunode/cli/", "gpunode/fixes.py", "ansible_collections/gpunode/gpu/plugins/action/",
             "ansible_collections/gpunode/gpu/plugins/plugin_utils/")
# documentation strings a tool reads as documentation, not as a command to run
DOCUMENTATION = ("DOCUMENTATION", "RETURN", "EXAMPLES")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def command_literals(root: Path = ROOT) -> list[str]:
    """`path:line text` of every string literal (not a docstring, not a module's Ansible documentation, not a
    Prometheus `# HELP` line) that spells a gpunode command, outside the renderers."""
    found = []
    paths = [*root.glob("gpunode/**/*.py"), *root.glob("ansible_collections/**/*.py")]
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(RENDERERS):
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOCUMENTATION
                                                    for t in node.targets):
                skip.add(id(node.value))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and not node.value.startswith("# HELP ") and _COMMAND.search(node.value)):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
            if isinstance(node, (ast.List, ast.Tuple)):  # ["gpunode", "uninstall", ...] for shlex.join
                words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                if any(a == "gpunode" and isinstance(b, str) and _COMMAND.fullmatch(f"gpunode {b}")
                       for a, b in zip(words, words[1:], strict=False)):
                    found.append(f"{rel}:{node.lineno} {words!r}")
    return found


def test_no_gpunode_command_is_spelled_outside_the_renderers():
    assert command_literals() == []


def test_the_scan_finds_a_spelled_command(tmp_path):
    (tmp_path / "gpunode" / "doctor").mkdir(parents=True)
    (tmp_path / "gpunode" / "doctor" / "x.py").write_text('"""gpunode install in a docstring is prose."""\n'
                                                           'FIX = "gpunode install --only toolkit"\n'
                                                           'AGAIN = shlex.join(["gpunode", "uninstall", "--only", x])\n')
    assert command_literals(tmp_path) == ["gpunode/doctor/x.py:2 'gpunode install --only toolkit'",
                                          "gpunode/doctor/x.py:3 ['gpunode', 'uninstall', '--only', None]"]


def test_a_fix_is_its_plain_text_and_keeps_its_parts_through_plus():
    fix = fixes.on_node("sudo modprobe nvidia") + "  # if it fails: " + fixes.on_node("sudo dmesg",
                                                                                      fixes.gpunode("explain"))
    assert fix == "sudo modprobe nvidia  # if it fails: sudo dmesg | gpunode explain"
    assert isinstance(fix, fixes.Fix) and len(fix.parts) == 3
    again = "run " + fixes.gpunode("install", only=["toolkit", "runtime"], hold_kernel=False, k8s=True)
    assert again == "run gpunode install --only toolkit --only runtime --no-hold-kernel --k8s"
    assert isinstance(again, fixes.Fix) and again.commands()[0].command == "install"


def test_the_cli_renders_each_part_for_the_node():
    fix = fixes.on_node("sudo modprobe nvidia") + "  # if it fails: " + fixes.on_node("sudo dmesg",
                                                                                      fixes.gpunode("explain"))
    ssh = ["ssh", "-p", "2222", "ubuntu@gpu-01"]
    assert runnable(fix, ["--host", "ubuntu@gpu-01:2222"], ssh) == (
        'ssh -t -p 2222 ubuntu@gpu-01 "sudo modprobe nvidia"  # if it fails: '
        'ssh -p 2222 ubuntu@gpu-01 "sudo dmesg" | gpunode explain')  # explain runs here: no --host
    install = "then: " + fixes.gpunode("install", driver="570.172.08")
    assert runnable(install, ["--host", "gpu 01"]) == "then: gpunode install --host 'gpu 01' --driver 570.172.08"
    assert runnable(install, []) == "then: gpunode install --driver 570.172.08"


def test_values_are_quoted():
    assert fixes.gpunode("compat", gpu="NVIDIA H100 80GB HBM3") == "gpunode compat --gpu 'NVIDIA H100 80GB HBM3'"


def test_the_same_run_again_keeps_every_option_the_user_gave():
    given = Options(driver="570.172.08", stop_gpu_services=True, hold_kernel=True, engines=("docker",))
    again = fixes.same_run(given)
    assert again == ("gpunode install --driver 570.172.08 --engine docker --hold-kernel --stop-gpu-services")
    assert fixes.same_run(Options(driver="570.172.08"), stop_gpu_services=True) == \
        "gpunode install --driver 570.172.08 --stop-gpu-services"


def test_a_value_known_only_at_run_time_replaces_the_option_in_the_same_run_again():
    again = fixes.same_run(Options(driver="580.95.05", driver_source="packages", toolkit_version="1.19.0-1"))
    fixed = fixes.with_options(again + "  # a version they offer", toolkit_version="1.20.0-1")
    assert fixed == ("gpunode install --driver 580.95.05 --driver-source packages --toolkit-version 1.20.0-1"
                     "  # a version they offer")
    assert runnable(fixed, ["--host", "gpu 01"]).startswith("gpunode install --host 'gpu 01' --driver 580.95.05")
    # a value from the node is quoted like any other; prose around the command is kept as it is
    assert fixes.with_options(fixes.Fix("then: ", again), toolkit_version="1.2; rm").endswith(
        "--toolkit-version '1.2; rm'")


def test_a_data_tables_gpunode_command_is_read_as_data_and_other_text_is_left_alone():
    parsed = fixes.from_text("gpunode install --only toolkit --only runtime --k8s  # then verify")
    assert isinstance(parsed, fixes.Fix) and parsed == "gpunode install --only toolkit --only runtime --k8s  # then verify"
    assert parsed.commands()[0].options == (("only", "toolkit"), ("only", "runtime"), ("k8s", True))
    piped = fixes.from_text("sudo dmesg | gpunode explain")
    assert isinstance(piped, fixes.Fix) and isinstance(piped.parts[0], fixes.OnNode)
    for text in ("sudo apt-get install -y x", "gpunode  install", "gpunode install --driver 'a b'c"):
        assert not isinstance(fixes.from_text(text), fixes.Fix)
    # a <placeholder> the person fills in is one value, printed as it is
    held = fixes.from_text("gpunode install --driver <a newer branch>  # if it recurs")
    assert isinstance(held, fixes.Fix) and held == "gpunode install --driver <a newer branch>  # if it recurs"
    assert runnable(held, ["--host", "gpu-01"]) == "gpunode install --host gpu-01 --driver <a newer branch>  # if it recurs"


def test_a_data_tables_runs_column_says_where_each_command_runs():
    node = fixes.from_row("sudo dmesg -T | grep NVRM  # the reason", "node")
    assert isinstance(node, fixes.Fix) and isinstance(node.parts[0], fixes.OnNode)
    assert node.parts[0].command == "sudo dmesg -T | grep NVRM" and node == "sudo dmesg -T | grep NVRM  # the reason"
    here = fixes.from_row("kubectl get runtimeclass", "controller")
    assert isinstance(here, fixes.Fix) and isinstance(here.parts[0], fixes.Here)
    assert fixes.from_row("gpunode doctor", "controller").commands()[0].command == "doctor"
    assert not isinstance(fixes.from_row("read the log", "manual"), fixes.Fix)
    assert not isinstance(fixes.from_row("sudo reboot", None), fixes.Fix)  # left empty: not guessed from the words
    ssh = ["ssh", "gpu-01"]
    assert runnable(node, [], ssh) == "ssh gpu-01 'sudo dmesg -T | grep NVRM'  # the reason".replace(
        "ssh gpu-01 'sudo dmesg -T | grep NVRM'", 'ssh -t gpu-01 "sudo dmesg -T | grep NVRM"')
    assert runnable(here, ["--host", "gpu-01"], ssh) == "kubectl get runtimeclass"


def test_a_detector_row_without_the_runs_column_still_loads(tmp_path):
    from gpunode.datatables import DataError, data_dir
    from gpunode.explain.tables import DETECTOR_TABLES, load

    header = "id,variant,strength,key,pattern,title,cause,fix,also,superseded_by,source,runs\n"
    row = "gpu.x,,50,,some text,A title,A cause,sudo reboot,gpunode doctor,,a source"
    for name in DETECTOR_TABLES:
        (tmp_path / name).write_text(header + row + "\n", encoding="utf-8")
    (tmp_path / "xid.csv").write_text((data_dir() / "xid.csv").read_text(encoding="utf-8"), encoding="utf-8")
    detectors, _ = load(tmp_path)
    assert detectors[0].fix == "sudo reboot" and not isinstance(detectors[0].fix, fixes.Fix)
    assert isinstance(detectors[0].also[0], fixes.Fix)
    for name in DETECTOR_TABLES:
        (tmp_path / name).write_text(header + row + ",node\n", encoding="utf-8")
    with pytest.raises(DataError, match="runs has 1 words for 2 commands"):
        load(tmp_path)


def test_explains_table_fixes_reach_the_renderers_as_data():
    from gpunode.explain import explain

    finding = explain('docker: Error response from daemon: could not select device driver "" with capabilities: '
                      "[[gpu]].")[0]
    assert isinstance(finding.fix, fixes.Fix) and finding.fix == "gpunode install --only toolkit --only runtime"
    assert runnable(finding.fix, ["--host", "gpu-01"]) == "gpunode install --host gpu-01 --only toolkit --only runtime"


def test_a_node_command_in_the_words_of_a_fix_runs_on_the_node_as_a_part():
    fix = "run `" + fixes.on_node("nvidia-smi -L") + "` first; then " + fixes.gpunode("install")
    assert runnable(fix, ["--host", "gpu-01"], ["ssh", "gpu-01"]) == \
        'run `ssh -t gpu-01 "nvidia-smi -L"` first; then gpunode install --host gpu-01'


def test_node_commands_go_through_ssh_and_kubectl_runs_where_the_user_is_from_their_parts():
    """The renderer wraps a node command because the fix says it runs on the node; kubectl talks to the cluster
    from where the user is, so it is printed as it is; the same text without its parts is words."""
    ssh = ["ssh", "-p", "2222", "ubuntu@gpu-01"]
    kubectl = fixes.here("kubectl drain gpu-01 --ignore-daemonsets")
    reboot = fixes.on_node("sudo reboot") + "  # loads the module that matches"
    assert runnable(kubectl, ["--host", "gpu-01"], ssh) == "kubectl drain gpu-01 --ignore-daemonsets"
    assert runnable(reboot, ["--host", "gpu-01"], ssh) == \
        'ssh -t -p 2222 ubuntu@gpu-01 "sudo reboot"  # loads the module that matches'
    assert runnable(reboot, ["--local"]) == "sudo reboot  # loads the module that matches"
    assert runnable(str(reboot), ["--host", "gpu-01"], ssh) == "sudo reboot  # loads the module that matches"


def test_a_drain_names_the_node_where_the_user_is_or_runs_on_the_node_that_knows_its_name():
    from gpunode.facts.holders import Holders

    ssh = ["ssh", "gpu-01"]
    known = Holders(node_name="gpu-01").drain()
    assert runnable(known, [], ssh) == "kubectl drain gpu-01 --ignore-daemonsets --delete-emptydir-data"
    unknown = Holders(node_name="").drain()
    assert runnable(unknown, [], ssh) == \
        "ssh -t gpu-01 'kubectl drain \"$(hostname)\" --ignore-daemonsets --delete-emptydir-data'"


# a fix for the node spelled as text: `sudo ...` as a whole string, or in backticks inside words
_SUDO = re.compile(r"(?:^|: |`)sudo [a-z]")
NOT_FIXES = ("gpunode/connection/",)  # messages about sudo itself (sudo: a password is required ...)


def sudo_literals(root: Path = ROOT) -> list[str]:
    """`path:line text` of every string literal outside the renderers (not a docstring) that spells a `sudo ...`
    command without being inside a fixes.on_node(...) or fixes.here(...) call: a node command as bare text, which
    no renderer can run through ssh."""
    found = []
    for path in sorted(root.glob("gpunode/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(RENDERERS + NOT_FIXES):
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and _SUDO.search(node.value.partition("  #")[0])):  # a `  # note` is words
                continue
            up: ast.AST = node
            while up in parents:
                up = parents[up]
                if isinstance(up, ast.Call) and getattr(up.func, "attr", getattr(up.func, "id", None)) in (
                        "on_node", "here"):
                    break
            else:
                found.append((rel, node.lineno, node.value))
    return [f"{rel}:{line} {value!r}" for rel, line, value in sorted(found)]


def test_no_node_command_is_bare_text_outside_the_renderers():
    assert sudo_literals() == []


def test_the_sudo_scan_finds_a_bare_node_command(tmp_path):
    (tmp_path / "gpunode" / "doctor").mkdir(parents=True)
    (tmp_path / "gpunode" / "doctor" / "x.py").write_text(
        '"""sudo reboot in a docstring is prose."""\n'
        'FIX = "sudo reboot"\n'
        'NOTE = f"enroll it (`sudo mokutil --import {CERT}`)"\n'
        'OK = fixes.on_node(f"sudo dkms autoinstall -k {kernel}") + "  # then: sudo reboot"\n'
        'WORDS = "run \'sudo true\' on the node as the login user"\n'
        'PROSE = "move it aside: sudo mv /a /b"\n')
    assert sudo_literals(tmp_path) == ["gpunode/doctor/x.py:2 'sudo reboot'",
                                       "gpunode/doctor/x.py:3 'enroll it (`sudo mokutil --import '",
                                       "gpunode/doctor/x.py:6 'move it aside: sudo mv /a /b'"]


def test_every_sudo_command_in_the_explain_tables_says_where_it_runs():
    """A table row whose fix or further command is a `sudo ...` line names where it runs (`runs` column: node),
    so the CLI can run it through ssh; without the column it would be printed as words."""
    from gpunode.explain.tables import load

    detectors, _ = load()
    unmarked = [f"data/{d.table} line {d.line} ({d.id}): {text}" for d in detectors for text in (d.fix, *d.also)
                if str(text).startswith("sudo ") and not isinstance(text, fixes.Fix)]
    assert unmarked == [], "add a runs column value (node) for: " + "; ".join(unmarked)
