"""Node-simulator nodes for the benchmarks: started in parallel, counted channels from sshd's log, stopped by
PID (SimNode.stop kills sshd, its sessions and every process inside the chroot, by PID)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.nodesim.node import SimNode  # noqa: E402
from tests.nodesim.profiles import get_profile  # noqa: E402

# An already-provisioned node needs the driver and the toolkit; the first `install` adds the rest (the nouveau
# blacklist, gcc/make/dkms, the docker runtime, persistenced), after which every run is a converged run.
DRIVER = "535.129.03"
PROVISIONED = {"preinstalled_driver": DRIVER, "toolkit_version": "1.17.8-1"}
CHANNEL_LINE = "server_input_channel_open: ctype session"


def start(count: int, *, log_level: str = "INFO", workers: int = 8, prefix: str = "bench") -> list[SimNode]:
    nodes = [SimNode(get_profile("ubuntu-22.04-t4", **PROVISIONED), name=f"{prefix}-{i}", sshd_log_level=log_level)
             for i in range(count)]
    started: list[SimNode] = []
    try:
        with ThreadPoolExecutor(workers) as pool:
            for node in pool.map(lambda n: n.start(), nodes):
                started.append(node)
    except BaseException:
        stop(nodes)
        raise
    return nodes


def stop(nodes: list[SimNode]) -> None:
    for node in nodes:
        try:
            node.stop()
        except Exception as exc:  # noqa: BLE001 - keep stopping the others
            print(f"warning: stopping {node.name}: {exc}", file=sys.stderr)


def channels(node: SimNode) -> int:
    """SSH session channels this node's sshd has opened so far (sshd logs them at DEBUG1)."""
    return Path(node.sshd_log).read_text(errors="replace").count(CHANNEL_LINE)


def gpunode_bin() -> str:
    return str(Path(sys.executable).parent / "gpunode")


def inventory(nodes: list[SimNode], directory: Path) -> tuple[Path, Path]:
    """An Ansible INI inventory (gpunode reads it too) and one known_hosts file for every node."""
    inv, known = directory / "inventory.ini", directory / "known_hosts"
    inv.write_text("[gpu]\n" + "".join(
        f"{n.name} ansible_host=127.0.0.1 ansible_port={n.port} ansible_user=root "
        f"ansible_ssh_private_key_file={n.key_path}\n" for n in nodes))
    known.write_text("".join(Path(n.known_hosts).read_text() for n in nodes))
    return inv, known


def converge(nodes: list[SimNode], directory: Path, parallel: int = 50) -> None:
    """The first install on fresh nodes; afterwards they are converged (checked: a second run changes nothing)."""
    inv, known = inventory(nodes, directory)
    result = subprocess.run([gpunode_bin(), "install", "--inventory", str(inv), "--known-hosts", str(known),
                             "--driver", DRIVER, "--reboot", "--parallel", str(parallel),
                             "--cache-dir", str(directory / "cache"), "--log-dir", str(directory / "logs-converge")],
                            capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"converging {len(nodes)} nodes failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
