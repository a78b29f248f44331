"""The k8s step's plan from facts (no node): no kubelet, the device plugin to deploy / unchanged / to update,
time-slicing replicas, k3s's containerd template, and what blocks it (no kubectl, no kubeconfig, API down)."""

from __future__ import annotations

import json

from gpunode.actions.k8s import ConfigureTemplate, KubectlApply, WaitForGpus
from gpunode.facts import Facts
from gpunode.facts.kernel import PciDevice
from gpunode.facts.registry import Section
from gpunode.options import Options
from gpunode.plan import Earlier, RestartService, Status, StepPlan, ok
from gpunode.steps import k8s
from gpunode.steps.outputs import RuntimeOutputs, ToolkitOutputs

T4 = PciDevice("0000:3b:00.0", 0x10DE, 0x1EB8, 0x030200)
K3S_DIR = "/var/lib/rancher/k3s/agent/etc/containerd"
K3S_GENERATED = ('version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                 '  runtime_type = "io.containerd.runc.v2"\n')


def applied(obj: dict) -> dict:
    """An object as the API server returns it after `kubectl apply`."""
    out = json.loads(json.dumps(obj))
    out["metadata"].setdefault("annotations", {})[k8s.LAST_APPLIED] = json.dumps(obj, separators=(",", ":"))
    out["metadata"]["uid"] = "0c6f"
    return out


def cluster_text(*, deployed=(), gpus: int | None = 0, kubectl="/usr/bin/kubectl",
                 kubeconfig="/etc/kubernetes/admin.conf", node_error="", socket=False) -> str:
    lines = ["node=gpu-1", f"kubectl={kubectl}", f"kubeconfig={kubeconfig}"]
    if kubectl and kubeconfig:
        if node_error:
            lines += ["@@get node", node_error, "@@end 1"]
        else:
            alloc = {"cpu": "8"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
            lines += ["@@get node", json.dumps({"kind": "Node", "status": {"allocatable": alloc}}), "@@end 0"]
            for key in k8s.k8s_facts.OBJECT_KEYS:
                found = [o for o in deployed if k8s.key(o) == key]
                lines += [f"@@get {key}", json.dumps(applied(found[0])) if found else
                          f'Error from server (NotFound): "{key}" not found', f"@@end {0 if found else 1}"]
    if socket:
        lines.append("socket=yes")
    return "\n".join(lines) + "\n"


def facts(cluster: str = "", tools: str = "kubelet /usr/bin/kubelet\nkubectl /usr/bin/kubectl", units: str = "",
          files: dict | None = None, gpus=(T4,)) -> Facts:
    return Facts(pci=tuple(gpus), files=files or {}, outputs={
        "k8s_tools": Section(tools, 0), "k8s_units": Section(units, 0), "k8s_cluster": Section(cluster, 0),
        "nvidia_ctk_version": Section("NVIDIA Container Toolkit CLI version 1.20.0\n", 0)})


def with_runtime(engines=("containerd",)) -> Earlier:
    return Earlier({"runtime": ok("runtime", "x").with_outputs(RuntimeOutputs(tuple(engines))),
                    "toolkit": ok("toolkit", "x").with_outputs(ToolkitOutputs(False))}, k8s.READS)


def plan(f: Facts, earlier: Earlier | None = None, **options) -> StepPlan:
    return k8s.plan(f, Options(**options), earlier or with_runtime())


def test_a_node_without_kubelet_is_ok_and_unchanged():
    p = plan(facts(tools="", cluster=cluster_text(kubectl="", kubeconfig="")))
    assert (p.status, p.reason, p.actions) == (Status.OK, "no kubelet on this node", ())
    assert p.outputs == k8s.K8sOutputs(None, 0)


def test_bare_cluster_node_plans_the_manifest_with_a_not_deployed_diff_and_a_bounded_wait():
    p = plan(facts(cluster_text()), k8s_wait=120.0)
    assert p.status is Status.CHANGE
    apply, wait = p.actions
    assert isinstance(apply, KubectlApply) and isinstance(wait, WaitForGpus)
    assert apply.commands() == ["sudo /usr/bin/kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=30s "
                                "apply -f /var/lib/gpunode/k8s/nvidia-device-plugin.json"]
    assert [c[0] for c in apply.changes] == list(k8s.k8s_facts.OBJECT_KEYS)
    assert "daemonset/nvidia-device-plugin-daemonset: not deployed" in apply.diff()
    manifest = json.loads(apply.manifest)
    ds = manifest["items"][2]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "sharing" not in manifest["items"][1]["data"]["config.yaml"]
    assert (wait.node, wait.expected, wait.wait) == ("gpu-1", 1, 120.0)
    assert p.outputs == k8s.K8sOutputs("kubelet", 1)


def test_deployed_and_advertising_is_ok_whatever_the_server_added():
    p = plan(facts(cluster_text(deployed=k8s.objects(1), gpus=1, socket=True)))
    assert p.status is Status.OK, p
    assert p.reason.endswith("device plugin v0.17.0 deployed; node advertises 1 nvidia.com/gpu, expected 1")


def test_time_slicing_changes_the_config_map_and_the_daemonset_and_expects_n_times_the_gpus():
    f = facts(cluster_text(deployed=k8s.objects(1), gpus=1), gpus=(T4, PciDevice("0000:af:00.0", 0x10DE, 0x1EB8,
                                                                                   0x030200)))
    p = plan(f, gpu_replicas=4)
    apply, wait = p.actions
    assert [c[0] for c in apply.changes] == ["configmap/nvidia-device-plugin-config",
                                             "daemonset/nvidia-device-plugin-daemonset"]  # config digest changed
    assert "replicas: 4" in apply.diff()
    assert wait.expected == 8 and "expected 8 (2 GPU(s) x 4 time-slicing replicas)" in p.reason
    config = json.loads(apply.manifest)["items"][1]["data"]["config.yaml"]
    assert "timeSlicing:" in config and "replicas: 4" in config


def test_deployed_but_not_advertising_plans_only_the_wait():
    p = plan(facts(cluster_text(deployed=k8s.objects(1), gpus=0)))
    assert [type(a) for a in p.actions] == [WaitForGpus]


def test_what_blocks_it_is_named_with_its_fix():
    no_kubectl = plan(facts(cluster_text(kubectl="")))
    assert no_kubectl.status is Status.BLOCKED and no_kubectl.reason.startswith("no kubectl on this node")
    no_config = plan(facts(cluster_text(kubeconfig="")))
    assert no_config.status is Status.BLOCKED and "--kubeconfig PATH" in (no_config.fix or "")
    down = plan(facts(cluster_text(node_error="The connection to the server 10.0.0.1:6443 was refused")))
    assert down.status is Status.BLOCKED and "was refused" in down.reason
    no_runtime = plan(facts(cluster_text()), with_runtime(engines=("docker",)))
    assert no_runtime.status is Status.BLOCKED and "gpunode install --k8s" in (no_runtime.fix or "")


def test_user_kubeconfig_other_than_the_probes_applies_everything_and_says_why():
    p = plan(facts(cluster_text(deployed=k8s.objects(1), gpus=1)), kubeconfig="/home/ops/kc.yaml")
    apply = p.actions[0]
    assert isinstance(apply, KubectlApply) and "--kubeconfig /home/ops/kc.yaml" in apply.commands()[0]
    assert any("were not read" in n for n in p.notes)


def test_k3s_gives_its_template_the_runtime_and_restarts_k3s_not_etc_containerd():
    f = facts(cluster_text(kubeconfig="/etc/rancher/k3s/k3s.yaml"), tools="k3s /usr/local/bin/k3s\n"
              "kubectl /usr/local/bin/kubectl", units="k3s.service\tactive\tenabled\n",
              files={f"{K3S_DIR}/config.toml": K3S_GENERATED})
    p = plan(f, Earlier({"toolkit": ok("toolkit", "x").with_outputs(ToolkitOutputs(False))}, k8s.READS))
    template, restart, apply, wait = p.actions
    assert isinstance(template, ConfigureTemplate) and isinstance(restart, RestartService)
    assert template.template == f"{K3S_DIR}/config.toml.tmpl" and restart.unit == "k3s.service"
    assert template.commands()[1].startswith(f"sudo nvidia-ctk runtime configure --runtime=containerd "
                                             f"--config={K3S_DIR}/config.toml.tmpl")
    assert all(not path.startswith("/etc/containerd") for path, _, _ in template.files)
    assert p.outputs == k8s.K8sOutputs("k3s", 1)


def test_k3s_with_containerd_2_uses_the_v3_template():
    f = facts(cluster_text(), tools="k3s /usr/local/bin/k3s\nkubectl /usr/local/bin/kubectl",
              files={f"{K3S_DIR}/config.toml": "version = 3\n"})
    template = plan(f).actions[0]
    assert isinstance(template, ConfigureTemplate) and template.template == f"{K3S_DIR}/config-v3.toml.tmpl"


def test_k3s_that_never_started_is_blocked():
    f = facts(cluster_text(), tools="k3s /usr/local/bin/k3s\nkubectl /usr/local/bin/kubectl")
    p = plan(f)
    assert p.status is Status.BLOCKED and "systemctl start k3s.service" in (p.fix or "")


def test_mps_installs_its_daemon_as_a_unit_with_limits_then_a_rerun_only_checks_it():
    from gpunode.steps import k8s_sharing as sh
    deployed = k8s.objects(1)
    p = plan(facts(cluster_text(deployed=deployed, gpus=1)), mps=True, mps_thread_percentage=50)
    write = p.actions[0]
    assert write.path == "/etc/systemd/system/nvidia-mps.service" and write.before is None
    assert "Environment=CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n" in write.after
    assert "Before=kubelet.service" not in write.after and "kubelet.service" in write.after.split("Before=")[1]
    assert [a.commands()[0] for a in p.actions[1:]] == ["sudo systemctl daemon-reload",
                                                        "sudo systemctl enable nvidia-mps.service",
                                                        "sudo systemctl restart nvidia-mps.service"]
    installed = facts(cluster_text(deployed=deployed, gpus=1),
                      units="nvidia-mps.service\tactive\tenabled\n",
                      files={"/etc/systemd/system/nvidia-mps.service": sh.mps_unit(50)})
    again = plan(installed, mps=True, mps_thread_percentage=50)
    assert again.status is Status.OK and "MPS control daemon: nvidia-mps.service enabled and running" in again.reason
    stopped = facts(cluster_text(deployed=deployed, gpus=1), units="nvidia-mps.service\tinactive\tenabled\n",
                    files={"/etc/systemd/system/nvidia-mps.service": sh.mps_unit(50)})
    assert [a.commands() for a in plan(stopped, mps=True, mps_thread_percentage=50).actions] == [
        ["sudo systemctl enable --now nvidia-mps.service"]]


def test_mig_layout_unit_runs_before_the_kubelet_and_sets_the_plugins_mig_strategy():
    from gpunode.steps import k8s_sharing as sh
    p = plan(facts(cluster_text()), mig_layout=("3g.40gb", "3g.40gb"))
    unit = p.actions[0]
    assert unit.path == "/etc/systemd/system/gpunode-mig-layout.service"
    before = next(line for line in unit.after.splitlines() if line.startswith("Before="))
    assert "kubelet.service" in before and "k3s.service" in before and "rke2-agent.service" in before
    assert "ExecStart=/usr/bin/nvidia-smi mig -cgi 3g.40gb,3g.40gb -C\n" in unit.after
    apply = next(a for a in p.actions if isinstance(a, KubectlApply))
    assert "migStrategy: single" in json.loads(apply.manifest)["items"][1]["data"]["config.yaml"]
    wait = p.actions[-1]
    assert isinstance(wait, WaitForGpus) and wait.expected == 2  # one GPU, two instances
    mixed = plan(facts(cluster_text()), mig_layout=("1g.10gb", "2g.20gb"))
    assert not any(isinstance(a, WaitForGpus) for a in mixed.actions)
    assert sh.mig_strategy(("1g.10gb", "2g.20gb")) == "mixed" and sh.mig_strategy(()) == "none"


def test_rke2_agent_uses_its_own_template_and_service():
    rke2 = "/var/lib/rancher/rke2/agent/etc/containerd"
    f = facts(cluster_text(kubectl="/var/lib/rancher/rke2/bin/kubectl", kubeconfig="/etc/rancher/rke2/rke2.yaml"),
              tools="rke2 /usr/local/bin/rke2\nkubectl /var/lib/rancher/rke2/bin/kubectl",
              units="rke2-agent.service\tactive\tenabled\nrke2-server.service\tinactive\tnot-found\n",
              files={f"{rke2}/config.toml": K3S_GENERATED})
    p = plan(f)
    template, restart = p.actions[:2]
    assert isinstance(template, ConfigureTemplate) and template.template == f"{rke2}/config.toml.tmpl"
    assert isinstance(restart, RestartService) and restart.unit == "rke2-agent.service"
    assert p.outputs == k8s.K8sOutputs("rke2", 1)


def test_kubernetes_options_on_a_node_without_kubelet_are_named_in_a_note():
    """The option table's rule for --gpu-replicas, --mps, --mig-layout ... (inapplicable="note", needs="kubelet")."""
    f = facts(tools="")
    p = plan(f, gpu_replicas=4, mps=True, mig_layout=("1g.10gb",))
    assert p.status is Status.OK and not p.actions
    assert p.notes == ("--gpu-replicas, --mps, --mig-layout apply to a Kubernetes node: not used here (no kubelet, "
                       "k3s or RKE2)",)
    assert plan(f).notes == ()  # nothing given, nothing said
