"""Doctor verdicts on Debian's packaged driver without a GPU, from the real outputs of the real-OS tier's nvidia VM
(tests/fixtures/real/debian-nvidia): the software checks still answer (built for the running kernel, one source,
the next boot's module), the GPU checks skip, and `modprobe nvidia` not resolving (no libcuda1) is said."""

from __future__ import annotations

from gpunode.doctor import CHECKS
from gpunode.doctor.base import Node
from gpunode.facts import Facts
from gpunode.facts.osinfo import parse_os_release
from gpunode.facts.registry import Section
from tests.conftest import FIXTURES

DEBIAN = FIXTURES / "debian-nvidia"
K = "6.1.0-56-amd64"
OS = parse_os_release('ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')


def node(linked: bool) -> Node:
    kos = "".join(f"ko {line}\n" for line in (DEBIAN / "modinfo-F-name.txt").read_text().splitlines())
    dkms = "".join(f"dkms {line}\n" for line in (DEBIAN / "dkms-status.txt").read_text().splitlines())
    files = {"/etc/modprobe.d/nvidia.conf": (DEBIAN / "etc-nvidia-nvidia-modprobe.conf").read_text()} if linked else {}
    outputs = {
        "driver_packages": Section((DEBIAN / "dpkg-query.txt").read_text(), 0),
        "driver_module": Section((DEBIAN / "modinfo-nvidia-current.txt").read_text(), 0),
        "driver_userspace": Section("lib /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.309.01\n", 0),
        "driver_debian_names": Section(f"alt /usr/lib/nvidia/current\n{kos}", 0),
        "driver_smi": Section((DEBIAN / "nvidia-smi_no-gpu.txt").read_text(), 9),
        "doctor_kernels": Section(f"kernel {K} headers /lib/modules/{K}/updates/dkms/nvidia-current.ko image\n"
                                  f"{dkms}grubdefault 0\n", 0),
        "kernel_headers": Section(f"build /lib/modules/{K}/build\n", 0),
    }
    return Node(Facts(os=OS, kernel=K, arch="x86_64", files=files, outputs=outputs))


def verdicts(n: Node) -> dict[str, tuple[str, str]]:
    found = {}
    for check in CHECKS:
        if check.id.startswith(("driver.", "kernel.")):
            v = check.fn(n)
            found[check.id] = (v.status, v.evidence)
    return found


def test_packaged_driver_without_gpu_gets_software_verdicts():
    got = verdicts(node(linked=True))
    status, evidence = got["driver.loaded"]
    assert status == "skip" and f"built for kernel {K}" in evidence and "no NVIDIA GPU" in evidence
    assert "driver 535.309.01 (distribution package nvidia-kernel-dkms 535.309.01-0+deb12u1)" in evidence
    assert "would not find it" not in evidence
    assert got["driver.single-source"][0] == "pass" and "535.309.01 from distribution packages" in \
        got["driver.single-source"][1]
    assert got["kernel.headers"][0] == "pass"
    assert got["kernel.dkms-newest-kernel"][0] == "pass" and "nvidia-current" in got["kernel.dkms-newest-kernel"][1]
    for gpu_only in ("driver.smi", "driver.persistence", "driver.module-flavour", "kernel.nouveau-loaded"):
        assert got[gpu_only] == ("skip", "no NVIDIA GPU"), gpu_only


def test_compute_only_set_says_modprobe_nvidia_would_not_find_the_module():
    status, evidence = verdicts(node(linked=False))["driver.loaded"]
    assert status == "skip" and "`modprobe nvidia` would not find it" in evidence and "libcuda1" in evidence


def _journal(*records) -> str:  # type: ignore[no-untyped-def]
    import json

    return json.dumps({"runs": [], "undo": [r.to_dict() for r in records]})


def _held_node(status: str, journal: str) -> Node:
    outputs = {"pkg_status": Section(status, 0), "gpunode_pending_restarts": Section(journal, 0)}
    return Node(Facts(os=OS, kernel=K, arch="x86_64", outputs=outputs))


def test_packages_held_checks_every_recorded_version_and_the_holds_gpunode_placed():
    from gpunode.doctor.driver import packages_held
    from gpunode.records import DriverRecord, HoldRecord

    v = "535.309.01-0+deb12u1"
    route = (f"nvidia-kernel-dkms={v}", f"nvidia-smi={v}", "nvidia-persistenced=535.171.04-1~deb12u1")
    journal = _journal(DriverRecord(step="driver", version="535.309.01", source="packages", packages=route),
                       HoldRecord(step="driver", manager="apt",
                                  held=("nvidia-kernel-dkms", "nvidia-smi", "nvidia-persistenced")))
    rows = {"nvidia-kernel-dkms": v, "nvidia-smi": v, "nvidia-persistenced": "535.171.04-1~deb12u1"}

    def status(held: set[str], **over: str) -> str:
        return "".join(f"{'h' if n in held else 'i'}i \t{n}\t{over.get(n.replace('-', '_'), ver)}\n"
                       for n, ver in rows.items())

    every = set(rows)
    ok = packages_held(_held_node(status(every), journal))
    assert ok.status == "pass" and "3 packages at the versions gpunode installed, 3 held" in ok.evidence
    loose = packages_held(_held_node(status(every - {"nvidia-smi"}), journal))
    assert loose.status == "warn" and "no longer held: nvidia-smi" in loose.evidence
    assert str(loose.fix) == "sudo apt-mark hold nvidia-smi"
    moved = packages_held(_held_node(status(every, nvidia_smi="535.309.02-1"), journal))
    assert moved.status == "fail" and "nvidia-smi 535.309.02-1 (installed 535.309.01-0+deb12u1)" in moved.evidence
    assert "install --driver-source packages --driver 535.309.01" in str(moved.fix)
    old = _journal(DriverRecord(step="driver", version="535.309.01", source="packages"))
    assert packages_held(_held_node(status(every), old)).status == "skip"
    assert packages_held(_held_node(status(every), _journal())).status == "skip"
