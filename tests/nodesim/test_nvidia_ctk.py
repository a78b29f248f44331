"""The nvidia-ctk shim against every real `nvidia-ctk runtime configure` run in data/nvidia-ctk-real
(copied from shared/fixtures/real/nvidia-ctk: NVIDIA Container Toolkit v1.20.0 line)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.integration

REAL = Path(__file__).parent / "data" / "nvidia-ctk-real"
CASES = sorted(p.name for p in REAL.iterdir() if p.is_dir())


def _strip_times(text: str) -> str:
    return re.sub(r'time="[^"]*" ', "", text).strip()


@pytest.fixture(scope="module")
def ctk_node(nodesim_available):
    from tests.nodesim import SimNode, get_profile

    node = SimNode(get_profile("ubuntu-22.04-nogpu", toolkit_version="1.20.0-1")).start()
    yield node
    node.stop()


def test_every_real_run_is_covered():
    assert len(CASES) == 28
    assert sum(c.startswith("docker_") for c in CASES) == 14
    assert sum(c.startswith("containerd_") for c in CASES) == 14


@pytest.mark.parametrize("case", CASES)
def test_nvidia_ctk_matches_real_run(ctk_node, case):
    node = ctk_node
    d = REAL / case
    inp = next(p for p in d.iterdir() if p.name.startswith("input-"))
    name = inp.name[len("input-"):]
    node.remove("/etc/RUNTIME")
    node.write(f"/etc/RUNTIME/{name}", inp.read_bytes())
    command = (d / "command.txt").read_text().strip()
    assert shlex.split(command)[0] == "nvidia-ctk"
    rc, out, err = node.ssh(command)
    assert rc == int((d / "exit-code").read_text().strip()), err
    assert _strip_times(out + err) == _strip_times((d / "stdout-stderr.txt").read_text())

    expected = (d / f"output-{name}").read_bytes()
    got = node.read_bytes(f"/etc/RUNTIME/{name}")
    if name.endswith(".json"):
        assert got == expected  # byte-exact, including the refusal that leaves the file untouched
    else:
        assert tomllib.loads(got.decode()) == tomllib.loads(expected.decode())
        dropin = node.read("/etc/RUNTIME/conf.d/99-nvidia.toml")
        assert dropin is not None
        assert tomllib.loads(dropin) == tomllib.loads((d / "output-conf.d-99-nvidia.toml").read_text())
        # the layout is go-toml's too
        assert dropin == (d / "output-conf.d-99-nvidia.toml").read_text()
        assert got == expected


def test_nvidia_ctk_version_and_defaults(ctk_node):
    rc, out, _ = ctk_node.ssh("nvidia-ctk --version")
    assert rc == 0 and out.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.20.0"
    assert re.search(r"version (\d+\.\d+\.\d+)", out)
    ctk_node.remove("/etc/docker/daemon.json")
    rc, out, err = ctk_node.ssh("nvidia-ctk runtime configure --runtime=docker --set-as-default")
    assert rc == 0, err
    assert ctk_node.read("/etc/docker/daemon.json") == (
        '{\n    "default-runtime": "nvidia",\n    "runtimes": {\n        "nvidia": {\n            "args": [],\n'
        '            "path": "nvidia-container-runtime"\n        }\n    }\n}')
    assert ctk_node.calls("nvidia-ctk")[-1] == ["nvidia-ctk", "runtime", "configure", "--runtime=docker",
                                                "--set-as-default"]


def test_the_real_os_tiers_stand_in_runs_the_same_python_with_its_version(tmp_path):
    """tests/realos/toolkit_repo.py packages this python behind a wrapper of its own (`nvidia_ctk.py VERSION ARGS`),
    run by the guest's python3: the contract the simulator's shim uses too. Run here with the wrapper as packaged,
    its directory pointed at this checkout's copy (a shim-only change to the contract broke the VM tier once)."""
    import subprocess

    from tests.realos import toolkit_repo

    files = {path: body for _, packaged in toolkit_repo._packages().values() for path, body in packaged.items()}
    wrapper = tmp_path / "nvidia-ctk"
    wrapper.write_text(files["/usr/bin/nvidia-ctk"][0].replace(toolkit_repo.STANDIN_DIR, str(toolkit_repo.SIM_PY)))
    wrapper.chmod(0o755)
    out = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines()[0] == f"NVIDIA Container Toolkit CLI version {toolkit_repo.VERSION.split('-')[0]}"
