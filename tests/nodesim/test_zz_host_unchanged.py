"""Runs last in this directory: the machine the tests run on is as it was when the session started."""

from __future__ import annotations

import os

import pytest

from tests.nodesim import rootfs
from tests.nodesim.fixtures import host_snapshot

pytestmark = pytest.mark.integration


def test_host_modprobe_d_and_package_database_unchanged(host_guard):
    now = host_snapshot()
    assert now == host_guard
    assert any(k.startswith("/etc/modprobe.d") for k in now) or now.get("/etc/modprobe.d") == "absent"
    assert "/var/lib/dpkg/status" in now


def test_no_node_left_behind(nodesim_available):
    mine = [d for d in os.listdir(rootfs.BASE) if d.startswith(f"node-{os.getpid()}-")]
    assert mine == []
    for d in os.listdir(rootfs.BASE):
        assert d.startswith(("node-", "tpl-"))
