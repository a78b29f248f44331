# Node-simulator fixtures (sim_node, sim_fleet, fake_driver_run, host_guard) for every integration test.
from tests.nodesim.fixtures import *  # noqa: F401,F403
