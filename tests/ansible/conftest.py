"""Running real ansible-playbook against node-simulator nodes, with the collection from this worktree.

Everything Ansible writes stays under the test's own directories (its config, temp and control-socket dirs,
HOME); host keys are checked against the nodes' known_hosts. The playbook's results come back as JSON lines
from a test callback (plugins/callback/record.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.nodesim.fixtures import *  # noqa: F401,F403 - sim_node, sim_fleet, host_guard
from tests.nodesim.node import SimNode

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "ansible_collections" / "gpunode" / "gpu"
BIN = Path(sys.executable).parent
# the private interpreter of simulated nodes (tests/nodesim/README.md): only ansible.builtin.reboot needs Python on
# the node (it runs the setup and find modules); gpunode's modules never do
NODE_PYTHON = "/opt/nodesim/python/bin/python3"


def ansible_tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' installs ansible-core)")
    return str(path)


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    records: list[dict]
    seconds: float = 0.0

    def results(self, action: str = "gpunode.gpu.node", task: str | None = None) -> dict[str, dict]:
        """host -> the last result of that action (or that task name)."""
        found: dict[str, dict] = {}
        for r in self.records:
            if (task is None and r["action"] == action) or r["task"] == task:
                found[r["host"]] = {**r["result"], "_status": r["status"]}
        return found

    def all(self, action: str = "gpunode.gpu.node") -> list[dict]:
        return [{**r["result"], "_host": r["host"], "_status": r["status"]} for r in self.records
                if r["action"] == action]


class Ansible:
    """One Ansible set-up: config, inventory of simulated nodes, and ansible-playbook runs."""

    def __init__(self, work: Path, short: Path) -> None:
        self.work = work
        (work / "home").mkdir()
        (work / "tmp").mkdir()
        self.config = work / "ansible.cfg"
        self.config.write_text(
            "[defaults]\n"
            "host_key_checking = True\n"
            "retry_files_enabled = False\n"
            "gathering = explicit\n"
            "interpreter_python = auto_silent\n"
            "forks = 10\n"
            f"local_tmp = {work / 'tmp'}\n"
            "nocolor = True\n"
            "[ssh_connection]\n"
            f"control_path_dir = {short}\n"
            "pipelining = True\n")
        self.inventory = work / "hosts.ini"
        self.known_hosts = work / "known_hosts"
        self.env = {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(work / "home"),
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(self.config),
            "ANSIBLE_COLLECTIONS_PATH": str(ROOT),
            "ANSIBLE_CALLBACK_PLUGINS": str(Path(__file__).parent / "plugins" / "callback"),
            "ANSIBLE_CALLBACKS_ENABLED": "record",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PYTHONPATH": str(ROOT),  # the worktree's gpunode on the controller
            "GPUNODE_CACHE_DIR": str(work / "cache"),
        }
        self.runs = 0
        self.nodes: list[SimNode] = []

    def hosts(self, nodes: list[SimNode], names: list[str] | None = None, extra: dict[str, str] | None = None) -> Path:
        """An INI inventory (gpunode's fleet mode reads the same file) and the nodes' known_hosts."""
        self.nodes = list(nodes)
        names = names or [f"gpu-{i:02d}" for i in range(len(nodes))]
        self.known_hosts.write_text("".join(Path(n.known_hosts).read_text() for n in nodes))
        lines = ["[gpu]"]
        for name, n in zip(names, nodes, strict=True):
            more = " ".join(f"{k}={v}" for k, v in (extra or {}).get(name, {}).items())  # type: ignore[union-attr]
            lines.append(f"{name} ansible_host=127.0.0.1 ansible_port={n.port} ansible_user=root "
                         f"ansible_ssh_private_key_file={n.key_path} {more}".rstrip())
        lines += ["", "[gpu:vars]",
                  f"ansible_ssh_common_args='-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes'",
                  f"ansible_python_interpreter={NODE_PYTHON}"]
        self.inventory.write_text("\n".join(lines) + "\n")
        return self.inventory

    def playbook(self, playbook: str | Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> Run:
        self.runs += 1
        record = self.work / f"record-{self.runs}.jsonl"
        record.touch()
        if isinstance(playbook, str):
            path = self.work / f"play-{self.runs}.yml"
            path.write_text(playbook)
            playbook = path
        started = time.monotonic()
        try:
            proc = subprocess.run([ansible_tool("ansible-playbook"), "-i", str(self.inventory), str(playbook), *args],
                                  env={**self.env, **(env or {}), "GPUNODE_TEST_RECORD": str(record)}, cwd=self.work,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
            raise AssertionError(f"ansible-playbook did not finish in {timeout:.0f}s; its output ends:\n{out[-2000:]}\n"
                                 + "\n".join(n.diagnose() for n in self.nodes)) from None
        records = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
        return Run(proc.returncode, proc.stdout, proc.stderr, records, time.monotonic() - started)


@pytest.fixture
def ansible(tmp_path: Path) -> Iterator[Ansible]:
    ansible_tool("ansible-playbook")
    short = Path(tempfile.mkdtemp(prefix="gpa-"))  # ssh control sockets: a short path (108-byte limit)
    try:
        yield Ansible(tmp_path, short)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def node_play(options: str = "{}", become: bool = False) -> str:
    """A play that runs gpunode.gpu.node on every host with these options (a YAML flow mapping)."""
    return (f"- hosts: gpu\n  gather_facts: false\n  become: {str(become).lower()}\n  tasks:\n"
            f"    - name: gpunode\n      gpunode.gpu.node: {options}\n")
