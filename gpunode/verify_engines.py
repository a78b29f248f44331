"""The engines `gpunode verify` drives and how long each container may take by default. Kept apart from
gpunode/verify.py, which imports the probe, compat and explain, so that `gpunode verify --help` (which shows
both) loads none of them."""

from __future__ import annotations

ENGINES = ("docker", "containerd", "podman")
DEFAULT_TIMEOUT = 900.0  # a first pull of a CUDA image on a slow link
