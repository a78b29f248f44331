# Node-simulator fixtures (sim_node, host_guard) for the connection tests that need a real sshd.
from tests.nodesim.fixtures import *  # noqa: F401,F403
