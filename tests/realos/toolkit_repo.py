"""The local apt repository the guest installs the container toolkit from.

NVIDIA's nvidia-container-toolkit is not in Debian and cannot be fetched here, so the repository holds a
STAND-IN: the four package names the toolkit step installs (gpunode/steps/toolkit.py PACKAGES), with NVIDIA's
dependency chain, built by dpkg-deb from the node simulator's nvidia-ctk (tests/nodesim/node_files/py/
nvidia_ctk.py, checked byte for byte against real `nvidia-ctk runtime configure` runs), run by the guest's python3.
`nvidia-container-runtime` is a stand-in that hands over to runc. These are not NVIDIA's programs.

The repository lives at the path of a local mirror of NVIDIA's (…/nvidia.github.io/libnvidia-container/stable/
deb/amd64), the way an air-gapped site mirrors it, so gpunode's toolkit step recognises it as NVIDIA's.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from gpunode.steps.toolkit import PACKAGES

VERSION = "1.20.0-1"  # the nvidia-ctk line the simulator's shim reproduces
SUBDIR = "nvidia.github.io/libnvidia-container/stable/deb/amd64"
SIM_PY = Path(__file__).resolve().parents[1] / "nodesim" / "node_files" / "py"
STANDIN_DIR = "/usr/lib/gpunode-toolkit-standin"
DESCRIPTION = ("STAND-IN for NVIDIA's package, built by gpunode's real-OS tests\n"
               " from the node simulator's nvidia-ctk. Not NVIDIA software.")


def _sh(body: str) -> str:
    return "#!/bin/sh\n# STAND-IN built by gpunode's real-OS tests (tests/realos/toolkit_repo.py), not NVIDIA's.\n" + body


def _packages() -> dict[str, tuple[str, dict[str, tuple[str, int]]]]:
    """name -> (Depends, {path: (content, mode)})."""
    toolkit, base, tools, lib = PACKAGES
    upstream = VERSION.split("-")[0]
    ctk = {
        "/usr/bin/nvidia-ctk": (_sh(f'exec python3 {STANDIN_DIR}/nvidia_ctk.py {VERSION} "$@"\n'), 0o755),
        f"{STANDIN_DIR}/nvidia_ctk.py": ((SIM_PY / "nvidia_ctk.py").read_text(), 0o644),
        f"{STANDIN_DIR}/tomlw.py": ((SIM_PY / "tomlw.py").read_text(), 0o644),
        "/usr/bin/nvidia-container-runtime": (_sh('exec runc "$@"\n'), 0o755),
        "/usr/bin/nvidia-cdi-hook": (_sh("exit 0\n"), 0o755),
    }
    return {
        toolkit: (f"{base} (= {VERSION}), {tools} (>= {upstream})",
                  {"/usr/bin/nvidia-container-runtime-hook": (_sh("exit 0\n"), 0o755)}),
        base: ("python3", ctk),
        tools: (f"{lib} (>= {upstream})",
                {"/usr/bin/nvidia-container-cli": (_sh('echo "nvidia-container-cli: stand-in" >&2; exit 1\n'),
                                                   0o755)}),
        lib: ("", {f"/usr/share/doc/{lib}/README.standin": (DESCRIPTION + "\n", 0o644)}),
    }


def build(root: Path) -> Path:
    """Writes the repository under root/SUBDIR (pool of .debs, Packages, Release); returns that directory."""
    repo = root / SUBDIR
    repo.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for name, (depends, files) in _packages().items():
        tree = root / "build" / name
        for path, (content, mode) in files.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(mode)
        control = [f"Package: {name}", f"Version: {VERSION}", "Architecture: amd64",
                   "Maintainer: gpunode tests <tests@gpunode.invalid>", "Section: utils", "Priority: optional"]
        if depends:
            control.append(f"Depends: {depends}")
        control.append(f"Description: {DESCRIPTION}")
        (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
        (tree / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        deb = repo / f"{name}_{VERSION}_amd64.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)], check=True,
                       capture_output=True)
        data = deb.read_bytes()
        stanzas.append("\n".join(control[:-1] + [f"Filename: ./{deb.name}", f"Size: {len(data)}",
                                                 f"SHA256: {hashlib.sha256(data).hexdigest()}",
                                                 control[-1]]) + "\n")
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Release").write_text(
        "Origin: gpunode-tests\nLabel: toolkit stand-in\nArchitectures: amd64\nSHA256:\n"
        f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
    return repo


def apt_source(url_root: str) -> str:
    return (f"# local mirror of NVIDIA's toolkit repository (gpunode real-OS tests: STAND-IN packages)\n"
            f"deb [trusted=yes] {url_root}/{SUBDIR} /\n")
