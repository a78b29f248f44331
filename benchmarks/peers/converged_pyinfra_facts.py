"""The checks of a converged `gpunode install` as pyinfra facts, for the real-OS VM (benchmarks/realvm.py):
read only, and nothing fails on a node that is not provisioned (each fact is gathered and left to the reader)."""

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FindInFile
from pyinfra.facts.server import Command
from pyinfra.facts.systemd import SystemdStatus

host.get_fact(File, path="/etc/modprobe.d/blacklist-nouveau.conf")
host.get_fact(DebPackages)
host.get_fact(Command, command="nvidia-smi --query-gpu=driver_version --format=csv,noheader || true")
host.get_fact(FindInFile, path="/etc/docker/daemon.json", pattern="nvidia-container-runtime")
host.get_fact(SystemdStatus)
