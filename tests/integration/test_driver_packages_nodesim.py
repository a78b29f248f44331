"""`--driver-source packages` end to end on node-simulator nodes whose repositories are modelled on the real ones
(tests/nodesim/catalog.py): Debian 12's non-free, Ubuntu's archive (DKMS and the precompiled signed modules under
Secure Boot), NVIDIA's CUDA repository on Rocky 9. install -> re-run changes nothing -> upgrade within the branch
-> uninstall -> switch to and from a .run. Nothing here touches this machine."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpunode.actions import packages as package_actions
from gpunode.cli import app

pytestmark = pytest.mark.integration

STEPS = ["--only", "nouveau", "--only", "prerequisites", "--only", "driver", "--reboot"]
cli = CliRunner()

DEBIAN_OLD, DEBIAN_NEW = "535.261.03", "535.309.01"
DEBIAN_SET = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced",
              "nvidia-modprobe", "firmware-nvidia-gsp")


@pytest.fixture(autouse=True)
def _fast_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(package_actions, "LOCK_POLL_SECONDS", 1.0)


def run(node, *args: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    result = cli.invoke(app, [*args, *node.cli_args()])
    return result.exit_code, result.output


def plan_json(node, *args: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    code, out = run(node, "plan", "--json", *(a for a in args if a != "--reboot"))
    assert code in (0, 1), out
    return json.loads(out)


def driver_step(doc: dict) -> dict:  # type: ignore[type-arg]
    return next(s for s in doc["steps"] if s["step"] == "driver")


def test_debian_install_rerun_upgrade_uninstall(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    args = ("--driver-source", "packages", "--driver", DEBIAN_OLD, *STEPS)
    # the plan names every package with its exact Debian version before anything runs
    doc = plan_json(node, *args)
    step = driver_step(doc)
    text = json.dumps(step)
    for name in DEBIAN_SET:
        assert name in text
    assert "nvidia-kernel-dkms=535.261.03-1~deb12u1" in text and "apt-mark hold" in text
    assert not any(name in node.installed_packages() for name in DEBIAN_SET)

    code, out = run(node, "install", *args)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-kernel-dkms"] == "535.261.03-1~deb12u1" and have["libcuda1"] == "535.261.03-1~deb12u1"
    assert set(DEBIAN_SET) <= set(node.held_packages())
    assert node.is_loaded("nvidia")
    assert "open-kernel" not in " ".join(have)  # T4 + R535: proprietary, as the .run path chooses

    # re-run: nothing changes
    node.clear_calls()
    code, out = run(node, "install", *args)
    assert code == 0, out
    assert not node.calls("apt-get") and not node.calls("apt-mark")

    # upgrade within the branch: holds released for the transaction, services around it, held again
    code, out = run(node, "install", "--driver-source", "packages", "--driver", DEBIAN_NEW, "--stop-gpu-services",
                    *STEPS)
    assert code == 0, out
    have = node.installed_packages()
    assert have["nvidia-kernel-dkms"] == "535.309.01-0+deb12u1" and have["nvidia-smi"] == "535.309.01-0+deb12u1"
    assert "nvidia-kernel-dkms" in node.held_packages()
    assert (node.driver() or {}).get("version") == DEBIAN_NEW and node.is_loaded("nvidia")

    # status and doctor say packages own the driver
    code, out = run(node, "status")
    line = next(x for x in out.splitlines() if x.startswith(f"driver {DEBIAN_NEW}: "))
    assert "installed by gpunode from packages (" in line and "nvidia-kernel-dkms" in line, out
    code, out = run(node, "doctor", "--format", "json")
    single = next(c for c in json.loads(out)["checks"] if c["id"] == "driver.single-source")
    assert "from distribution packages" in single["evidence"] and "installed by gpunode" in single["evidence"]

    # uninstall purges exactly what gpunode added
    code, out = run(node, "uninstall", "--only", "driver", "--stop-gpu-services")
    assert code == 0, out
    have = node.installed_packages()
    assert not any(name in have for name in DEBIAN_SET), have
    assert "dkms" in have  # the prerequisites step's, removed only by its own undo


def test_debian_version_not_offered_is_refused_before_any_change(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    node.clear_calls()
    code, out = run(node, "install", "--driver-source", "packages", "--driver", "535.999.01", *STEPS)
    assert code == 1, out
    assert "do not offer driver 535.999.01" in out and "535.261.03-1~deb12u1" in out
    assert not node.calls("apt-get")  # refused before the first change: not even prerequisites ran
    assert "nvidia-kernel-dkms" not in node.installed_packages()


def test_debian_without_non_free_gets_the_sources_line(sim_node) -> None:  # type: ignore[no-untyped-def]
    node = sim_node("debian-12-t4")
    node.write("/etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main non-free-firmware\n")
    node.ssh("apt-get update")
    code, out = run(node, "plan", "--driver-source", "packages", "--driver", DEBIAN_OLD, *STEPS[:-1])
    assert code == 1, out
    assert "gpunode-nonfree.list" in out and "contrib non-free non-free-firmware" in out
