"""Node simulator: GPU nodes (chroots with simulated tools) behind a real OpenSSH server on 127.0.0.1.

    from tests.nodesim import SimNode, get_profile, build_fake_driver_run
    node = SimNode(get_profile("ubuntu-22.04-t4")).start()
    ...
    node.stop()

Pytest fixtures (sim_node, ...) live in tests.nodesim.fixtures.  See README.md in this directory.
"""

from tests.nodesim.driver_run import build_fake_driver_run
from tests.nodesim.node import SimNode
from tests.nodesim.profiles import DISTROS, GPU_SETS, PROFILES, Profile, get_profile
from tests.nodesim.rootfs import NodesimUnavailable, cleanup_stale, missing_requirements

__all__ = ["DISTROS", "GPU_SETS", "PROFILES", "NodesimUnavailable", "Profile", "SimNode", "build_fake_driver_run",
           "cleanup_stale", "get_profile", "missing_requirements"]
