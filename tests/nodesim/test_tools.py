"""nvidia-smi against real captures, container engines, systemctl and the smaller shims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMI = Path(__file__).parent / "data" / "smi"
ERRORS = Path(__file__).parent / "data" / "errors"
CUDA_IMAGE = "nvidia/cuda:12.2.2-base-ubuntu22.04"


def _set_gpus(node, bus_ids, temps=None, powers=None, used=None):
    """Rewrite the simulated GPUs' bus ids (and readings) to those of a capture."""
    lines = [ln.split("\t") for ln in node.read("/var/lib/nodesim/gpus").splitlines()]
    out = []
    for i, bus in enumerate(bus_ids):
        f = list(lines[i % len(lines)])
        f[0], f[1] = str(i), bus
        if temps:
            f[7] = str(temps[i])
        if powers:
            f[6] = str(powers[i])
        if used is not None:
            f[12] = str(used)
        out.append("\t".join(f))
    node.write("/var/lib/nodesim/gpus", "\n".join(out) + "\n")


def _table(node):
    rc, out, err = node.ssh("nvidia-smi")
    assert rc == 0, err
    first, rest = out.split("\n", 1)
    assert first.endswith("       ") and len(first.split()) == 5  # "Tue Jul 14 08:12:38 2026       "
    return rest


def test_nvidia_smi_h100x8_565_matches_the_real_capture(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", preinstalled_driver="565.57.01")
    node.ssh("nvidia-smi -pm 1")
    assert _table(node) == (SMI / "h100-sxm5-80gb-hbm3-x8_driver-565.57.01.txt").read_text()


def test_nvidia_smi_other_layouts_match_real_captures(sim_node):
    node = sim_node("ubuntu-22.04-a100x8", preinstalled_driver="555.42.02")
    node.ssh("nvidia-smi -pm 1")
    _set_gpus(node, ["0000:68:00.0", "0000:9e:00.0", "0000:c2:00.0", "0000:d4:00.0"])
    assert _table(node) == (SMI / "a100-sxm4-x4_driver-555.42.02.txt").read_text()

    node = sim_node("ubuntu-22.04-rtx4090", preinstalled_driver="550.127.05")
    node.ssh("nvidia-smi -pm 1")
    m = node.profile.gpus.model
    _set_gpus(node, ["0000:01:00.0", "0000:25:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0",
                     "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"], temps=m.temp_c, powers=m.idle_power_w)
    assert _table(node) == (SMI / "geforce-rtx-4090_driver-550.127.05.txt").read_text()

    node = sim_node("ubuntu-22.04-h100x8", preinstalled_driver="590.48.01")
    node.ssh("nvidia-smi -pm 1")
    _set_gpus(node, ["0000:00:09.0"], temps=[41], powers=[69], used=0)
    capture = (SMI / "h100-80gb-hbm3_driver-590.48.01_idle.txt").read_text()
    assert _table(node) == capture.split("\n", 1)[1]  # the capture starts with its own timestamp line
    assert node.ssh("nvidia-smi --version")[1] == (SMI / "h100-80gb-hbm3_driver-590.48.01_version.txt").read_text()

    # 535.x: the narrow layout (header and GPU rows as in the 535.104.05 capture)
    node = sim_node("ubuntu-22.04-a100x8", preinstalled_driver="535.104.05")
    node.ssh("nvidia-smi -pm 1")
    _set_gpus(node, ["0000:00:05.0"], temps=[46], powers=[62], used=0)
    got = _table(node).splitlines()
    want = (SMI / "a100-sxm4-80gb-mig-enabled_driver-535.104.05_header-and-gpu-row.txt").read_text().splitlines()
    assert got[:7] == want[:7]
    # the capture has MIG enabled; the simulated GPU has it disabled: the same columns otherwise
    assert got[7] == want[7].replace("   On |", "    0 |")
    assert got[8] == want[8].replace("     N/A      Default", "      0%      Default")


def test_nvidia_smi_states(sim_node):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", secure_boot=True)
    rc, out, _ = node.ssh("nvidia-smi")
    # as the real nvidia-smi prints it (real-OS tier capture: the message, then an empty line)
    real = Path(__file__).parents[1] / "fixtures" / "real" / "debian-nvidia" / "nvidia-smi_no-gpu.txt"
    assert rc == 9 and out == real.read_text()
    assert out.startswith((ERRORS / "nvidia-smi_failed-communicate_single-line.txt").read_text())
    node.set_secure_boot(False)
    node.reboot()
    rc, out, _ = node.ssh("nvidia-smi -L")
    assert out == f"GPU 0: Tesla T4 (UUID: {node.gpu_uuids[0]})\n"
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=index,name,memory.total,compute_cap --format=csv,noheader,nounits")
    assert out == "0, Tesla T4, 15360, 7.5\n"
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=memory.total,persistence_mode --format=csv")
    assert out == "memory.total [MiB], persistence_mode\n15360 MiB, Disabled\n"
    rc, out, _ = node.ssh("nvidia-smi --query-gpu=bogus --format=csv")
    assert rc == 2 and out.startswith('Field "bogus" is not a valid field to query.')
    assert node.calls("nvidia-smi")[-1] == ["nvidia-smi", "--query-gpu=bogus", "--format=csv"]


def test_docker_gpu_flow(sim_node):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", engines=("docker",))
    run = f"docker run --rm --gpus all {CUDA_IMAGE} nvidia-smi -L"
    rc, _, err = node.ssh(run)
    assert rc == 125 and (ERRORS / "docker_could-not-select-device-driver_empty-name.txt").read_text() in err
    node.install_package("nvidia-container-toolkit")
    assert node.ssh("systemctl restart docker")[0] == 0
    assert node.ssh(run)[0] == 125  # the toolkit alone is not enough: daemon.json has no nvidia runtime
    rc, _, err = node.ssh(f"docker run --rm --runtime=nvidia {CUDA_IMAGE} nvidia-smi -L")
    assert rc == 125 and "docker: Error response from daemon: unknown or invalid runtime name: nvidia." in err
    assert node.ssh("nvidia-ctk runtime configure --runtime=docker")[0] == 0
    assert node.ssh(run)[0] == 125  # the daemon has not re-read daemon.json nor seen the hook
    assert node.ssh("systemctl restart docker")[0] == 0
    rc, out, err = node.ssh(run)
    assert rc == 0 and out == f"GPU 0: Tesla T4 (UUID: {node.gpu_uuids[0]})\n"
    rc, out, _ = node.ssh(f"docker run --rm --runtime=nvidia {CUDA_IMAGE} nvidia-smi -L")
    assert rc == 0
    rc, _, err = node.ssh("docker run --rm --gpus all nvidia/cuda:12.8.0-base-ubuntu22.04 nvidia-smi")
    assert rc == 125 and "requirement error: unsatisfied condition: cuda>=12.8" in err
    rc, _, err = node.ssh("docker run --rm --gpus all nvidia/cuda:latest nvidia-smi")
    assert rc == 125 and "manifest unknown" in err
    rc, out, _ = node.ssh("docker info --format '{{json .Runtimes}}'; docker info --format '{{.DefaultRuntime}}'")
    assert set(json.loads(out.splitlines()[0])) == {"io.containerd.runc.v2", "nvidia", "runc"}
    assert out.splitlines()[1] == "runc"
    # a broken daemon.json keeps docker from starting
    node.write("/etc/docker/daemon.json", '{"runtimes": {},}')
    rc, _, err = node.ssh("systemctl restart docker")
    assert rc == 1 and "Job for docker.service failed" in err
    assert node.unit("docker") == {"active": "failed", "enabled": "enabled"}
    rc, _, err = node.ssh(run)
    assert rc == 125 and "Cannot connect to the Docker daemon" in err


def test_docker_gpus_with_only_the_hook_like_moby(sim_node):
    node = sim_node("ubuntu-22.04-t4", preinstalled_driver="535.129.03", toolkit_version="1.17.8-1",
                    docker_gpus_need_runtime=False)
    rc, out, err = node.ssh(f"docker run --rm --gpus all {CUDA_IMAGE} nvidia-smi -L")
    assert rc == 0 and out.startswith("GPU 0: Tesla T4"), err


def test_docker_without_driver_loaded(sim_node):
    node = sim_node("debian-12-t4", engines=("docker",), toolkit_version="1.17.8-1")
    node.ssh("nvidia-ctk runtime configure --runtime=docker && systemctl restart docker")
    rc, _, err = node.ssh(f"docker run --rm --gpus all {CUDA_IMAGE} nvidia-smi")
    assert rc == 125
    assert (ERRORS / "nvidia-container-cli_load-library-failed_libnvidia-ml.so.1.txt").read_text().splitlines()[-1] in err


def test_containerd_v3_on_ubuntu_2404(sim_node):
    node = sim_node("ubuntu-24.04-h100x8", engines=("containerd",), preinstalled_driver="570.124.06",
                    toolkit_version="1.18.0-1")
    assert 'version = 3' in node.read("/etc/containerd/config.toml")
    rc, out, _ = node.ssh("containerd --version")
    assert out.startswith("containerd github.com/containerd/containerd/v2 v2.")
    rc, _, err = node.ssh("nvidia-ctk runtime configure --runtime=containerd --set-as-default")
    assert rc == 0 and 'Using CRI runtime plugin name \\"io.containerd.cri.v1.runtime\\"' in err
    assert node.read("/etc/containerd/config.toml").startswith('imports = ["/etc/containerd/conf.d/*.toml"]\n')
    assert node.ssh("systemctl restart containerd")[0] == 0
    rc, out, _ = node.ssh("containerd config dump | grep -c 'containerd.runtimes.nvidia'")
    assert int(out) >= 1
    rc, out, err = node.ssh(f"ctr run --rm --gpus 0 docker.io/{CUDA_IMAGE} t nvidia-smi -L")
    assert rc == 1 and "not found" in err  # not pulled yet
    rc, out, err = node.ssh(f"ctr image pull docker.io/{CUDA_IMAGE} >/dev/null && "
                            f"ctr run --rm --gpus 0 docker.io/{CUDA_IMAGE} t nvidia-smi -L | head -1")
    assert rc == 0 and out.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-"), err
    rc, out, err = node.ssh(f"nerdctl run --rm --gpus all {CUDA_IMAGE} nvidia-smi -L | wc -l")
    assert out.strip() == "8", err


def test_containerd_1x_refuses_version_3(sim_node):
    node = sim_node("rocky-9-nogpu", engines=("containerd",))
    assert 'version = 2' in node.read("/etc/containerd/config.toml")
    node.write("/etc/containerd/config.toml", 'version = 3\n')
    rc, _, err = node.ssh("systemctl restart containerd")
    assert rc == 1 and node.unit("containerd")["active"] == "failed"


def test_systemctl(sim_node):
    node = sim_node("ubuntu-22.04-nogpu", engines=("docker",))
    assert node.ssh("systemctl is-active docker")[1:] == ("active\n", "")
    rc, out, err = node.ssh("systemctl is-enabled nvidia-fabricmanager")
    assert rc == 1 and "No such file or directory" in err
    rc, _, err = node.ssh("systemctl start nvidia-fabricmanager")
    assert rc == 5 and err == "Failed to start nvidia-fabricmanager.service: Unit nvidia-fabricmanager.service not found.\n"
    rc, out, _ = node.ssh("systemctl stop docker; systemctl is-active docker; systemctl disable docker; systemctl is-enabled docker")
    assert out == "inactive\ndisabled\n"
    rc, out, _ = node.ssh("systemctl show -p ActiveState --value docker; systemctl enable --now docker; systemctl is-active docker")
    assert out == "inactive\nactive\n"
    node.reboot()
    assert node.unit("docker")["active"] == "active"


def test_small_shims(sim_node):
    node = sim_node("ubuntu-22.04-h100x8", hostname="gpu-07")
    rc, out, _ = node.ssh("hostname; uname -n; uname -rm; uname -a | cut -d' ' -f1-3; sudo -n true && echo sudo-ok")
    assert out.splitlines() == ["gpu-07", "gpu-07", "5.15.0-91-generic x86_64", "Linux gpu-07 5.15.0-91-generic",
                                "sudo-ok"]
    rc, out, _ = node.ssh("lspci -d 10de: -nn")
    lines = out.splitlines()
    assert sum("3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]" in ln for ln in lines) == 8
    assert sum("Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3]" in ln for ln in lines) == 4
    assert node.read("/sys/bus/pci/devices/0000:18:00.0/class") == "0x030200\n"
    assert node.read("/sys/bus/pci/devices/0000:83:00.0/device") == "0x22a3\n"
    assert node.read("/proc/cmdline").startswith("BOOT_IMAGE=/vmlinuz-5.15.0-91-generic ")
    kinds = [c[0] for c in node.calls()]
    assert {"hostname", "uname", "sudo", "lspci"} <= set(kinds)
    node.clear_calls()
    assert node.calls() == []


@pytest.mark.parametrize("profile,device,klass", [("ubuntu-22.04-t4", "0x1eb8", "0x030200"),
                                                  ("ubuntu-22.04-rtx4090", "0x2684", "0x030000"),
                                                  ("rocky-9-a100x8", "0x20b2", "0x030200"),
                                                  ("ubuntu-24.04-b200x8", "0x2901", "0x030200")])
def test_gpu_sysfs(sim_node, profile, device, klass):
    node = sim_node(profile)
    gpus = [d for d in node.listdir("/sys/bus/pci/devices")
            if node.read(f"/sys/bus/pci/devices/{d}/vendor") == "0x10de\n"
            and node.read(f"/sys/bus/pci/devices/{d}/class").startswith("0x03")]
    assert gpus and all(node.read(f"/sys/bus/pci/devices/{d}/device") == device + "\n" for d in gpus)
    assert all(node.read(f"/sys/bus/pci/devices/{d}/class") == klass + "\n" for d in gpus)
    assert len(gpus) == node.profile.gpus.count


def test_distro_specifics(sim_fleet):
    nodes = sim_fleet(["ubuntu-22.04-nogpu", "ubuntu-24.04-nogpu", "debian-12-nogpu", "rocky-9-nogpu"])
    expect = {"ubuntu-22.04": ("apt-get", "update-initramfs"), "ubuntu-24.04": ("apt-get", "update-initramfs"),
              "debian-12": ("apt-get", "update-initramfs"), "rocky-9": ("dnf", "dracut")}
    for n in nodes:
        pkg, initramfs = expect[n.profile.distro]
        rc, out, _ = n.ssh(f"command -v {pkg} >/dev/null && command -v {initramfs} >/dev/null && echo ok; "
                           "for t in apt-get dnf update-initramfs dracut; do command -v $t; done | wc -l")
        assert out.splitlines() == ["ok", "2"]
        osr = (Path(__file__).parent / "data" / "os-release" / n.profile.d.os_release).read_text()
        assert n.read("/etc/os-release").rstrip("\n") == osr.rstrip("\n")


def _ctk_log(err):
    return [line.split(" ", 1)[1] for line in err.splitlines()]  # without time="..."


def test_create_dev_char_symlinks_needs_the_majors_like_real_nvidia_ctk(sim_node):
    """As the real nvidia-ctk did on a Debian 12 VM with a T4 and no driver (tests/realos): --create-all reads
    the majors from /proc/devices first and fails without nvidia's and nvidia-uvm's; without --create-all
    it reports that no device node exists."""
    node = sim_node("debian-12-t4", engines=("docker",), toolkit_version="1.20.0-1")
    lister = "failed to create symlink creator: failed to create all possible device lister: "
    rc, _, err = node.ssh("nvidia-ctk system create-dev-char-symlinks --create-all --dev-char-path=/tmp/dc")
    assert rc == 1 and _ctk_log(err) == [
        f'level=error msg="{lister}failed reading device majors: no NVIDIA devices found"']
    rc, _, err = node.ssh("nvidia-ctk system create-dev-char-symlinks --dev-char-path=/tmp/dc")
    assert rc == 0 and _ctk_log(err) == ['level=info msg="No NVIDIA devices found in /"']
    assert not node.exists("/tmp/dc")

    node = sim_node("debian-12-t4", engines=("docker",), toolkit_version="1.20.0-1", preinstalled_driver="535.129.03")
    rc, _, err = node.ssh("nvidia-ctk system create-dev-char-symlinks --create-all --dev-char-path=/tmp/dc")
    assert rc == 0 and sorted(node.listdir("/tmp/dc")) == ["195:0", "195:254", "195:255", "510:0", "510:1"]
