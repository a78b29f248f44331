"""Every fix gpunode prints is runnable as printed: it names the node it was about, with the connection
options the user gave, each value quoted for a POSIX shell."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from gpunode import connection, fixes
from gpunode.cli import app
from gpunode.cli._target import Target, runnable
from gpunode.inventory import InventoryHost
from tests.cli.conftest import flat
from tests.doctor.fakes import fresh
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()


def _target(**kw) -> Target:
    base = dict(hosts=[], identity=[], known_hosts=[], accept_new_host_key=False, ssh_config=None, ask_pass=False,
                ask_become_pass=False, connect_timeout=15.0)
    return Target(**{**base, **kw})


def test_runnable_inserts_the_node_right_after_the_subcommand():
    assert runnable(fixes.gpunode("install", driver="580.178.04"), ["--host", "gpu-01"]) == \
        "gpunode install --host gpu-01 --driver 580.178.04"
    # every gpunode command of the fix, including one in a trailing comment; words untouched
    fix = fixes.gpunode("doctor") + "  # then " + fixes.gpunode("install", only="toolkit") + "; nvidia-smi"
    assert runnable(fix, ["--host", "n"]) == "gpunode doctor --host n  # then gpunode install --host n --only toolkit; nvidia-smi"
    # offline commands take no node
    assert runnable(fixes.gpunode("compat", gpu="H100"), ["--host", "n"]) == "gpunode compat --gpu H100"
    assert runnable(fixes.gpunode("install", driver="X"), []) == "gpunode install --driver X"


def test_runnable_leaves_a_command_already_made_for_the_node_alone():
    once = runnable(fixes.gpunode("install", driver="X"), ["--host", "n", "--identity", "/k"])
    assert runnable(once, ["--host", "n", "--identity", "/k"]) == once == "gpunode install --host n --identity /k --driver X"


def test_text_that_is_not_a_fix_is_words_and_left_as_it_is():
    """Nothing is guessed from the words: a command spelled in text stays as written (the source scans in
    tests/test_fixes.py keep such text out of gpunode)."""
    for text in ("gpunode install --driver X", "sudo modprobe nvidia", "see `nvidia-smi -L`"):
        assert runnable(text, ["--host", "n"], ["ssh", "n"]) == text


def test_node_args_quote_every_value_and_carry_the_connection_options():
    t = _target(hosts=["ops user@gpu-01:2222"], identity=["/keys/my key"], known_hosts=["/tmp/kh"],
                ssh_config="/cfg/ssh config", ask_become_pass=True, connect_timeout=30.0, accept_new_host_key=True)
    fix = t.fix(fixes.gpunode("install", only="toolkit"))
    assert fix is not None
    words = shlex.split(fix)  # a shell reads back exactly the values given
    assert words[:4] == ["gpunode", "install", "--host", "ops user@gpu-01:2222"]
    assert ["--identity", "/keys/my key"] == words[words.index("--identity"):words.index("--identity") + 2]
    assert ["--ssh-config", "/cfg/ssh config"] == words[words.index("--ssh-config"):words.index("--ssh-config") + 2]
    assert "--known-hosts" in words and "--ask-become-pass" in words and "--accept-new-host-key" in words
    assert words[words.index("--connect-timeout") + 1] == "30"
    assert words[-2:] == ["--only", "toolkit"]


def test_fleet_nodes_from_an_inventory_are_named_by_inventory_and_limit():
    t = _target(hosts=["extra-01"], inventory="inv/hosts.ini")
    in_inventory = InventoryHost("gpu-07", address="10.0.0.7", user="ubuntu")
    assert t.fix(fixes.gpunode("doctor"), in_inventory) == "gpunode doctor --inventory inv/hosts.ini --limit gpu-07"
    assert t.fix(fixes.gpunode("doctor"), InventoryHost("extra-01")) == "gpunode doctor --host extra-01"


def test_doctor_fix_names_the_host_and_connection_options(serve, tmp_path):
    serve(fresh())
    config = tmp_path / "ssh config"
    config.write_text("Host gpu-01\n  User ubuntu\n")
    result = runner.invoke(app, ["doctor", "--host", "ubuntu@gpu-01", "--ssh-config", str(config)])
    assert result.exit_code == 1
    expected = f"fix: gpunode install --host ubuntu@gpu-01 --ssh-config {shlex.quote(str(config))} --only nouveau"
    assert expected in flat(result.stdout)
    assert "fix: gpunode install --only" not in flat(result.stdout)  # no fix that would run on this machine


def test_doctor_json_fixes_name_the_host(serve):
    serve(fresh())
    data = json.loads(runner.invoke(app, ["doctor", "--host", "gpu-01", "--json"]).stdout)
    fixes = [c["fix"] for c in data["checks"] if c["fix"] and "gpunode install" in c["fix"]]
    assert fixes and all(f.startswith("gpunode install --host gpu-01") for f in fixes)


@pytest.fixture
def docker_without_toolkit(monkeypatch):
    from tests.fakes.connection import FakeSystem

    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl", "docker", "dockerd", "apt-get", "dpkg"})
    node.add_gpu(0x1EB8)
    FakeSystem(node).unit("docker").attach()
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    return node


def test_plan_blocked_fix_names_the_host(docker_without_toolkit):
    result = runner.invoke(app, ["plan", "--host", "root@gpu-01", "--only", "runtime"])
    assert result.exit_code == 1
    assert "fix: run the toolkit step first: gpunode install --host root@gpu-01 --only toolkit" in flat(result.stdout)
    data = json.loads(runner.invoke(app, ["plan", "--host", "root@gpu-01", "--only", "runtime", "--json"]).stdout)
    assert data["steps"][0]["fix"] == "run the toolkit step first: gpunode install --host root@gpu-01 --only toolkit"


def test_fleet_doctor_fixes_name_each_node_and_a_legend_explains_the_marks(monkeypatch, tmp_path):
    nodes: dict[str, FakeNode] = {}
    monkeypatch.setattr(connection, "open_connection",
                        lambda spec: FakeConnection(nodes.setdefault(spec.host, fresh()), name=spec.host))
    result = runner.invoke(app, ["doctor", "-H", "gpu-a", "-H", "gpu-b", "--log-dir", str(tmp_path)])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "fix: gpunode install --host gpu-a --only nouveau" in out
    assert "fix: gpunode install --host gpu-b --only nouveau" in out
    assert "✓ pass" in out and "✗ fail" in out and "· skip" in out and "! warn" in out
    assert "steps changed" not in out and "reboot pending" not in out  # doctor changes nothing


@pytest.mark.parametrize("value", ["a b", "x;rm -rf /", "$(id)", "it's"])
def test_node_values_survive_a_shell_round_trip(value):
    t = _target(hosts=[value], identity=[value])
    fix = t.fix(fixes.gpunode("verify"))
    assert fix is not None
    words = shlex.split(fix)
    assert words[words.index("--host") + 1] == value and words[words.index("--identity") + 1] == value


def test_fleet_plan_lists_each_blocked_step_with_a_fix_for_its_node(monkeypatch, tmp_path):
    from tests.fakes.connection import FakeSystem

    def open_connection(spec):
        node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl", "docker", "dockerd", "apt-get", "dpkg"})
        node.add_gpu(0x1EB8)
        FakeSystem(node).unit("docker").attach()
        return FakeConnection(node, name=spec.host)

    monkeypatch.setattr(connection, "open_connection", open_connection)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\ngpu-a ansible_host=10.0.0.1 ansible_user=ubuntu\ngpu-b\n")
    result = runner.invoke(app, ["plan", "-I", str(inventory), "--only", "runtime", "--log-dir", str(tmp_path / "l")])
    assert result.exit_code == 1, result.output
    out = flat(result.stdout)
    for name in ("gpu-a", "gpu-b"):
        assert (f"fix: run the toolkit step first: gpunode install --inventory {inventory} --limit {name} "
                "--only toolkit") in out


def test_a_steps_fix_reaches_the_cli_as_data_in_text_and_json(docker_without_toolkit, monkeypatch):
    """The fix is rendered from its parts (gpunode/fixes.py), not by rewriting its text: the spy sees a Fix."""
    from gpunode.cli import _target
    from gpunode.fixes import Fix

    seen = []
    render = _target.runnable

    def spy(fix, node_args, ssh=()):
        seen.append(fix)
        return render(fix, node_args, ssh)

    monkeypatch.setattr(_target, "runnable", spy)
    for extra in ([], ["--json"]):
        seen.clear()
        result = runner.invoke(app, ["plan", "--host", "root@gpu-01", "--only", "runtime", *extra])
        assert "gpunode install --host root@gpu-01 --only toolkit" in flat(result.stdout)
        assert any(isinstance(f, Fix) and f.commands()[0].command == "install" for f in seen), extra
