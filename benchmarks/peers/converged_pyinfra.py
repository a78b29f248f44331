"""The checks of a converged `gpunode install`, as a pyinfra deploy (benchmarks/roundtrips.py): the blacklist
file through pyinfra's files.file (a fact, then no change), the rest as the same shell checks Ansible runs."""

from pyinfra.operations import files, server

files.file(name="nouveau blacklist present", path="/etc/modprobe.d/blacklist-nouveau.conf", present=True)
server.shell(name="packages present (compiler, dkms, container toolkit)", commands=[
    "test \"$(dpkg-query -W -f='${Status}\\n' gcc make dkms nvidia-container-toolkit | sort -u)\" = "
    "'install ok installed'"])
server.shell(name="driver loaded at the expected version", commands=[
    "test \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader)\" = 535.129.03"])
server.shell(name="docker runtime configured", commands=["grep -q nvidia-container-runtime /etc/docker/daemon.json"])
server.shell(name="services active", commands=["systemctl is-active docker.service nvidia-persistenced.service"])
