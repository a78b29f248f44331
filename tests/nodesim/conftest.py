# The simulator's own tests use its fixtures; tests/conftest.py may import them too (harmless duplicate).
from tests.nodesim.fixtures import *  # noqa: F401,F403
