"""GPU sharing on Kubernetes nodes beyond time-slicing (which is the device plugin's config, gpunode/steps/k8s.py):

- MPS: NVIDIA's MPS control daemon as a systemd unit (nvidia-mps.service), with its pipe and log directories and
  optional limits (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Pods use it by mounting the pipe directory.
- MIG: a layout (GPU instance profiles, the same on every GPU) applied by a oneshot unit ordered before the
  kubelet, so it is applied again at every boot before pods are scheduled; the device plugin's migStrategy
  follows it (single: one profile, mixed: several).

Pure: facts -> unit texts and the actions that install them; `plan` of the k8s step adds them.
"""

from __future__ import annotations

from gpunode.facts import Facts
from gpunode.facts import k8s as k8s_facts
from gpunode.facts.k8s import K8S_UNITS
from gpunode.facts.packages import unit
from gpunode.options import Options
from gpunode.plan import Action, RunCommand, WriteFile

UNIT_DIR = "/etc/systemd/system"
MPS_UNIT = "nvidia-mps.service"
MIG_UNIT = "gpunode-mig-layout.service"
MPS_PIPE = "/run/nvidia-mps"
MPS_LOG = "/var/log/nvidia-mps"
_KUBELETS = " ".join(K8S_UNITS)


def mps_unit(thread_percentage: int | None) -> str:
    limits = f"Environment=CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={thread_percentage}\n" if thread_percentage else ""
    return ("# Written by gpunode (k8s step, --mps): NVIDIA's MPS control daemon for the pods of this node.\n"
            "[Unit]\nDescription=NVIDIA MPS control daemon (gpunode)\n"
            f"After=nvidia-persistenced.service {MIG_UNIT}\nBefore={_KUBELETS}\n\n"
            "[Service]\nType=forking\n"
            f"Environment=CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE}\nEnvironment=CUDA_MPS_LOG_DIRECTORY={MPS_LOG}\n{limits}"
            f"ExecStartPre=/usr/bin/install -d -m 0755 {MPS_PIPE} {MPS_LOG}\n"
            "ExecStart=/usr/bin/nvidia-cuda-mps-control -d\n"
            "ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'\nRestart=on-failure\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def mig_unit(profiles: tuple[str, ...]) -> str:
    return ("# Written by gpunode (k8s step, --mig-layout): the MIG layout, applied at every boot before the kubelet.\n"
            "[Unit]\nDescription=Apply the MIG layout (gpunode)\n"
            f"After=nvidia-persistenced.service\nBefore={_KUBELETS} {MPS_UNIT}\n\n"
            "[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            "ExecStart=/usr/bin/nvidia-smi -mig 1\n"
            "ExecStart=-/usr/bin/nvidia-smi mig -dci\nExecStart=-/usr/bin/nvidia-smi mig -dgi\n"
            f"ExecStart=/usr/bin/nvidia-smi mig -cgi {','.join(profiles)} -C\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def mig_strategy(profiles: tuple[str, ...]) -> str:
    """The device plugin's migStrategy: none without MIG, single for one profile everywhere, else mixed."""
    if not profiles:
        return "none"
    return "single" if len(set(profiles)) == 1 else "mixed"


def _unit_actions(facts: Facts, name: str, text: str, what: str) -> tuple[list[Action], str]:
    path = f"{UNIT_DIR}/{name}"
    now = facts[k8s_facts.SHARING_UNITS].get(path)
    state = unit(facts[k8s_facts.UNITS], name)
    actions: list[Action] = []
    if now != text:
        actions += [WriteFile(f"write {path} ({what})", path=path, before=now, after=text),
                    RunCommand("reload systemd's unit files", ("systemctl", "daemon-reload"), timeout=120),
                    RunCommand(f"enable {name}", ("systemctl", "enable", name), timeout=120),
                    RunCommand(f"restart {name}", ("systemctl", "restart", name), timeout=300)]
        return actions, f"{what}: {'to install' if now is None else 'unit to update'}"
    if not state.is_enabled or not state.is_active:
        actions += [RunCommand(f"enable and start {name}", ("systemctl", "enable", "--now", name), timeout=300)]
        return actions, f"{what}: {name} is {state.active}/{state.enabled or 'unknown'}"
    return actions, f"{what}: {name} enabled and running"


def plan_sharing(facts: Facts, options: Options) -> tuple[list[Action], list[str], list[str]]:
    """(actions, reasons, notes) for MPS and MIG as asked by the options."""
    actions: list[Action] = []
    reasons: list[str] = []
    notes: list[str] = []
    if options.mig_layout:
        got, why = _unit_actions(facts, MIG_UNIT, mig_unit(options.mig_layout), "MIG layout " +
                                 ",".join(options.mig_layout))
        actions += got
        reasons.append(why)
        notes.append("MIG needs MIG-capable GPUs (A30, A100, H100, H200, B200...); enabling MIG mode may need a GPU "
                     "reset (no process on the GPU) or a reboot")
    if options.mps:
        got, why = _unit_actions(facts, MPS_UNIT, mps_unit(options.mps_thread_percentage), "MPS control daemon")
        actions += got
        reasons.append(why)
        notes.append(f"pods use MPS by mounting {MPS_PIPE} (hostPath) and setting CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE}")
    return actions, reasons, notes
