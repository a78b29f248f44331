"""Fixtures of the real-OS tier (tests/realos/README.md): one Debian 12 VM per test session, shared by the
scenario tests in order; every gpunode command runs as a real process against it over real ssh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.realos import toolkit_repo
from tests.realos.chroot import ChrootNode
from tests.realos.mirror import MirrorServer
from tests.realos.vm import HOST_ALIAS, Vm, cache_root, ensure_image, missing_requirements
from tests.stage_times import STAGE_TIMES

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMINGS = STAGE_TIMES  # the stage table (tests/stage_times.py), printed by tests/conftest.py


@dataclass
class Run:
    argv: list[str]
    rc: int
    out: str
    err: str
    seconds: float

    def json(self) -> object:
        return json.loads(self.out)


@dataclass
class Realos:
    vm: Vm | ChrootNode
    mirror: MirrorServer
    workdir: Path
    runs: list[Run] = field(default_factory=list)
    variant: str = "base"  # the image it boots (vm.VARIANT_FILES)
    label: str = ""  # the prefix of its stages in the timing table

    def gpunode(self, *args: str, timeout: float = 2400, stage: str | None = None) -> Run:
        """`gpunode ARGS --host realos --ssh-config FILE` as a real process, its time recorded under `stage`.
        A traceback on its stderr fails the test whatever the exit code."""
        argv = [sys.executable, "-m", "gpunode", *args, "--host", HOST_ALIAS, "--ssh-config", str(self.vm.ssh_config)]
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), COLUMNS="200", NO_COLOR="1")
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.workdir, env=env,
                              stdin=subprocess.DEVNULL)
        run = Run(argv[3:], done.returncode, done.stdout, done.stderr, time.monotonic() - started)
        self.runs.append(run)
        if stage:
            self.stage(stage, run.seconds)
        assert "Traceback" not in run.err, f"traceback on stderr of gpunode {' '.join(args)}:\n{run.err}"
        return run

    def ssh(self, command: str, timeout: float = 900):
        return self.vm.ssh(command, timeout=timeout, check=True).out

    def stage(self, name: str, seconds: float) -> None:
        TIMINGS[name] = round(seconds, 1)


def _unavailable() -> str | None:
    if os.environ.get("GPUNODE_REALOS") == "0":
        return "GPUNODE_REALOS=0: real-OS tier switched off"
    return missing_requirements()


@contextmanager
def _vm(variant: str, label: str) -> Iterator[Realos]:
    """A VM of image `variant` with the mirror relay, stopped (and its files removed) when the block ends;
    GPUNODE_REALOS_KEEP=1 leaves it up. `label` prefixes its stages in the timing table."""
    why = _unavailable()
    keep = os.environ.get("GPUNODE_REALOS_KEEP") == "1"
    if why:
        if os.environ.get("GPUNODE_REQUIRE_REALOS") == "1":
            pytest.fail(f"GPUNODE_REQUIRE_REALOS=1 but the real-OS tier cannot run: {why}")
        pytest.skip(why)
    started = time.monotonic()
    image = ensure_image(variant=variant)
    TIMINGS[f"{label}image (build or cache)"] = round(time.monotonic() - started, 1)
    # not pytest's tmp_path: its basetemp rotation (shared by every pytest run of this user) could remove the
    # VM's disk overlay while it runs
    work = Path(tempfile.mkdtemp(prefix="gpunode-realos."))
    served = work / "served"
    toolkit_repo.build(served)
    mirror = MirrorServer(served, cache_root() / "apt").start()
    vm = Vm(image, work / "vm", mirror)
    try:
        vm.start()
        TIMINGS[f"{label}boot to ssh"] = round(vm.timings["boot to ssh"], 1)
        TIMINGS[f"{label}boot finished (systemd)"] = round(vm.timings["boot finished (systemd)"], 1)
        yield Realos(vm, mirror, work, variant=variant, label=label)
    finally:
        if keep and vm.alive():
            print(f"\nGPUNODE_REALOS_KEEP=1: the VM stays up (QEMU pid {vm.proc.pid if vm.proc else '?'}): "
                  f"ssh -F {vm.ssh_config} {HOST_ALIAS}   (the mirror forward ended with pytest)")
        else:
            vm.stop()
            shutil.rmtree(work, ignore_errors=True)
        mirror.stop()


@pytest.fixture(scope="session")
def realos() -> Iterator[Realos]:
    with _vm("base", "") as node:
        yield node


# One VM per image: the proprietary modules (image "nvidia"), then the open ones (image "nvidia-open", derived from
# the nvidia image's tree: bookworm's open modules build only for the kernel of bookworm's point release, which that
# image boots once; its second kernel's failed DKMS build and the nvcc-built CUDA program are there too).
@pytest.fixture(scope="module", params=["nvidia", "nvidia-open"])
def realnv(request) -> Iterator[Realos]:  # type: ignore[no-untyped-def]
    """A VM with Debian's packaged NVIDIA driver and no GPU, up only while its test module runs for it (one per
    param: the image with that flavour of the kernel modules)."""
    with _vm(request.param, f"{request.param} VM: ") as node:
        yield node


@pytest.fixture(scope="module")
def realpkg() -> Iterator[Realos]:
    """A fresh VM of the nvidia image for `--driver-source packages` (test_debian12_packages.py): up only while
    its test module runs."""
    with _vm("nvidia", "packages VM: ") as node:
        yield node


@pytest.fixture(scope="module")
def realchroot() -> Iterator[Realos]:
    """The chroot node (chroot.py): the nvidia image's tree, unpacked, in namespaces of its own, at native speed,
    for what needs real DKMS builds (test_debian12_packages_upgrade.py). Up only while its test module runs;
    stopped by its holder's PID at the end, on Ctrl-C, and on SIGTERM (turned into KeyboardInterrupt here)."""
    why = _unavailable()
    if why is None and (shutil.which("nsenter") is None or shutil.which("ip") is None):
        why = "missing nsenter or ip: apt-get install util-linux iproute2"
    if why:
        if os.environ.get("GPUNODE_REQUIRE_REALOS") == "1":
            pytest.fail(f"GPUNODE_REQUIRE_REALOS=1 but the real-OS tier cannot run: {why}")
        pytest.skip(why)
    label = "chroot node: "
    started = time.monotonic()
    image = ensure_image(variant="nvidia")
    TIMINGS[f"{label}image (build or cache)"] = round(time.monotonic() - started, 1)
    node = ChrootNode(image / "tree.tar.zst", 0)
    mirror = MirrorServer(node.workdir / "empty", cache_root() / "apt").start()
    node.mirror_port = mirror.port

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        node.start()
        TIMINGS[f"{label}tree unpacked, namespaces up"] = round(node.timings["tree unpacked and mounted"], 1)
        yield Realos(node, mirror, node.workdir, variant="nvidia", label=label)
    finally:
        try:
            node.stop()
        finally:
            mirror.stop()
            signal.signal(signal.SIGTERM, previous)
