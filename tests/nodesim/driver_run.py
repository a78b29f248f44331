"""Fake NVIDIA driver installers: real makeself archives whose payload is the simulated nvidia-installer.

    path = build_fake_driver_run("535.129.03", tmp_path / "NVIDIA-Linux-x86_64-535.129.03.run")
    path = build_fake_driver_run("535.129.03", tmp_path / "bad.run", corrupt=True)   # fails `--check`

makeself 2.4.5's header rejects unknown options ("Unrecognized flag"); NVIDIA's own makeself header passes
them to nvidia-installer.  The archive's header is therefore adjusted (same number of lines, checksums only
cover the payload) so that `sh NVIDIA-...run --silent --dkms -m=kernel-open` reaches the installer, as with
the real .run files; makeself's own options (--check, --info, --list, --target, --keep, --noexec, ...) keep
working.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.nodesim.rootfs import MAKESELF, NODE_FILES, NodesimUnavailable

_UNRECOGNIZED = b'    -*)\n\techo Unrecognized flag : "$1" >&2\n\tMS_Help\n\texit 1\n\t;;\n'
_PASS_THROUGH = b'    -*)\n\tbreak\n\t;;\n    --nodesim-unused-1) :\n\t;;\n'


def build_fake_driver_run(version: str, path: str | os.PathLike[str], corrupt: bool = False) -> Path:
    """Build NVIDIA-Linux-x86_64-<version>.run-alike at `path` with makeself and return the path."""
    if not os.path.exists(MAKESELF):
        raise NodesimUnavailable(f"{MAKESELF} missing (apt-get install makeself)")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    label = f"NVIDIA Accelerated Graphics Driver for Linux-x86_64 {version}"
    with tempfile.TemporaryDirectory(prefix="nodesim-run-") as tmp:
        payload = Path(tmp) / f"NVIDIA-Linux-x86_64-{version}"
        payload.mkdir()
        shutil.copy(NODE_FILES / "installer" / "nvidia-installer", payload / "nvidia-installer")
        os.chmod(payload / "nvidia-installer", 0o755)
        (payload / ".nodesim-version").write_text(version + "\n")
        for sub in ("kernel", "kernel-open"):
            (payload / sub).mkdir()
            (payload / sub / "Makefile").write_text(f"# simulated {sub} module sources for {version}\n")
        (payload / "README.txt").write_text(f"{label}\n(simulated by tests/nodesim)\n")
        (payload / "LICENSE").write_text("simulated\n")
        res = subprocess.run([MAKESELF, "--nox11", "--noprogress", "--gzip", str(payload), str(out), label, "./nvidia-installer"],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"makeself failed: {res.stderr or res.stdout}")
    data = out.read_bytes()
    if _UNRECOGNIZED not in data:
        raise RuntimeError("unexpected makeself header: cannot make it pass installer options through")
    data = data.replace(_UNRECOGNIZED, _PASS_THROUGH, 1)
    if corrupt:
        # flip bytes in the middle of the compressed payload: MD5/CRC checks fail
        header_end = data.index(b"\n", data.index(b"eval $finish; exit $res")) + 1
        mid = header_end + (len(data) - header_end) // 2
        data = data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 16]) + data[mid + 16:]
    out.write_bytes(data)
    os.chmod(out, 0o755)
    return out
