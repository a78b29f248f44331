"""The Ansible renderer of gpunode's fixes (plugins/plugin_utils/gpunode_bridge.py): gpunode's own commands become
the module's arguments, other commands stay runnable, and a failed task carries the output its fix refers to."""

from __future__ import annotations

from ansible_collections.gpunode.gpu.plugins.plugin_utils import gpunode_bridge as bridge
from gpunode import fixes
from gpunode.options import Options

HOST = ["--host", "root@gpu-01"]


def test_gpunode_commands_become_module_arguments():
    fix = "run the toolkit step first: " + fixes.gpunode("install", only="toolkit")
    assert bridge.ansible_fix(fix, HOST) == 'run the toolkit step first: gpunode.gpu.node: {only: ["toolkit"]}'
    assert bridge.ansible_fix(fixes.gpunode("uninstall", only="prerequisites"), HOST) == \
        'gpunode.gpu.node: {state: "absent", only: ["prerequisites"]}'
    assert bridge.ansible_fix(fixes.gpunode("install", only="nouveau", reboot=True), HOST) == \
        'gpunode.gpu.node: {only: ["nouveau"]}, then ansible.builtin.reboot and the same task again'
    assert bridge.ansible_fix(fixes.gpunode("doctor"), HOST) == "gpunode.gpu.doctor"


def test_the_users_options_are_carried_as_arguments():
    again = fixes.same_run(Options(driver="570.172.08", hold_kernel=True, engines=("docker",)), stop_gpu_services=True)
    assert bridge.ansible_fix("then " + again, HOST) == ('then gpunode.gpu.node: {driver: "570.172.08", engines: '
                                                         '["docker"], hold_kernel: true, stop_gpu_services: true}')


def test_other_commands_stay_runnable_from_the_controller_and_node_commands_stay_as_they_are():
    fix = fixes.gpunode("verify", k8s=True) + "; " + fixes.on_node("sudo modprobe nvidia")
    assert bridge.ansible_fix(fix, HOST) == "gpunode verify --host root@gpu-01 --k8s; sudo modprobe nvidia"
    assert bridge.ansible_fix(fixes.SEE_OUTPUT_RERUN, HOST).startswith("see `output` in this task's result; ")


class _Action:
    def __init__(self, results):
        self._connection = _Conn()
        self.results = list(results)

    def _low_level_execute_command(self, line, **kw):
        return self.results.pop(0)


class _Conn:
    def has_option(self, name):
        return False


def test_a_failed_task_carries_the_failed_commands_output():
    ok = {"rc": 0, "stdout": "fine\n", "stderr": ""}
    bad = {"rc": 100, "stdout": "".join(f"line {i}\n" for i in range(50)), "stderr": "E: broken\n"}
    conn = bridge.AnsibleNodeConnection(_Action([ok, bad, ok]), "gpu-01")
    for line in ("true", "apt-get install -y x\nsecond line", "true"):
        conn._exec(line, None, 10)
    (entry,) = conn.output()
    assert entry["rc"] == 100 and entry["command"] == "apt-get install -y x ..." and entry["stderr"] == "E: broken"
    assert entry["stdout"].splitlines() == [f"line {i}" for i in range(30, 50)]  # the end of it
    clean = bridge.AnsibleNodeConnection(_Action([ok]), "gpu-01")
    clean._exec("true", None, 10)
    assert clean.output() == [{"command": "true", "rc": 0, "stdout": "fine", "stderr": ""}]
