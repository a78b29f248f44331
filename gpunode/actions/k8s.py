"""Kubernetes actions: apply a manifest with the node's kubectl, wait until the node advertises its GPUs, and give
k3s / RKE2's containerd template the nvidia runtime."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from gpunode import cancel, fixes
from gpunode.actions.base import Action, WriteFile, command_line
from gpunode.connection.base import Connection
from gpunode.errors import CommandError
from gpunode.shell import Script

POLL_SECONDS = 3.0


def kubectl_argv(kubectl: str, kubeconfig: str, *args: str) -> tuple[str, ...]:
    return (kubectl, "--kubeconfig", kubeconfig, "--request-timeout=30s", *args)


@dataclass(frozen=True, eq=False, repr=False)
class KubectlApply(Action):
    """Write the manifest to a file on the node (kept: it is what was applied) and `kubectl apply -f` it."""

    kubectl: str = "kubectl"
    kubeconfig: str = ""
    path: str = ""  # the manifest on the node
    manifest: str = ""
    changes: tuple[tuple[str, str | None, str], ...] = ()  # (kind/name, deployed or None, wanted), as JSON text

    kind = "kubectl-apply"

    def argv(self) -> tuple[str, ...]:
        return kubectl_argv(self.kubectl, self.kubeconfig, "apply", "-f", self.path)

    def commands(self) -> list[str]:
        return [command_line(self.argv())]

    def details(self) -> list[str]:
        return [f"write the manifest to {self.path} (0600)"]

    def diff(self) -> str:
        return "".join(WriteFile(key, path=key, before=before, after=after).diff()
                       if before is not None else f"{key}: not deployed\n" + WriteFile(key, path=key, after=after).diff()
                       for key, before, after in self.changes)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "path": self.path, "objects": [c[0] for c in self.changes], "diff": self.diff()}

    def apply(self, conn: Connection) -> str | None:
        conn.write_file(self.path, self.manifest, mode=0o600)
        conn.run(self.argv(), sudo=True, timeout=120).check(self.summary)
        return None


def allocatable(node_json: str) -> int | None:
    """`kubectl get node -o json` -> its allocatable nvidia.com/gpu (0 when none); None when not JSON."""
    try:
        node = json.loads(node_json)
    except ValueError:
        return None
    value = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
    return int(value) if str(value).isdigit() else 0


@dataclass(frozen=True, eq=False, repr=False)
class WaitForGpus(Action):
    """Poll the node object until it advertises `expected` nvidia.com/gpu (bounded)."""

    kubectl: str = "kubectl"
    kubeconfig: str = ""
    node: str = ""
    expected: int = 0
    wait: float = 300.0

    kind = "wait"

    def details(self) -> list[str]:
        return [f"wait up to {self.wait:.0f}s until node {self.node} advertises nvidia.com/gpu: {self.expected}"]

    def apply(self, conn: Connection) -> str | None:
        argv = kubectl_argv(self.kubectl, self.kubeconfig, "get", "node", self.node, "-o", "json")
        deadline = time.monotonic() + self.wait
        seen: int | None = None
        while True:
            result = conn.run(argv, sudo=True, timeout=60)
            seen = allocatable(result.stdout) if result.ok else None
            if seen == self.expected or time.monotonic() >= deadline:
                break
            if cancel.sleep(POLL_SECONDS):
                cancel.check_abort("waiting for the node's GPUs")
        if seen != self.expected:
            shown = "could not be read" if seen is None else f"advertises nvidia.com/gpu: {seen}"
            raise CommandError(f"node {self.node} {shown} after {self.wait:.0f}s (expected {self.expected})",
                               fix="check the device plugin's pod: `" + fixes.here(
                                   "kubectl -n kube-system logs daemonset/nvidia-device-plugin-daemonset")
                               + "`, then run `" + fixes.gpunode("verify", k8s=True) + "`")
        return None


_SEED = Script(name="seed-template", body='[ -e "$2" ] || cp -p -- "$1" "$2"')


@dataclass(frozen=True, eq=False, repr=False)
class ConfigureTemplate(Action):
    """k3s / RKE2: start the containerd template from the generated config.toml when there is none (they rewrite
    config.toml from the template at every start), then let nvidia-ctk add the runtime to the template."""

    source: str = ""  # the generated config.toml
    template: str = ""
    argv: tuple[str, ...] = ()  # nvidia-ctk runtime configure --config=TEMPLATE ...
    files: tuple[tuple[str, str | None, str], ...] = ()  # (path, before or None, predicted)

    kind = "runtime-config"

    def seed(self) -> Script:
        return Script(_SEED.body, (self.source, self.template), _SEED.name)

    def commands(self) -> list[str]:
        return [command_line(self.seed()), command_line(self.argv)]

    def changed_files(self) -> tuple[tuple[str, str | None, str | None], ...]:
        return self.files  # nvidia-ctk's edits, predicted

    def diff(self) -> str:
        return "".join(WriteFile(p, path=p, before=b, after=a).diff() for p, b, a in self.files)

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "files": [f[0] for f in self.files], "diff": self.diff()}

    def apply(self, conn: Connection) -> str | None:
        conn.run(self.seed(), sudo=True, timeout=60).check(f"creating {self.template} from {self.source}")
        conn.run(self.argv, sudo=True, timeout=180).check(self.summary)
        return None
