"""Pytest fixtures for the node simulator.  Use from any conftest with `from tests.nodesim.fixtures import *`.

    def test_something(sim_node):
        node = sim_node("ubuntu-22.04-t4", secure_boot=True)
        rc, out, err = node.ssh("mokutil --sb-state")

When sshd, busybox or makeself are missing the fixtures skip with the reason, unless GPUNODE_REQUIRE_NODESIM=1
(CI), where they fail.  Every node a test creates is stopped (by PID) and removed at the end of that test.
`host_guard` (session, autouse) checks that the suite left the machine's own /etc/modprobe.d and package
database unchanged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.nodesim.driver_run import build_fake_driver_run
from tests.nodesim.node import SimNode
from tests.nodesim.profiles import get_profile
from tests.nodesim.rootfs import NodesimUnavailable, missing_requirements, template

__all__ = ["fake_driver_run", "host_guard", "nodesim_available", "sim_fleet", "sim_node"]

_HOST_WATCHED = ("/etc/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d", "/run/modprobe.d")
_HOST_FILES = ("/var/lib/dpkg/status", "/etc/passwd", "/etc/group", "/etc/shadow")


def _require() -> None:
    reasons = missing_requirements()
    if not reasons:
        try:
            template()
            return
        except NodesimUnavailable as err:
            reasons = [str(err)]
    msg = "node simulator unavailable: " + "; ".join(reasons)
    if os.environ.get("GPUNODE_REQUIRE_NODESIM") == "1":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def host_snapshot() -> dict[str, str]:
    """Digest of what the simulator must never change on the machine it runs on."""
    snap: dict[str, str] = {}
    for d in _HOST_WATCHED:
        p = Path(d)
        if not p.is_dir():
            snap[d] = "absent"
            continue
        for f in sorted(p.iterdir()):
            try:
                snap[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "dir"
            except OSError:
                snap[str(f)] = "unreadable"
    for f in _HOST_FILES:
        try:
            snap[f] = hashlib.sha256(Path(f).read_bytes()).hexdigest()
        except OSError:
            snap[f] = "absent"
    try:
        with open("/proc/modules", encoding="utf-8") as fh:
            snap["/proc/modules"] = ",".join(sorted(line.split()[0] for line in fh if line.strip()))
    except OSError:
        snap["/proc/modules"] = "absent"
    return snap


@pytest.fixture(scope="session", autouse=True)
def host_guard() -> Iterator[dict[str, str]]:
    before = host_snapshot()
    yield before
    after = host_snapshot()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"the test session changed the host: {changed}"


@pytest.fixture(scope="session")
def nodesim_available() -> bool:
    _require()
    return True


@pytest.fixture
def sim_node(nodesim_available: bool) -> Iterator[Callable[..., SimNode]]:
    """Factory: sim_node(profile_name, **overrides) -> started SimNode, stopped at test end."""
    nodes: list[SimNode] = []

    def make(profile_name: str = "ubuntu-22.04-t4", *, name: str | None = None, sshd_log_level: str = "INFO",
             **overrides) -> SimNode:
        node = SimNode(get_profile(profile_name, **overrides), name=name, sshd_log_level=sshd_log_level)
        nodes.append(node)
        return node.start()

    yield make
    _stop_and_report(nodes)


def _stop_and_report(nodes: list[SimNode]) -> None:
    """Stop the test's nodes; a node the host side failed (a reboot that did not come back) fails the test."""
    faults = [f"{n}: {f}" for n in nodes for f in n.faults]
    for n in reversed(nodes):
        n.stop()
    if faults:
        pytest.fail("the node simulator failed a node: " + "; ".join(faults), pytrace=False)


@pytest.fixture
def sim_fleet(nodesim_available: bool) -> Iterator[Callable[..., list[SimNode]]]:
    """Factory: sim_fleet([(profile_name, overrides), ...] or [profile_name, ...]) -> started nodes (in parallel)."""
    nodes: list[SimNode] = []

    def make(specs, workers: int = 8) -> list[SimNode]:
        made = []
        for spec in specs:
            name, overrides = (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
            made.append(SimNode(get_profile(name, **overrides), name=f"{name}-{len(nodes) + len(made)}"))
        nodes.extend(made)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda n: n.start(), made))
        return made

    yield make
    _stop_and_report(nodes)


@pytest.fixture
def fake_driver_run(tmp_path: Path, nodesim_available: bool) -> Callable[..., Path]:
    """Factory: fake_driver_run(version, corrupt=False) -> path of a makeself .run on the host."""

    def make(version: str = "535.129.03", corrupt: bool = False) -> Path:
        suffix = "-corrupt" if corrupt else ""
        return build_fake_driver_run(version, tmp_path / f"NVIDIA-Linux-x86_64-{version}{suffix}.run", corrupt=corrupt)

    return make
