"""The CLI through typer's runner, with fake nodes. The one local run (doctor) only reads this machine."""

import json
import re

import pytest
from typer.testing import CliRunner

from gpunode import connection
from gpunode.cli import app
from tests.fakes.connection import FakeConnection, FakeNode

runner = CliRunner()


@pytest.fixture
def fake_node(monkeypatch):
    node = FakeNode(tools={"update-initramfs", "modprobe"}, modules={"nouveau"}, uid=1000)
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host or "local"))
    return node


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("gpunode 0.")


def test_doctor_on_this_machine_reports_no_gpu_and_changes_nothing(tmp_path):
    # This machine has no NVIDIA GPU. doctor only reads (a probe with no sudo and no writes).
    result = runner.invoke(app, ["doctor", "--json"])
    data = json.loads(result.stdout)
    checks = {c["id"]: c for c in data["checks"]}
    assert checks["hw.gpu-present"]["status"] == "fail"
    assert "no NVIDIA GPU was found" in checks["hw.gpu-present"]["evidence"]
    assert result.exit_code == 1
    human = runner.invoke(app, ["doctor"])
    assert "no NVIDIA GPU was found" in human.stdout


def test_plan_human_output_shows_status_commands_and_diff(fake_node):
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--skip", "driver"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "nouveau" in out and "change" in out
    assert "+blacklist nouveau" in out and "$ sudo update-initramfs -u" in out
    assert "reboot is required" in out
    assert fake_node.files == {}


def test_plan_json_is_valid_json_on_stdout(fake_node):
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--json"])
    data = json.loads(result.stdout)
    assert data["host"] == "gpu-01" and data["steps"][0]["status"] == "change"


def test_install_dry_run_equals_plan(fake_node):
    a = json.loads(runner.invoke(app, ["plan", "--host", "n", "--json"]).stdout)
    b = json.loads(runner.invoke(app, ["install", "--dry-run", "--host", "n", "--json"]).stdout)
    assert a["steps"] == b["steps"]
    assert fake_node.files == {}


def test_install_applies_and_asks_for_reboot(fake_node):
    result = runner.invoke(app, ["install", "--host", "n", "--only", "nouveau"])
    assert result.exit_code == 3, result.output
    assert "reboot required, then run the same command again" in result.output
    assert "blacklist nouveau" in fake_node.files["/etc/modprobe.d/blacklist-nouveau.conf"]


def test_only_and_skip(fake_node):
    data = json.loads(runner.invoke(app, ["plan", "--host", "n", "--json", "--skip", "nouveau"]).stdout)
    assert data["steps"] and "nouveau" not in [s["step"] for s in data["steps"]]
    only = json.loads(runner.invoke(app, ["plan", "--host", "n", "--json", "--only", "nouveau"]).stdout)
    assert [s["step"] for s in only["steps"]] == ["nouveau"]
    bad = runner.invoke(app, ["plan", "--host", "n", "--only", "nuveau"])
    assert bad.exit_code == 2 and "unknown step 'nuveau'" in bad.output


def test_plan_driver_shows_download_flags_flavour_and_reboot(fake_node, tmp_path):
    result = runner.invoke(app, ["plan", "--host", "n", "--driver", "535.129.03", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # undo rich's wrapping
    assert "https://us.download.nvidia.com/tesla/535.129.03/NVIDIA-Linux-x86_64-535.129.03.run" in out
    assert f"{tmp_path}/535.129.03/x86_64/NVIDIA-Linux-x86_64-535.129.03.run" in out
    assert "--silent --dkms --tmpdir=/var/tmp" in out and "-m=kernel" in out
    assert "kernel module: proprietary (Tesla T4 (Turing)" in out
    assert "runs after the reboot the nouveau step needs" in out and "a reboot is required" in out
    assert fake_node.files == {} and not list(tmp_path.iterdir())  # a plan downloads nothing


@pytest.mark.parametrize("args, message", [
    (["--driver-run", "/nonexistent/NVIDIA-Linux-x86_64-535.129.03.run"], "no such file"),
    (["--driver", "535.129.03", "--sha256", "abc"], "is not a SHA-256 digest"),
    (["--driver", "535.129.03", "--kernel-module", "closed"], "--kernel-module 'closed'"),
    (["--driver", "535.129.03", "--module-signing-key", "/root/k.priv"], "go together"),
    (["--driver-run", "https://example.invalid/driver.run"], "cannot tell which driver version"),
    (["--driver", "550.54.15", "--driver-run", "https://x.invalid/NVIDIA-Linux-x86_64-535.129.03.run"],
     "--driver asks for 550.54.15"),
])
def test_driver_option_mistakes_are_usage_errors(fake_node, args, message):
    result = runner.invoke(app, ["plan", "--host", "n", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_bad_driver_version_is_a_usage_error(fake_node):
    result = runner.invoke(app, ["plan", "--host", "n", "--driver", "535.12x"])
    assert result.exit_code == 2 and "is not an NVIDIA driver version" in result.output


def test_unreachable_host_is_one_line_and_exit_2():
    result = runner.invoke(app, ["plan", "--host", "127.0.0.1:1", "--connect-timeout", "3"])
    assert result.exit_code == 2
    assert "cannot connect to 127.0.0.1:1" in result.output and "Traceback" not in result.output


def test_status_reads_the_journal(fake_node):
    empty = runner.invoke(app, ["status", "--host", "n"])
    assert empty.exit_code == 0 and "has not changed anything here yet" in empty.stdout
    runner.invoke(app, ["install", "--host", "n"])
    result = runner.invoke(app, ["status", "--host", "n", "--json"])
    runs = json.loads(result.stdout)["runs"]
    assert runs[-1]["status"] == "reboot-pending" and runs[-1]["steps"][0]["step"] == "nouveau"
    human = runner.invoke(app, ["status", "--host", "n"])
    assert "reboot-pending" in human.stdout and "nouveau" in human.stdout


def test_status_at_80_columns_keeps_run_ids_times_and_steps_whole(fake_node, monkeypatch):
    import io

    from gpunode.cli import status as status_cli
    from gpunode.ui import SafeConsole
    runner.invoke(app, ["install", "--host", "n"])
    runner.invoke(app, ["install", "--host", "n", "--only", "nouveau"])
    runs = json.loads(runner.invoke(app, ["status", "--host", "n", "--json"]).stdout)["runs"]
    buffer = io.StringIO()
    monkeypatch.setattr(status_cli, "out", SafeConsole(file=buffer, width=80))
    runner.invoke(app, ["status", "--host", "n"])
    lines = buffer.getvalue().splitlines()
    assert len(runs) == 2 and max(len(line) for line in lines) <= 80
    for run in runs:
        heading = next(line for line in lines if run["id"] in line)
        assert heading.split() == ["run", run["id"], run["started"], run["status"]]
        for step in run["steps"]:
            assert any(line.split()[:2] == [step["step"], step["result"]] for line in lines), (step, lines)


def test_fleet_plan_prints_hosts_by_steps_and_a_summary(monkeypatch, tmp_path):
    nodes = {}

    def open_connection(spec):
        node = nodes.setdefault(spec.host, FakeNode(tools={"update-initramfs"}, modules={"nouveau"}))
        if not node.pci:
            node.add_gpu(0x1EB8)
        if spec.host == "gpu-b":
            from gpunode.errors import ConnectError
            raise ConnectError("gpu-b: cannot connect to gpu-b:22: Connection refused")
        return FakeConnection(node, name=spec.host)

    monkeypatch.setattr(connection, "open_connection", open_connection)
    result = runner.invoke(app, ["plan", "-H", "gpu-a", "-H", "gpu-b", "-H", "gpu-c", "--only", "nouveau",
                                 "--log-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "nodes x steps" in out and "unreachable" in out and "Connection refused" in out
    assert out.count("change") >= 2  # gpu-a and gpu-c plan the nouveau change
    data = json.loads(runner.invoke(app, ["plan", "-H", "gpu-a", "-H", "gpu-c", "--only", "nouveau", "--json",
                                          "--log-dir", str(tmp_path)]).stdout)
    assert [h["status"] for h in data["hosts"]] == ["planned", "planned"] and data["exit_code"] == 0
    assert (tmp_path / "gpu-a.log").exists()


@pytest.mark.parametrize(("args", "writes"), [(["plan"], False), (["doctor"], False),
                                              (["uninstall", "--dry-run"], False), (["install", "--only", "nouveau"], True)])
def test_read_only_fleet_runs_leave_the_current_directory_alone(monkeypatch, tmp_path, args, writes):
    def open_connection(spec):
        node = FakeNode(tools={"update-initramfs"}, modules={"nouveau"})
        node.add_gpu(0x1EB8)
        return FakeConnection(node, name=spec.host)

    monkeypatch.setattr(connection, "open_connection", open_connection)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text('[hosts.gpu-a]\n[hosts.gpu-b]\n')
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    result = runner.invoke(app, [*args, "--inventory", str(inventory), "--json"])
    assert result.exit_code in (0, 1, 3), result.output
    data = json.loads(result.stdout)
    assert (work / "gpunode-logs").exists() is writes
    assert (data["log_dir"] is not None) is writes and all((h["log"] is not None) is writes for h in data["hosts"])
    # asked for, a read-only run keeps its logs where it is told
    logs = tmp_path / "logs"
    runner.invoke(app, [*args, "--inventory", str(inventory), "--log-dir", str(logs)])
    assert (logs / "gpu-a.log").exists() and list(work.iterdir()) == ([work / "gpunode-logs"] if writes else [])


def test_a_fleet_of_one_is_one_node(monkeypatch, tmp_path):
    node = FakeNode(tools={"update-initramfs"}, modules={"nouveau"})
    node.add_gpu(0x1EB8)
    monkeypatch.setattr(connection, "open_connection", lambda spec: FakeConnection(node, name=spec.host))
    inventory = tmp_path / "inventory.toml"
    inventory.write_text('[hosts.gpu-a]\n')
    result = runner.invoke(app, ["plan", "--inventory", str(inventory), "--only", "nouveau"])
    assert "gpunode plan: 1 node\n" in result.stdout and "1 nodes" not in result.stdout


HOSTS = ["gpu-node-a.example.com", "gpu-node-b.example.com", "gpu-node-c.example.com", "gpu-d"]


def _fleet_at(width, monkeypatch, *args):
    import io

    from gpunode.cli import _fleet
    from gpunode.cli import doctor as doctor_cli
    from gpunode.ui import SafeConsole

    def open_connection(spec):
        node = FakeNode(tools={"update-initramfs"}, modules={"nouveau"})
        node.add_gpu(0x1EB8)
        return FakeConnection(node, name=spec.host)

    monkeypatch.setattr(connection, "open_connection", open_connection)
    buffer = io.StringIO()
    console = SafeConsole(file=buffer, width=width)
    monkeypatch.setattr(_fleet, "out", console)
    monkeypatch.setattr(doctor_cli, "out", console)
    hosts = [w for h in HOSTS for w in ("-H", h)]
    runner.invoke(app, [*args, *hosts])
    return buffer.getvalue().splitlines()


def test_a_fleet_plan_at_80_columns_keeps_host_and_step_names_whole(monkeypatch):
    from gpunode.steps import PIPELINE
    lines = _fleet_at(80, monkeypatch, "plan")
    assert max(len(line) for line in lines) <= 80
    for host in HOSTS:
        assert host in lines  # the host's own line in the steps view
        assert any(line.split()[:2] == [host, "blocked"] for line in lines)  # and its summary line
    words = " ".join(lines).replace(",", " ").replace(";", " ").split()
    assert all(step.name in words for step in PIPELINE)


def test_a_fleet_plan_on_a_wide_console_keeps_its_grid(monkeypatch):
    from gpunode.steps import PIPELINE
    lines = _fleet_at(200, monkeypatch, "plan")
    header = next(line for line in lines if line.split()[:1] == ["host"])
    assert header.split() == ["host", *(step.name for step in PIPELINE)]


def test_a_fleet_doctor_at_80_columns_gives_each_node_a_line(monkeypatch):
    lines = _fleet_at(80, monkeypatch, "doctor")
    assert max(len(line) for line in lines) <= 80
    for host in HOSTS:
        row = next(line for line in lines if line.split()[:1] == [host])
        assert re.fullmatch(r"\S+ +\d+ pass, \d+ warn, \d+ fail, \d+ skip", row), row
