"""What plan and install say on a GPU node without --driver, on a machine without an NVIDIA GPU, and how node
commands in fixes are run on a remote node: exit codes and messages, human and JSON."""

from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from gpunode import compat, fixes, gpus
from gpunode.cli import app
from gpunode.cli._target import runnable
from tests.cli.conftest import flat
from tests.doctor.fakes import finished, set_output
from tests.fakes.connection import ROCKY_9, FakeNode

runner = CliRunner()
SSH = ["ssh", "-p", "2222", "ubuntu@gpu-01"]


def gpu_node(device: int = 0x1EB8, **kw) -> FakeNode:
    node = FakeNode(tools={"update-initramfs", "modprobe", "systemctl", "apt-get", "dpkg"}, **kw)
    node.add_gpu(device)
    return node


def _recommended(device: int) -> str:
    """What the branch table recommends for this GPU, derived here from the tables, not copied."""
    arch = gpus.architecture_of(gpus.lookup_id(device))
    low = compat.architecture_min_driver(arch)
    return str(compat.recommended_drivers(low, arch.last_driver_branch)[0].latest_known)


# -- a GPU node without --driver ----------------------------------------------------------------------------------
def test_plan_on_a_gpu_node_without_driver_is_blocked_with_a_recommended_driver(serve):
    serve(gpu_node())
    result = runner.invoke(app, ["plan", "--host", "gpu-01"])
    assert result.exit_code == 1, result.output
    out = flat(result.stdout)
    version = _recommended(0x1EB8)
    assert "driver blocked a GPU (Tesla T4) but no NVIDIA driver, and no --driver was given" in out
    assert f"fix: gpunode install --host gpu-01 --driver {version}" in out
    assert "compat unknown waits for the driver step (blocked)" in out
    assert "blocked: fix the step marked blocked first" in out


def test_plan_json_and_install_agree_on_the_missing_driver(serve):
    node = serve(gpu_node())
    data = json.loads(runner.invoke(app, ["plan", "--host", "gpu-01", "--json"]).stdout)
    step = next(s for s in data["steps"] if s["step"] == "driver")
    assert step["status"] == "blocked" and data["summary"]["state"] == "blocked"
    assert shlex.split(step["fix"].split("#")[0]) == ["gpunode", "install", "--host", "gpu-01", "--driver",
                                                      _recommended(0x1EB8)]
    result = runner.invoke(app, ["install", "--host", "gpu-01", "--json"])
    assert result.exit_code == 1
    done = json.loads(result.stdout)
    results = {s["step"]: s["result"] for s in done["steps"]}
    assert results["driver"] == "blocked" and results["toolkit"] == results["runtime"] == "not-run"
    assert done["summary"]["ready"] is False
    assert not any(p.startswith("/etc/apt") for p in node.files)  # no toolkit repository for a driverless node


def test_a_dropped_architecture_gets_its_last_branch():
    device = 0x102D  # Tesla K80: Kepler, R470 is its last branch
    version = _recommended(device)
    assert version.startswith("470.")


def test_skip_driver_is_the_documented_way_to_leave_it_out(serve):
    serve(gpu_node())
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--skip", "driver"])
    assert result.exit_code == 0, result.output
    assert "driver" not in [line.split()[1] for line in result.stdout.splitlines()
                            if line[:2].strip().isdigit() and len(line.split()) > 1]


def test_an_installed_driver_that_is_not_loaded_names_its_version(serve):
    node = finished()
    node.modules.clear()
    node.nvidia_version = None
    serve(node)
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--only", "driver"])
    assert result.exit_code == 1
    out = flat(result.stdout)
    assert "driver 580.95.05 is installed but not loaded, and no --driver was given" in out
    assert "fix: gpunode install --host gpu-01 --driver 580.95.05" in out


# -- a machine without an NVIDIA GPU ----------------------------------------------------------------------------
def test_all_ok_plan_on_a_gpu_less_machine_says_why(serve):
    serve(FakeNode(tools={"apt-get", "systemctl"}))
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert "no NVIDIA GPU on this node: no driver to install" in out and "nothing to change" in out


def test_no_gpu_is_the_first_blocker_with_driver_not_headers(serve):
    node = serve(FakeNode(tools={"apt-get", "systemctl"}))
    set_output(node, "kernel_headers", "")
    result = runner.invoke(app, ["plan", "--driver", "580.95.05"])
    assert result.exit_code == 1, result.output
    rows = [line for line in result.stdout.splitlines() if " blocked " in line]
    assert rows and "prerequisites" in rows[0] and "no NVIDIA GPU on this node" in rows[0]
    assert "linux-generic" not in result.stdout and "headers" not in rows[0]


def test_headers_advice_follows_the_distribution(serve):
    node = FakeNode(os_release=ROCKY_9, kernel="5.14.0-362.8.1.el9_3.x86_64", tools={"dnf", "systemctl"})
    node.add_gpu(0x1EB8)
    serve(node)
    set_output(node, "kernel_headers", "")
    set_output(node, "prereq_available", "dnf gcc.x86_64 11.4.1-2.1.el9 appstream\n"
                                         "dnf kernel-devel.x86_64 5.14.0-427.13.1.el9_4 appstream\n")
    result = runner.invoke(app, ["plan", "--host", "gpu-01", "--driver", "580.95.05", "--only", "prerequisites"])
    out = flat(result.stdout)
    assert result.exit_code == 1, result.output
    assert 'ssh -t gpu-01 "sudo dnf install -y kernel kernel-devel"' in out
    assert "apt-get" not in out and "linux-generic" not in out


# -- node commands in fixes, for a remote node --------------------------------------------------------------------
def test_node_commands_are_run_through_ssh_with_the_same_port_and_key():
    fix = (fixes.on_node("sudo modprobe nvidia") + "  # if it fails: `"
           + fixes.on_node("sudo dmesg", fixes.gpunode("explain")) + "`")
    made = runnable(fix, ["--host", "ubuntu@gpu-01:2222"], SSH)
    assert made == ('ssh -t -p 2222 ubuntu@gpu-01 "sudo modprobe nvidia"  # if it fails: '
                    '`ssh -p 2222 ubuntu@gpu-01 "sudo dmesg" | gpunode explain`')
    assert runnable(made, ["--host", "ubuntu@gpu-01:2222"], SSH) == made  # idempotent
    assert runnable(fix, [], []) == fix  # this machine: as written


def test_a_node_command_with_shell_characters_reaches_the_node_unchanged():
    command = "sudo apt-get purge 'nvidia-*' && echo \"$HOME\""
    words = shlex.split(runnable(fixes.on_node(command), [], SSH))
    assert words == ["ssh", "-t", "-p", "2222", "ubuntu@gpu-01", command]
    assert shlex.split(runnable(fixes.on_node("sudo reboot"), [], SSH))[-1] == "sudo reboot"


def test_doctor_on_a_remote_node_prints_node_commands_through_ssh(serve, tmp_path):
    node = finished()
    set_output(node, "driver_smi", "No devices were found", 6)
    serve(node)
    key = tmp_path / "my key"
    key.write_text("not read: the fake connection does not log in\n")
    result = runner.invoke(app, ["doctor", "--host", "ubuntu@gpu-01:2222", "--identity", str(key)])
    assert result.exit_code == 1
    out = flat(result.stdout)
    prefix = shlex.join(["ssh", "-t", "-i", str(key), "-p", "2222", "ubuntu@gpu-01"])
    assert f'fix: {prefix} "sudo dmesg -T | grep -E \'NVRM|nvidia\'"' in out  # the whole pipe runs there
    assert "fix: sudo dmesg" not in out
