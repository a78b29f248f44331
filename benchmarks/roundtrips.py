"""Round trips and the converged install, on one already-provisioned node, directly and through the delay relay.

SSH channels are counted from the node's sshd log (LogLevel DEBUG1 records each channel a client opens); the
reference is `ssh node true` (OpenSSH: one channel). Since every command goes over one channel, what costs time
on a slow link is the number of COMMANDS sent on it (each waits for its answer: a round trip), counted by a
converged install run in this process on a connection that names each command it sends, and the round trips of
the whole session (login included), counted by the relay (relay.turns) for gpunode and for the lower bound alike.
Ansible and pyinfra run the equivalent checks of a converged install (see docs/benchmarks.md for what exactly,
and how far the equivalence goes)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

from benchmarks.measure import Row, median_time, run, secs
from benchmarks.nodes import DRIVER, channels, gpunode_bin
from benchmarks.probe import MINIMAL
from benchmarks.relay import DelayRelay
from gpunode import api
from gpunode.connection.base import Held
from gpunode.connection.ssh import SSHConnection, SSHOptions
from tests.nodesim.node import SimNode

TOOLS = Path(__file__).resolve().parent / "peers"
CHANNEL_TARGET = {"doctor": 1, "plan": 1, "install": 1}
LOWER_TARGET = 1.5
COMMAND_TARGET = 2  # the lock taken with the probe in one command, and its release (docs/benchmarks.md)


class Link:
    """How to reach the node: directly, or through a relay (its own port, same host key)."""

    def __init__(self, node: SimNode, work: Path, port: int) -> None:
        self.node, self.port = node, port
        self.known_hosts = work / f"known_hosts-{port}"
        key = " ".join(Path(node.known_hosts).read_text().split()[1:3])
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {key}\n")
        self.work = work

    def gpunode(self, command: str) -> list[str]:
        extra = ["--driver", DRIVER, "--cache-dir", str(self.work / "cache")] if command in ("plan", "install") else []
        return [gpunode_bin(), command, "--host", f"root@127.0.0.1:{self.port}", "--identity", self.node.key_path,
                "--known-hosts", str(self.known_hosts), *extra]

    def ssh_true(self, command: str = "true") -> list[str]:
        return ["ssh", "-p", str(self.port), "-i", self.node.key_path, "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ControlMaster=no",
                "-o", "ControlPath=none", "root@127.0.0.1", command]

    def ansible(self) -> list[str] | None:
        playbook = shutil.which("ansible-playbook", path=str(ROOT_VENV / "bin"))
        if not playbook:
            return None
        inv = self.work / f"ansible-{self.port}.ini"
        inv.write_text(
            "[gpu]\nnode ansible_host=127.0.0.1 ansible_port={port} ansible_user=root "
            "ansible_ssh_private_key_file={key} ansible_python_interpreter=/opt/nodesim/python/bin/python3\n"
            "[gpu:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes "
            "-o ControlMaster=auto -o ControlPersist=60s -o ControlPath={cp}'\n"
            .format(port=self.port, key=self.node.key_path, kh=self.known_hosts, cp=self.work / "cm-%C"))
        return [playbook, "-i", str(inv), str(TOOLS / "converged.yml")]

    def pyinfra(self) -> list[str] | None:
        tool = shutil.which("pyinfra", path=str(ROOT_VENV / "bin"))
        if not tool:
            return None
        inv = self.work / f"pyinfra_inventory_{self.port}.py"
        inv.write_text(f"gpu = [('127.0.0.1', {{'ssh_port': {self.port}, 'ssh_user': 'root', "
                       f"'ssh_key': {self.node.key_path!r}, 'ssh_known_hosts_file': {str(self.known_hosts)!r}, "
                       "'ssh_strict_host_key_checking': 'yes'})]\n")
        return [tool, "-y", str(inv), str(TOOLS / "converged_pyinfra.py")]


class CountingConnection(SSHConnection):
    """An SSH connection that keeps the name of every command it sends, in order (each one round trip on the
    command channel; a keeper command held open counts as one too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        self.sent.append(command_name(line))
        return super()._exec(line, stdin, timeout)

    def _hold(self, line: str, stdin: bytes, until: bytes, timeout: float) -> Held | None:
        self.sent.append(command_name(line) + " (held)")
        return super()._hold(line, stdin, until, timeout)


def command_name(line: str) -> str:
    """A rendered command line's script name (`sh -c BODY gpunode-NAME ...`), else its program."""
    if line.startswith('[ "$(id -u)" = 0 ]'):  # the root check the first privileged command carries
        line = line.split("}; ", 1)[1]
    words = shlex.split(line)
    if "-c" in words and len(words) > words.index("-c") + 2:
        return words[words.index("-c") + 2].removeprefix("gpunode-")
    return next((w for w in words if w not in ("sudo", "env") and "=" not in w and not w.startswith("-")), "?")


def converged_commands(link: Link) -> list[str]:
    """The commands a converged install sends, by name, in order (run in this process: the same code path as the
    CLI's `install`, on a connection that counts)."""
    options = SSHOptions(identity=[link.node.key_path], known_hosts=[str(link.known_hosts)])
    with CountingConnection(f"root@127.0.0.1:{link.port}", options).connect(defer_checks=True) as conn:
        result = api.install(conn, api.request({"driver": DRIVER, "cache_dir": str(link.work / "cache")}))
        assert result.report.exit_code == 0 and not result.changed, result.report.to_dict()
        return conn.sent


ROOT_VENV = Path(__file__).resolve().parent.parent / ".venv-bench"
ANSIBLE_ENV = {"ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_PIPELINING": "True", "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_LOCAL_TEMP": "", "ANSIBLE_CONFIG": ""}


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update({k: v for k, v in extra.items() if v})
    env["PATH"] = f"{ROOT_VENV / 'bin'}:{env.get('PATH', '')}"
    return env


def bench(node: SimNode, work: Path, repeat: int, latency: bool) -> list[Row]:
    rows: list[Row] = []
    run([*Link(node, work, node.port).gpunode("install"), "--reboot"], timeout=600)  # converge it
    links = [("direct", node.port)]
    relay = DelayRelay(node.port, delay=0.05, lifetime=900) if latency else None
    if relay:
        links.append(("+50 ms each way", relay.port))
    try:
        for label, port in links:
            link = Link(node, work, port)
            before = channels(node)
            run(link.ssh_true())
            ref_channels = channels(node) - before
            ref_time = median_time(lambda link=link: run(link.ssh_true()), repeat)
            # the lower bound of a converged check: one ssh running a script that reads only what it needs
            lower = median_time(lambda link=link: run(link.ssh_true(MINIMAL)), repeat)
            times = {}
            for command in ("doctor", "plan", "install"):
                before = channels(node)
                run(link.gpunode(command), ok=(0, 1))
                used = channels(node) - before
                if label == "direct":
                    target = CHANNEL_TARGET[command]
                    rows.append(Row("round trips", f"{command}{' (converged)' if command == 'install' else ''}: "
                                    "SSH channels", str(used), f"ssh true: {ref_channels}",
                                    used / ref_channels, f"<= {target}", used <= target))
                if label == "direct" and command == "install":
                    sent = converged_commands(link)
                    rows.append(Row("round trips", "install (converged): commands sent on it", f"{len(sent)} ("
                                    + ", ".join(sent) + ")", "ssh + minimal script: 1", len(sent),
                                    f"<= {COMMAND_TARGET}", len(sent) <= COMMAND_TARGET))
                if relay is not None and port == relay.port and command == "install":
                    relay.mark()
                    run(link.ssh_true(MINIMAL))
                    lower_turns = relay.turns()
                    relay.mark()
                    run(link.gpunode(command), ok=(0, 1))
                    ours = relay.turns()
                    rows.append(Row("round trips", f"install (converged): round trips of the session, {label}",
                                    str(ours), f"ssh + minimal script: {lower_turns}", ours / lower_turns,
                                    f"<= {lower_turns}", ours <= lower_turns))
                took = median_time(lambda link=link, command=command: run(link.gpunode(command), ok=(0, 1)), repeat)
                times[command] = took
                rows.append(Row("round trips", f"{command} wall time, {label}", secs(took),
                                f"ssh true {secs(ref_time)}", took / ref_time))
            rows.append(Row("round trips", f"converged install vs the lower bound, {label}", secs(times["install"]),
                            f"ssh + minimal script {secs(lower)}", times["install"] / lower, f"<= {LOWER_TARGET}x",
                            times["install"] / lower <= LOWER_TARGET))
            rows += _versus(link, label, times["install"], repeat)
    finally:
        if relay:
            relay.stop()
    return rows


def _versus(link: Link, label: str, ours: float, repeat: int) -> list[Row]:
    rows = []
    for name, argv, env, target in (("ansible-playbook", link.ansible(), ANSIBLE_ENV, 0.3),
                                     ("pyinfra", link.pyinfra(), {}, 0.5)):
        if argv is None:
            rows.append(Row("vs others", f"converged install vs {name}, {label}", "not installed",
                            "pip install -e '.[bench]'", None, f"<= {target}x"))
            continue
        run(argv, env=_env(env), cwd=str(link.work))  # once, and it must pass: every check holds on the node
        theirs = median_time(lambda argv=argv, env=env: run(argv, env=_env(env), cwd=str(link.work)), repeat)
        rows.append(Row("vs others", f"converged install vs {name}, {label}", secs(ours),
                        f"{name} {secs(theirs)}", ours / theirs, f"<= {target}x", ours / theirs <= target))
    return rows
