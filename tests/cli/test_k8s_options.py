"""The Kubernetes options are checked before anything connects: exit 2 with the problem and a runnable fix."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpunode.cli import app

cli = CliRunner()


@pytest.mark.parametrize(("args", "problem", "fix"), [
    (["--gpu-replicas", "0"], "--gpu-replicas 0 is out of range", "--gpu-replicas 4"),
    (["--mig-layout", "1g.10gb,big"], "big is not a MIG profile", "--mig-layout 1g.10gb,1g.10gb,2g.20gb"),
    (["--mps-thread-percentage", "50"], "--mps-thread-percentage needs --mps", "add --mps"),
    (["--mps", "--mps-thread-percentage", "150"], "out of range", "--mps-thread-percentage 50"),
    (["--kubeconfig", "admin.conf"], "is not an absolute path on the node", "--kubeconfig /etc/kubernetes/admin.conf"),
])
def test_bad_kubernetes_options_exit_2_with_a_fix(args, problem, fix):
    result = cli.invoke(app, ["plan", "--host", "gpu-01", *args])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert problem in text and fix in text


def test_verify_k8s_refuses_engine_and_a_relative_kubeconfig():
    both = cli.invoke(app, ["verify", "--host", "gpu-01", "--k8s", "--engine", "docker"])
    assert both.exit_code == 2 and "--engine and --k8s do not go together" in " ".join(both.output.split())
    rel = cli.invoke(app, ["verify", "--host", "gpu-01", "--k8s", "--kubeconfig", "kc"])
    assert rel.exit_code == 2 and "is not an absolute path on the node" in " ".join(rel.output.split())
