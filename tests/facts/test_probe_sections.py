"""Sections of the RUN probe rewritten to start fewer processes on the node (issue 25, round 4) print what they
printed before, or their parser reads both: each is run here under dash, bash and busybox against the snippet it
replaced (kept below as the reference) with real tools where this machine has them (dpkg-query reads a database
made here, perl asks a socket served here), alone and with the probe's value asked once (registry.SHARED)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from gpunode.facts import containers, fabric, holders, packages, registry, system
from gpunode.facts import driver as driver_facts
from gpunode.facts.containers import LoadedRuntimes, parse_docker_loaded
from gpunode.facts.probe import in_shell
from gpunode.facts.registry import Section

SHELLS = [[shutil.which(s[0]) or "", *s[1:]] for s in (["dash"], ["bash", "--posix"], ["busybox", "sh"])
          if shutil.which(s[0])]  # by absolute path: the tests hand the shells a PATH of their own
REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "docker-info"

# the snippets these sections had before (the reference they must print like)
OLD_PKG_STATUS = ("dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 'nvidia*' 'libnvidia*' "
                  "'cuda-drivers*' 'libcuda1' 'firmware-nvidia-gsp' 'linux-modules-nvidia*' 2>/dev/null; true")
OLD_DRIVER_PACKAGES = ("dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n' 'nvidia*' 'libnvidia*' "
                       "'linux-modules-nvidia*' 'linux-objects-nvidia*' 'cuda-drivers*' libcuda1 'firmware-nvidia*' "
                       "2>/dev/null | sed -n \"s/^[hi]i  //p\"; true")


def old_units(units: tuple[str, ...]) -> str:
    return (f"systemctl show -p Id -p ActiveState -p UnitFileState {' '.join(units)} 2>/dev/null | "
            f"awk -v units={shlex.quote(' '.join(units))} 'BEGIN {{ n = split(units, u, \" \") }} "
            "/^Id=/ { i++ } /^ActiveState=/ { a[i] = substr($0, 13) } /^UnitFileState=/ { e[i] = substr($0, 15) } "
            "END { for (k = 1; k <= n; k++) printf \"%s\\t%s\\t%s\\n\", u[k], a[k], e[k] }'")


def run(shell: list[str], body: str, env: dict[str, str] | None = None, cwd: str | None = None) -> bytes:
    """The snippet in a subshell, as the probe ran it before, and its status."""
    return subprocess.run([*shell, "-c", f"( {body}\n) 2>/dev/null; echo \"status $?\""], capture_output=True,
                          check=False, env=env, cwd=cwd).stdout


def as_function(shell: list[str], body: str, env: dict[str, str] | None = None) -> bytes:
    """The snippet as a function of the shell (how the probe runs a section that passes probe.in_shell)."""
    return subprocess.run([*shell, "-c", f"f() {{ {body}\n}}; f 2>/dev/null; echo \"status $?\""],
                          capture_output=True, check=False, env=env).stdout


# ---- dpkg asked once ----------------------------------------------------------------------------------------------

STATUS = {  # package (arch) -> (dpkg Status, version): holds, multi-arch twins, config files, a half-installed one
    ("firmware-nvidia-gsp", "amd64"): ("install ok installed", "535.216.01-1~deb12u1"),
    ("firmware-nvidia-tesla-gsp", "amd64"): ("install reinstreq half-installed", "1-1"),
    ("libc6", "amd64"): ("install ok installed", "2.36-9"),
    ("libcuda1", "amd64"): ("hold ok installed", "535.216.01-1~deb12u1"),
    ("libcuda1", "i386"): ("install ok installed", "535.216.01-1~deb12u1"),
    ("libnvidia-ml1", "amd64"): ("install ok installed", "535.216.01-1~deb12u1"),
    ("linux-modules-nvidia-535-6.8.0-45-generic", "amd64"): ("install ok installed", "6.8.0-45.45+1"),
    ("linux-objects-nvidia-535-6.8.0-45-generic", "amd64"): ("install ok installed", "6.8.0-45.45+1"),
    ("nvidia-driver", "amd64"): ("deinstall ok config-files", "530.30.02-1"),
    ("nvidia-kernel-dkms", "amd64"): ("install ok half-configured", "535.216.01-1~deb12u1"),
    ("cuda-drivers-535", "amd64"): ("hold ok installed", "535.216.01-1"),
}


def dpkg_db(tmp_path: Path, which: dict[tuple[str, str], tuple[str, str]]) -> dict[str, str]:
    """A dpkg database of `which` for the real dpkg-query (DPKG_ADMINDIR), and the environment that reads it."""
    admin = tmp_path / "dpkg"
    (admin / "updates").mkdir(parents=True)
    (admin / "info").mkdir()
    (admin / "status").write_text("".join(
        f"Package: {name}\nStatus: {status}\nMaintainer: x <x@example.org>\nArchitecture: {arch}\n"
        f"Multi-Arch: same\nVersion: {version}\nDescription: x\n\n" for (name, arch), (status, version) in which.items()))
    return {**os.environ, "DPKG_ADMINDIR": str(admin)}


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs the real dpkg-query")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_one_dpkg_query_gives_each_package_section_what_its_own_query_printed(shell, tmp_path):
    prelude = registry.SHARED["gpunode_dpkg_set"]
    for which in (STATUS, {k: v for k, v in STATUS.items() if k[0] == "libc6"}, {}):
        env = dpkg_db(tmp_path / str(len(which)), which)
        for fact, old in ((packages.PKG_STATUS, OLD_PKG_STATUS), (driver_facts.PACKAGES, OLD_DRIVER_PACKAGES)):
            assert "gpunode_dpkg_set" in fact.snippet and in_shell(fact.snippet)
            want = run(shell, old, env)
            assert run(shell, fact.snippet, env) == want, (fact, len(which))  # alone: its own dpkg-query
            assert run(shell, prelude + "\n" + fact.snippet, env) == want, (fact, len(which))  # asked once
            assert as_function(shell, prelude + "\n" + fact.snippet, env) == want
            if which is STATUS:
                assert want.count(b"\n") >= 6  # the database was read: the comparison means something
    # the one query asks for every name a reader picks: a reader with a name outside it is refused where declared
    with pytest.raises(ValueError, match="DPKG_NAMES"):
        packages.dpkg_status(("nvidia*", "xserver-xorg-video-nvidia*"), "true")


def test_the_two_package_sections_parse_the_held_and_the_installed_alike(tmp_path):
    if not shutil.which("dpkg-query"):
        pytest.skip("needs the real dpkg-query")
    env = dpkg_db(tmp_path, STATUS)
    out = subprocess.run(["sh", "-c", packages.PKG_STATUS.snippet], capture_output=True, text=True, env=env).stdout
    status = packages.parse_packages(out)
    assert status["cuda-drivers-535"].held and "linux-objects-nvidia-535-6.8.0-45-generic" not in status
    out = subprocess.run(["sh", "-c", driver_facts.PACKAGES.snippet], capture_output=True, text=True, env=env).stdout
    assert "libcuda1 535.216.01-1~deb12u1" in out and "nvidia-driver" not in out  # config files only: not installed
    assert "linux-objects-nvidia-535-6.8.0-45-generic 6.8.0-45.45+1" in out


# ---- systemctl show picked without awk --------------------------------------------------------------------------

# `systemctl show -p Id -p ActiveState -p UnitFileState` for the six units below as systemd 252 prints them (a
# block per unit, Id first, the others in systemd's own order), with units that do not exist (no file state) and
# an alias (it shows its target's Id: hence picked by position, not by name)
SHOW = """Id=docker.service
ActiveState=active
UnitFileState=enabled

Id=containerd.service
UnitFileState=enabled
ActiveState=active

Id=crio.service
ActiveState=inactive
UnitFileState=

Id=snap.docker.dockerd.service
ActiveState=inactive
UnitFileState=

Id=nvidia-fabricmanager-alias-target.service
ActiveState=activating
UnitFileState=alias

Id=nvidia-persistenced.service
ActiveState=failed
UnitFileState=masked-runtime
"""


def fake_systemctl(tmp_path: Path, show: str | None) -> dict[str, str]:
    """A PATH whose systemctl prints `show` (None: no systemctl at all), with the shell's tools beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("awk", "sed", "cat", "dpkg-query"):
        if shutil.which(tool):
            target = bin_dir / tool
            if not target.exists():
                target.symlink_to(shutil.which(tool) or "")
    if show is not None:
        (tmp_path / "show.txt").write_text(show)
        (bin_dir / "systemctl").write_text(f"#!/bin/sh\ncat {tmp_path / 'show.txt'}\n")
        (bin_dir / "systemctl").chmod(0o755)
    elif (bin_dir / "systemctl").exists():
        (bin_dir / "systemctl").unlink()
    return {"PATH": str(bin_dir), "HOME": str(tmp_path)}


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_unit_states_picked_by_the_shell_print_what_awk_printed(shell, tmp_path):
    units = ("docker.service", "containerd.service", "crio.service", "snap.docker.dockerd.service",
             "nvidia-fabricmanager.service", "nvidia-persistenced.service")
    snippet = packages.unit_states(*units)
    assert in_shell(snippet) and "awk" not in snippet
    # the union of two readers' units: what build_probe asks once
    prelude = packages.shared_units([snippet, packages.unit_states("nvidia-persistenced.service", "kubelet.service")])
    assert prelude and "awk" not in prelude
    for show in (SHOW, SHOW.replace("\nActiveState=failed", ""), "", "Id=docker.service\n", None):
        env = fake_systemctl(tmp_path, show)
        old = run(shell, old_units(units), env)
        assert old.count(b"\t") == 2 * len(units)  # the reference printed a row per unit
        assert run(shell, snippet, env) == old, show
        assert run(shell, prelude + "\n" + snippet, env) == old, show
        assert as_function(shell, snippet, env) == old
    env = fake_systemctl(tmp_path, SHOW)
    got = packages.parse_units(run(shell, snippet, env).decode().rsplit("status", 1)[0])
    assert got["docker.service"].is_active and got["nvidia-persistenced.service"].masked
    assert not got["snap.docker.dockerd.service"].exists and got["nvidia-fabricmanager.service"].enabled == "alias"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_gpu_services_without_systemctl_read_as_unread_in_the_probes_shell(shell, tmp_path):
    # status 1 now where a subshell exited 3 before: both are a failed section, which the parser reads as unread
    fact = holders.GPU_SERVICE_UNITS
    assert in_shell(fact.snippet)
    out = as_function(shell, fact.snippet, fake_systemctl(tmp_path, None))
    assert out == b"status 1\n"
    assert fact.parse(Section("", 1)) == fact.parse(Section("", 3)) == {}
    out = as_function(shell, fact.snippet, fake_systemctl(tmp_path, SHOW)).decode()
    assert out.count("\t") == 2 * len(holders.SERVICE_NAMES) and out.endswith("status 0\n")


def test_the_nvswitch_facts_fail_in_the_probes_shell_where_there_is_no_nvswitch():
    # the PCI bus of this machine has no NVSwitch (nor /proc/driver/nvidia-nvswitch): nothing printed, a failure
    # the parsers read as they read the subshell's exit 3
    if Path("/proc/driver/nvidia-nvswitch").exists():
        pytest.skip("this machine has an NVSwitch")
    for fact, empty in ((fabric.VERSIONLOCKS, {}), (fabric.FM_AVAILABLE, {})):
        assert in_shell(fact.snippet)
        for shell in SHELLS:
            assert as_function(shell, fact.snippet) == b"status 1\n"
        assert fact.parse(Section("", 1)) == fact.parse(Section("", 3)) == empty


# ---- the tools found on PATH, PATH cut without IFS ------------------------------------------------------------

@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_tools_cut_path_as_field_splitting_did(shell, tmp_path):
    assert in_shell(system.TOOLS.snippet)
    for sub, names in (("a", ("nvidia-smi", "dkms")), ("b", ("nvidia-smi", "docker")), ("c d", ("kubelet",)),
                       ("e*", ("docker",))):
        (tmp_path / sub).mkdir()
        for name in names:
            (tmp_path / sub / name).write_text("#!/bin/sh\n")
            (tmp_path / sub / name).chmod(0o755)
    (tmp_path / "gcc").write_text("")
    (tmp_path / "gcc").chmod(0o755)  # found through an empty PATH entry: the current directory
    old = ("set -f; IFS=:; for t in " + " ".join(system.TOOL_NAMES) + "; do for d in $PATH; do d=${d:-.}; "
           '[ -f "$d/$t" ] && [ -x "$d/$t" ] && { echo "$t $d/$t"; break; }; done; done; true')
    entries = [str(tmp_path / "a"), str(tmp_path / "b"), "", str(tmp_path / "c d"), str(tmp_path / "e*"), "a"]
    paths = ["", ":", ":".join(entries), ":".join(entries) + ":", ":" + ":".join(reversed(entries)), entries[1],
             entries[1] + "::" + entries[0], ":::"]
    for path in paths:
        want = run(shell, old, {"PATH": path}, cwd=str(tmp_path))
        assert run(shell, system.TOOLS.snippet, {"PATH": path}, cwd=str(tmp_path)) == want, path
        assert as_function(shell, system.TOOLS.snippet, {"PATH": path}) is not None
    assert run(shell, old, {"PATH": ":".join(entries)}, cwd=str(tmp_path)).count(b"\n") >= 6  # found: gcc too


# ---- what dockerd loaded, from its socket ---------------------------------------------------------------------

def test_the_engine_apis_info_and_docker_infos_format_parse_alike():
    # both captured from the one running dockerd of the Debian 12 VM (docker.io 20.10.24)
    api = (REAL / "debian12-docker.io-20.10.24-api-info.json").read_text()
    cli = (REAL / "debian12-docker.io-20.10.24-format.txt").read_text()
    assert parse_docker_loaded(api) == parse_docker_loaded(cli) == LoadedRuntimes(
        frozenset({"io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"}), "runc")
    info = json.loads(api)
    info["Runtimes"]["nvidia"] = {"path": "nvidia-container-runtime"}
    info["DefaultRuntime"] = "nvidia"
    loaded = parse_docker_loaded(json.dumps(info))
    assert loaded is not None and loaded.satisfies(want_default=True)
    for broken in ('{"message": "Sending a request to the daemon failed"}', '{"Runtimes": null}', "[1]", "{", ""):
        assert parse_docker_loaded(broken) is None, broken


class InfoSocket:
    """An Engine API stand-in on a unix socket in a test directory: answers every request with `reply`."""

    def __init__(self, path: Path, reply: bytes) -> None:
        self.path, self.reply, self.requests = path, reply, []  # type: ignore[var-annotated]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.sock.settimeout(10)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    self.requests.append(data)
                    conn.sendall(self.reply)
        except OSError:
            return

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def docker_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PATH with perl and a `docker` that prints what `docker info --format` printed on the VM."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\ncat {REAL / 'debian12-docker.io-20.10.24-format.txt'}\n")
    docker.chmod(0o755)
    for tool in ("perl", "cat"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool) or "")
    return {"PATH": str(bin_dir), "HOME": str(tmp_path), **extra}


@pytest.mark.skipif(not shutil.which("perl"), reason="needs perl")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_dockerd_is_asked_on_its_socket_and_docker_info_where_the_cli_would_ask_elsewhere(shell, tmp_path):
    sock_path = tmp_path / "docker.sock"
    snippet = containers.DOCKER_LOADED.snippet.replace(containers.DOCKER_SOCKET, str(sock_path))
    assert in_shell(snippet) and containers.DOCKER_SOCKET in containers.DOCKER_LOADED.snippet
    api = (REAL / "debian12-docker.io-20.10.24-api-info.json").read_bytes()
    server = InfoSocket(sock_path, b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + api)
    try:
        out = as_function(shell, snippet, docker_env(tmp_path))
        assert out == api + b"status 0\n"  # the body, byte for byte
        assert server.requests and server.requests[-1].startswith(b"GET /info HTTP/1.0\r\n")
        # the CLI would ask another daemon: docker info answers, the socket is not asked
        asked = len(server.requests)
        for env in ({"DOCKER_HOST": "tcp://10.0.0.9:2376"}, {"DOCKER_CONTEXT": "remote"}):
            out = as_function(shell, snippet, docker_env(tmp_path, **env))
            assert out.startswith(b'"runc" {') and len(server.requests) == asked, env
        (tmp_path / ".docker").mkdir()
        (tmp_path / ".docker" / "config.json").write_text('{\n\t"auths": {},\n\t"currentContext": "remote"\n}\n')
        assert as_function(shell, snippet, docker_env(tmp_path)).startswith(b'"runc" {')
        (tmp_path / ".docker" / "config.json").write_text('{\n\t"auths": {}\n}\n')
        assert as_function(shell, snippet, docker_env(tmp_path)) == api + b"status 0\n"
    finally:
        server.close()
    # an error from the daemon: nothing printed, the daemon did not answer
    sock_path.unlink()
    server = InfoSocket(sock_path, b'HTTP/1.0 500 Internal Server Error\r\n\r\n{"message": "boom"}\n')
    try:
        out = as_function(shell, snippet, docker_env(tmp_path))
        assert not out.startswith(b"{") and parse_docker_loaded(out.decode().rsplit("status", 1)[0]) is None
    finally:
        server.close()
    # no socket at all (docker not running, or not installed): docker info, as before
    sock_path.unlink()
    assert as_function(shell, snippet, docker_env(tmp_path)).startswith(b'"runc" {')


# ---- the driver's main module file: the same file-name rule as the kernels section's (kernel.FIRST_MAIN_MODULE) --

OLD_MODULE = ('F="^(filename|version|license|signer|name):"; if ! modinfo nvidia 2>/dev/null | grep -E "$F"; then '
              'k=${gpunode_kernel:-$(uname -r)}; f=; { [ -d "/lib/modules/$k/updates" ] || [ -d "/lib/modules/$k/extra" ]; } '
              '&& f=$(find "/lib/modules/$k/updates" "/lib/modules/$k/extra" -name "nvidia*.ko*" 2>/dev/null | '
              'grep -E "/nvidia(-current|-tesla-[0-9]+)?(-open)?\\.ko" | head -n 1); '
              '[ -n "$f" ] && modinfo "$f" 2>/dev/null | grep -E "$F"; fi; true')
MODULE_TREES = {  # files under the running kernel's modules directory
    "debian-dkms": ("updates/dkms/nvidia-current-uvm.ko", "updates/dkms/nvidia-current.ko",
                    "updates/dkms/nvidia-current-drm.ko"),
    "tesla-open-compressed": ("extra/nvidia-tesla-535-open-uvm.ko.xz", "extra/nvidia-tesla-535-open.ko.xz"),
    "installer": ("extra/nvidia-drm.ko", "extra/nvidia-modeset.ko", "extra/nvidia.ko", "extra/nvidia-uvm.ko"),
    "no-main-module": ("updates/dkms/nvidia-uvm.ko", "updates/dkms/nvidia-peermem.ko",
                       "updates/dkms/nvidia-tesla-x.ko"),
    "neither-directory": ("kernel/drivers/video/nvidia.ko",),
}


@pytest.mark.parametrize("tree", sorted(MODULE_TREES))
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_main_module_is_picked_by_the_kernels_rule_as_grep_picked_it(shell, tree, tmp_path):
    root = tmp_path / "lib" / "modules"
    for name in MODULE_TREES[tree]:
        (root / "6.1.0-test" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "6.1.0-test" / name).write_text("")
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "modinfo").write_text('#!/bin/sh\n[ "$1" = nvidia ] && exit 1\nprintf "filename:       %s\\nversion:'
                                   '        535.216.01\\n" "$1"\n')
    (shims / "modinfo").chmod(0o755)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "gpunode_kernel": "6.1.0-test"}
    new = driver_facts.MODULE.snippet.replace("/lib/modules/", f"{root}/")
    old = OLD_MODULE.replace("/lib/modules/", f"{root}/")
    assert "grep -E \"/nvidia" not in driver_facts.MODULE.snippet  # the rule is the kernels section's
    printed = run(shell, new, env)
    assert printed == run(shell, old, env)
    assert printed == as_function(shell, new, env)
    if Path(shell[0]).name == "busybox":
        return  # its sh runs its own modinfo applet, not the shim that names the file it was given
    picked = {"debian-dkms": "nvidia-current.ko", "tesla-open-compressed": "nvidia-tesla-535-open.ko.xz",
              "installer": "nvidia.ko"}.get(tree)
    assert (f"/{picked}\n".encode() in printed) if picked else b"filename" not in printed
