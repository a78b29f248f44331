"""Ctrl-C on a fleet of simulated nodes (real sshd): the fleet runner with work that, like the runner with its
hook, checks gpunode.cancel between steps. The interrupt is delivered to this test's own main thread."""

import _thread
import threading
import time

import pytest

from gpunode import cancel
from gpunode.connection.ssh import SSHConnection, SSHOptions
from gpunode.fleet import HostResult, run_fleet
from gpunode.inventory import InventoryHost


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)


class InterruptOnceRunning:
    """on_event hook: once gpu-0 and gpu-1 are both inside their first step, Ctrl-C after each delay."""

    def __init__(self, *delays):
        self.delays, self.timers, self.running = delays, [], set()

    def __call__(self, event):
        kind, host, payload = event
        if kind == "action":
            self.running.add(host)
        if not self.timers and {"gpu-0", "gpu-1"} <= self.running:
            self.timers = [threading.Timer(d, _thread.interrupt_main) for d in self.delays]
            for timer in self.timers:
                timer.start()

    def join(self):
        for timer in self.timers:
            timer.join()


def fleet_of(sim_fleet, count):
    nodes = sim_fleet(["ubuntu-22.04-nogpu"] * count)
    return nodes, [InventoryHost(f"gpu-{i}") for i in range(count)]


def step_work(nodes, hosts, step_seconds, steps):
    by_name = {h.name: n for h, n in zip(hosts, nodes, strict=True)}

    def work(host, reporter, log):
        node = by_name[host.name]
        options = SSHOptions(identity=[str(node.key_path)], known_hosts=[str(node.known_hosts)])
        with SSHConnection(f"root@127.0.0.1:{node.port}", options) as conn:
            for i in range(steps):
                cancel.checkpoint(f"step s{i}")
                reporter.events.put(("action", host.name, (f"s{i}", "start", "touch")))
                conn.run(["sh", "-c", f"sleep {step_seconds}; echo {i} >> /root/steps"]).check()
        return HostResult(host.name, "changed")

    return work


def steps_done(node):
    return node.read("/root/steps").split() if node.exists("/root/steps") else []


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_first_ctrl_c_finishes_the_running_step_and_starts_nothing_new(sim_fleet):
    nodes, hosts = fleet_of(sim_fleet, 3)
    ctrl_c = InterruptOnceRunning(0.3)
    results = run_fleet(hosts, step_work(nodes, hosts, 1.5, 5), parallel=2, on_event=ctrl_c)
    ctrl_c.join()
    assert results.interrupted and not results.aborted
    assert [r.status for r in results] == ["interrupted", "interrupted", "skipped"]
    assert results[0].error.startswith("stopped before step s1")
    # The step in flight at the interrupt completed on the node; nothing after it started.
    assert steps_done(nodes[0]) == ["0"] and steps_done(nodes[1]) == ["0"] and steps_done(nodes[2]) == []


@pytest.mark.usefixtures("cli_owns_signals")  # gpunode's own handler (tests/conftest.py)
def test_second_ctrl_c_abandons_the_remote_commands_at_once(sim_fleet):
    nodes, hosts = fleet_of(sim_fleet, 3)
    ctrl_c = InterruptOnceRunning(0.3, 0.8)
    started = time.monotonic()
    results = run_fleet(hosts, step_work(nodes, hosts, 30, 1), parallel=2, on_event=ctrl_c)
    ctrl_c.join()
    assert time.monotonic() - started < 10  # not the 30 s the commands would take
    assert results.aborted and results.maybe_mid_step == ["gpu-0", "gpu-1"]
    assert [r.status for r in results] == ["interrupted", "interrupted", "skipped"]
    assert "the node may be in the middle of a step" in results[0].error
    assert steps_done(nodes[2]) == []
