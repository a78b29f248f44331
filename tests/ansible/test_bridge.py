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


def test_other_commands_stay_runnable_from_the_controller_and_node_commands_become_tasks():
    fix = fixes.gpunode("verify", k8s=True) + "; " + fixes.on_node("sudo modprobe nvidia")
    assert bridge.ansible_fix(fix, HOST) == ('gpunode verify --host root@gpu-01 --k8s; '
                                             '{ansible.builtin.command: "modprobe nvidia", become: true}')
    assert bridge.ansible_fix(fixes.SEE_OUTPUT_RERUN, HOST).startswith("see `output` in this task's result; ")


def test_a_fixs_commands_become_tasks_to_paste():
    fix = (fixes.on_node("sudo modprobe -r nouveau") + ", then " + fixes.gpunode("install", only="nouveau", reboot=True)
           + "; " + fixes.on_node("printf 'x\\n' | sudo tee /etc/modules-load.d/x.conf") + "; "
           + fixes.on_node("nvidia-smi -q", note="read the ECC section") + "; " + fixes.here("kubectl get nodes")
           + "; " + fixes.gpunode("plan", only="toolkit") + "; " + fixes.gpunode("verify"))
    assert bridge.fix_tasks(fix, HOST) == [
        {"ansible.builtin.command": "modprobe -r nouveau", "become": True},
        {"gpunode.gpu.node": {"only": ["nouveau"]}}, {"ansible.builtin.reboot": {}},
        {"gpunode.gpu.node": {"only": ["nouveau"]}},
        {"ansible.builtin.shell": "printf 'x\\n' | tee /etc/modules-load.d/x.conf", "become": True},
        {"ansible.builtin.command": "nvidia-smi -q"},
        {"ansible.builtin.command": "kubectl get nodes", "delegate_to": "localhost"},
        {"gpunode.gpu.node": {"only": ["toolkit"]}, "check_mode": True},
        {"ansible.builtin.command": "gpunode verify --host root@gpu-01", "delegate_to": "localhost"}]
    # `sudo -u USER` is not what become does; words are not tasks
    assert bridge.command_task("sudo -u alice systemctl --user restart docker") == {
        "ansible.builtin.command": "sudo -u alice systemctl --user restart docker"}
    assert bridge.fix_tasks("reseat the GPU", HOST) == [] and bridge.fix_tasks(fixes.SEE_OUTPUT_RERUN, HOST) == []
    piped = fixes.on_node("sudo dmesg", into=fixes.gpunode("explain"))
    assert bridge.fix_tasks(piped, HOST) == [
        {"ansible.builtin.command": "dmesg", "become": True, "register": "node_output"},
        {"ansible.builtin.command": "gpunode explain", "delegate_to": "localhost",
         "args": {"stdin": "{{ node_output.stdout }}"}}]
    entry = bridge.fix_entry(fix, HOST, step="driver")
    assert entry["step"] == "driver" and entry["fix"] == bridge.ansible_fix(fix, HOST) and len(entry["tasks"]) == 9


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
