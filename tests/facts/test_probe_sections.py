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
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpunode.facts import containers, fabric, holders, kernel, packages, registry, system
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
        # list-units: every unit named is in memory and loaded, so each is asked of `show`, as before
        (bin_dir / "systemctl").write_text('#!/bin/sh\nif [ "$1" = list-units ]; then shift 5; for u; do '
                                           f'echo "$u loaded active running"; done; exit 0; fi\ncat {tmp_path / "show.txt"}\n')
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
    # and alike with what the probe reads from daemon.json where that is what dockerd loaded (there: no file)
    assert parse_docker_loaded(api) == parse_docker_loaded(cli) == parse_docker_loaded(
        "config /etc/docker/daemon.json\n") == LoadedRuntimes(frozenset({"runc"}), "runc")
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


MODINFO_ANSWERS = {  # what `modinfo nvidia` printed (a real one's shape, cut) and twins around the lines MODULE reads
    "dkms": ("filename:       /lib/modules/6.1.0-18-amd64/updates/dkms/nvidia-current.ko\nalias:          char-major-195-*\n"
             "version:        535.216.01\nsupported:      external\nlicense:        NVIDIA\nfirmware:       nvidia/535/gsp.bin\n"
             "srcversion:     1A2B3C\nalias:          pci:v000010DEd*sv*sd*bc03sc02i00*\ndepends:        \nretpoline:      Y\n"
             "name:           nvidia\nvermagic:       6.1.0-18-amd64 SMP preempt mod_unload modversions \n"
             "sig_id:         PKCS#7\nsigner:         DKMS module signing key\nsig_key:        2C:4F:0A\n"
             "sig_hashalgo:   sha256\nsignature:      30:65:02:31:00\n\t\t9A:BC\n"
             "parm:           NvSwitchRegDwords:NvSwitch regkey (charp)\nparm:           NVreg_Mobile:int\n"),
    "no final newline": "version:        550.54.15\nlicense:        NVIDIA",
    "look-alikes only": ("versionmagic:   6.1\n version:       1\nfilename\nname :x\nsigner\\:%s -x\n\n"
                         "srcversion: version: 2\n"),
    "odd text": "name:%s %d \\n -e\nversion:-n\n\nlicense:\nsigner:   \\\\ end  \n\n",
    "nothing": "",
}


@pytest.mark.parametrize("answer", sorted(MODINFO_ANSWERS))
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_modinfos_lines_picked_by_the_shell_print_what_grep_printed(shell, answer, tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    (tmp_path / "answer").write_text(MODINFO_ANSWERS[answer])
    (shims / "modinfo").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\ncat {tmp_path}/answer\nexit 1\n')
    (shims / "modinfo").chmod(0o755)
    root = tmp_path / "lib" / "modules"
    (root / "6.1.0-test" / "updates" / "dkms").mkdir(parents=True)
    (root / "6.1.0-test" / "updates" / "dkms" / "nvidia.ko").write_text("")  # asked where `nvidia` gave no line
    env = {"PATH": f"{shims}:/usr/bin:/bin", "gpunode_kernel": "6.1.0-test"}
    new, old = (s.replace("/lib/modules/", f"{root}/") for s in (driver_facts.MODULE.snippet, OLD_MODULE))
    assert "grep" not in driver_facts.MODULE.snippet and in_shell(driver_facts.MODULE.snippet)
    printed = run(shell, new, env)
    assert printed == run(shell, old, env)
    assert printed == as_function(shell, new, env)
    if Path(shell[0]).name != "busybox":  # busybox's sh runs its own modinfo applet
        found = answer in ("dkms", "no final newline", "odd text")
        assert (b"version:" in printed) == found
        calls = (tmp_path / "calls").read_text().splitlines()
        assert calls == (["nvidia"] * 3 if found else ["nvidia", f"{root}/6.1.0-test/updates/dkms/nvidia.ko"] * 3)


# ---- the /dev/char links to NVIDIA devices, picked out of `ls -l` by the shell -------------------------------------

OLD_DEV_CHAR_LINKS = 'ls -l /dev/char 2>/dev/null | sed -n "/nvidia/s/.* \\([0-9][0-9]*:[0-9][0-9]*\\) -> /link \\1 /p"; true'
DEV_CHAR_LINKS = {  # link name -> target: links udev and nvidia-ctk make, and look-alikes around sed's pattern
    "195:0": "../nvidia0", "195:255": "../nvidiactl", "511:1": "../nvidia-uvm-tools", "10:1": "../psaux",
    "1:3": "../null", "195:7": "x -> ../nvidia7", "a 1:2": "../nvidia-caps/nvidia-cap1", "1:2:3": "../nvidia3",
    "x:1": "../nvidia4", "195:9": "../nvidia9 -> 1:2 -> ../z", "nvidia 1:4 -> b": "c", "195:1": "/gone/nvidia1",
}


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_dev_char_links_picked_by_the_shell_print_what_sed_printed(shell, tmp_path):
    links = tmp_path / "char"
    links.mkdir()
    snippet = kernel.DEV_CHAR.snippet.replace("/dev/char", str(links)).replace("/dev/nvidia*", str(tmp_path / "n*"))
    assert "sed" not in kernel.DEV_CHAR.snippet and in_shell(kernel.DEV_CHAR.snippet)
    env = {"PATH": "/usr/bin:/bin"}
    old = OLD_DEV_CHAR_LINKS.replace("/dev/char", str(links))
    assert run(shell, snippet, env) == run(shell, old, env) == b"status 0\n"  # none
    for name, target in DEV_CHAR_LINKS.items():
        (links / name).symlink_to(target)
    (links / "nvidia").write_text("")  # not a link
    printed = run(shell, snippet, env)
    assert printed == run(shell, old, env) and printed == as_function(shell, snippet, env)
    assert kernel.parse_dev_char(printed.decode()).links == {
        "nvidia0": "/dev/char/195:0", "nvidiactl": "/dev/char/195:255", "nvidia-uvm-tools": "/dev/char/511:1",
        "nvidia-cap1": "/dev/char/1:2", "z": "/dev/char/1:2", "nvidia1": "/dev/char/195:1"}  # sed's last match


# ---- what dockerd loaded, from daemon.json where the running dockerd started after it last changed ---------------

NVIDIA_CONFIG = '{\n    "runtimes": {\n        "nvidia": {\n            "path": "nvidia-container-runtime"\n        }\n    }\n}\n'


@dataclass
class DockerHost:
    """A stand-in for /etc/docker, the pid file and the socket, and a process called dockerd started after them."""

    root: Path
    socket: InfoSocket
    procs: list[subprocess.Popen[bytes]]

    def snippet(self, name: str, pidfile: str = "docker.pid") -> str:
        """DOCKER_LOADED reading the directory `name` (the daemon.json in it) and the pid file `pidfile`."""
        return (containers.DOCKER_LOADED.snippet.replace(containers.DOCKER_SOCKET, str(self.root / "docker.sock"))
                .replace(containers.DOCKER_PIDFILE, str(self.root / pidfile))
                .replace(containers.DOCKER_CONFIG, str(self.root / name / "daemon.json"))
                .replace(containers.DOCKER_CONFIG_DIR, str(self.root / name)))

    def dockerd(self, pidfile: str, *args: str) -> None:
        """A process whose name is dockerd (a copy of dash, waiting), with `args` on its command line."""
        proc = subprocess.Popen(["dockerd", "-c", "sleep 120; :", *args], executable=str(self.root / "bin" / "dockerd"))
        self.procs.append(proc)
        (self.root / pidfile).write_text(f"{proc.pid}\n")


@pytest.fixture(scope="module")
def docker_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("dockerhost")
    (root / "bin").mkdir()
    shutil.copy(shutil.which("dash") or "/bin/sh", root / "bin" / "dockerd")
    for tool in ("perl", "cat", "stat"):
        (root / "bin" / tool).symlink_to(shutil.which(tool) or "")
    (root / "bin" / "docker").write_text(f"#!/bin/sh\ncat {REAL / 'debian12-docker.io-20.10.24-format.txt'}\n")
    (root / "bin" / "docker").chmod(0o755)
    for name, config in (("older", NVIDIA_CONFIG), ("older-none", None), ("older-empty", ""),
                         ("older-link", NVIDIA_CONFIG)):
        (root / name).mkdir()
        if config is not None:
            (root / name / ("real.json" if name.endswith("link") else "daemon.json")).write_text(config)
    (root / "older-link" / "daemon.json").symlink_to(root / "older-link" / "real.json")
    # ctimes in whole seconds (busybox's stat) are taken 1 s later than they may be: wait that long and more
    time.sleep(2.3)
    # the daemon answers with what dockerd 20.10 of the VM loaded without the nvidia runtime: not the file
    api = (REAL / "debian12-docker.io-20.10.24-api-info.json").read_bytes()
    host = DockerHost(root, InfoSocket(root / "docker.sock", b"HTTP/1.0 200 OK\r\n\r\n" + api), [])
    host.dockerd("docker.pid", "-H", "fd://", "--containerd=/run/containerd/containerd.sock")
    host.dockerd("adds.pid", "--add-runtime=nvidia=/usr/bin/nvidia-container-runtime")
    (root / "other.pid").write_text(f"{os.getpid()}\n")  # a process, but not dockerd
    gone = subprocess.Popen(["true"])
    gone.wait()
    (root / "stale.pid").write_text(f"{gone.pid}\n")  # no process
    (root / "newer").mkdir()  # written after the daemon started: it may not have loaded it
    (root / "newer" / "daemon.json").write_text(NVIDIA_CONFIG)
    try:
        yield host
    finally:
        for proc in host.procs:
            proc.kill()
            proc.wait()
        host.socket.close()


@pytest.mark.skipif(not (shutil.which("perl") and shutil.which("dash") and shutil.which("stat")),
                    reason="needs perl, dash and stat")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_daemon_json_is_read_only_where_the_running_dockerd_started_after_it_changed(shell, docker_host):
    env = {"PATH": str(docker_host.root / "bin"), "HOME": str(docker_host.root)}
    api = (REAL / "debian12-docker.io-20.10.24-api-info.json").read_bytes()
    info = parse_docker_loaded(api.decode())
    assert info is not None and "nvidia" not in info.runtimes
    asked = len(docker_host.socket.requests)
    # the file (and its directory) changed before the daemon started: the file is what it loaded
    out = as_function(shell, docker_host.snippet("older"), env)
    head = f"config {docker_host.root / 'older' / 'daemon.json'}\n".encode()
    assert out == head + NVIDIA_CONFIG.encode() + b"status 0\n"
    loaded = parse_docker_loaded(out.decode().rsplit("status", 1)[0])
    assert loaded == LoadedRuntimes(frozenset({"nvidia", "runc"}), "runc") and loaded.satisfies(want_default=False)
    # no daemon.json: dockerd's defaults
    out = as_function(shell, docker_host.snippet("older-none"), env)
    assert out == f"config {docker_host.root / 'older-none' / 'daemon.json'}\nstatus 0\n".encode()
    assert parse_docker_loaded(out.decode().rsplit("status", 1)[0]) == LoadedRuntimes(frozenset({"runc"}), "runc")
    assert len(docker_host.socket.requests) == asked  # the daemon was not asked
    # the twins: the daemon is asked (and answers without the nvidia runtime the file names)
    for name, pidfile in (("newer", "docker.pid"),  # the file changed after the daemon started
                          ("older", "adds.pid"),  # its command line adds a runtime
                          ("older", "other.pid"),  # the pid file names a process that is not dockerd
                          ("older", "missing.pid"),  # no pid file
                          ("older", "stale.pid"),  # the pid file names no process
                          ("older-link", "docker.pid"),  # daemon.json is a symbolic link
                          ("older-empty", "docker.pid")):  # an empty daemon.json
        out = as_function(shell, docker_host.snippet(name, pidfile), env)
        assert out == api + b"status 0\n", (name, pidfile)
        assert len(docker_host.socket.requests) == asked + 1, (name, pidfile)
        asked += 1
    # the CLI would ask another daemon: docker info, as before
    out = as_function(shell, docker_host.snippet("older"), {**env, "DOCKER_HOST": "tcp://10.0.0.9:2376"})
    assert out.startswith(b'"runc" {') and len(docker_host.socket.requests) == asked


def test_daemon_json_parses_as_dockerd_loads_it():
    parse = parse_docker_loaded
    nvidia = {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}
    assert parse("config /etc/docker/daemon.json\n" + json.dumps({"runtimes": nvidia, "default-runtime": "nvidia"})) \
        == LoadedRuntimes(frozenset({"nvidia", "runc"}), "nvidia")
    assert parse("config /etc/docker/daemon.json\n{}") == parse("config /etc/docker/daemon.json") \
        == LoadedRuntimes(frozenset({"runc"}), "runc")
    for broken in ('{"runtimes": []}', '["x"]', "{"):
        assert parse("config /etc/docker/daemon.json\n" + broken) is None, broken


# ---- the machine from the uname that asked the kernel's release; tools not started where there is nothing ------

@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_machine_read_from_the_release_uname_prints_what_uname_m_printed(shell, tmp_path):
    prelude = registry.SHARED[registry.KERNEL_MARKER]
    assert registry.KERNEL_MARKER in system.ARCH.snippet and in_shell(system.ARCH.snippet)
    real = subprocess.run(["uname", "-m"], capture_output=True, check=True).stdout
    path = f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    # uname -rm as it is, failing, printing one word, printing no machine
    for shim in (None, 'exit 1', 'echo "6.1.0-test"', 'echo "$(/bin/uname -r) "'):
        if shim is not None:
            (tmp_path / "uname").write_text(f'#!/bin/sh\n[ "$1" = -rm ] || exec /bin/uname "$@"\n{shim}\n')
            (tmp_path / "uname").chmod(0o755)
        env = {"PATH": path}
        alone = run(shell, system.ARCH.snippet, env)
        assert alone == real + b"status 0\n"
        assert run(shell, prelude + "\n" + system.ARCH.snippet, env) == alone, shim
        assert as_function(shell, prelude + "\n" + system.ARCH.snippet, env) == alone, shim
        release = run(shell, prelude + "\n" + system.KERNEL.snippet, env)
        assert release == run(shell, system.KERNEL.snippet, env), shim


NVSWITCH_DIR, IB_GLOB = "/proc/driver/nvidia-nvswitch/devices", "/sys/class/infiniband/*/device/vpd"
OLD_NVSWITCH, OLD_NVLINK5 = f"ls -1 {NVSWITCH_DIR}", f"grep -l SW_MNG {IB_GLOB}"


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_switch_sections_parse_as_ls_and_grep_did(shell, tmp_path):
    for case in ("none", "empty", "some"):
        root = tmp_path / case
        devices, ib = root / "nvswitch", root / "ib"
        if case != "none":
            devices.mkdir(parents=True)
            ib.mkdir()
        if case == "some":
            for n in ("0", "1", "10", "2"):
                (devices / n).write_text("")
            for name, vpd in (("mlx5_0", "PN SW_MNG x"), ("mlx5_1", "PN HCA"), ("mlx5_2", "SW_MNG")):
                (ib / name / "device").mkdir(parents=True)
                (ib / name / "device" / "vpd").write_text(vpd)
        for fact, old, path in ((fabric.NVSWITCH_DEVICES, OLD_NVSWITCH, NVSWITCH_DIR),
                                (fabric.NVLINK5_SWITCHES, OLD_NVLINK5, IB_GLOB.split("/*")[0])):
            here = str(devices if fact is fabric.NVSWITCH_DEVICES else ib)
            new, old = fact.snippet.replace(path, here), old.replace(path, here)
            assert in_shell(new)
            before, after = run(shell, old), as_function(shell, new)
            text, status = before.rsplit(b"status ", 1)
            now, now_status = after.rsplit(b"status ", 1)
            assert fact.parse(Section(text.decode(), int(status))) == fact.parse(Section(now.decode(), int(now_status)))
            assert (now == text) if int(status) == 0 else (now == b"" and int(now_status) != 0), (fact, case)
            if case == "some":
                assert fact.parse(Section(now.decode(), 0)), fact  # found: the comparison means something


@pytest.mark.skipif(not shutil.which("update-alternatives"), reason="needs dpkg's update-alternatives")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_update_alternatives_is_asked_only_where_an_nvidia_alternative_is_recorded(shell, tmp_path):
    old = driver_facts.DEBIAN_NAMES.snippet.split(" && update-alternatives")[0].split(" && {")[0] + \
        " && update-alternatives" + driver_facts.DEBIAN_NAMES.snippet.split(" && update-alternatives", 1)[1]
    assert "DPKG_ADMINDIR" not in old and in_shell(driver_facts.DEBIAN_NAMES.snippet)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "gpunode_kernel": "6.1.0-none"}
    if not Path("/var/lib/dpkg/alternatives/nvidia").exists():
        assert run(shell, driver_facts.DEBIAN_NAMES.snippet, env) == run(shell, old, env) == b"status 0\n"
    # an alternative recorded (in an admin directory of its own: DPKG_ADMINDIR): asked, as before
    admin = tmp_path / "admin"
    (admin / "alternatives").mkdir(parents=True)
    (tmp_path / "nvidia-current").mkdir()
    (admin / "alternatives" / "nvidia").write_text(f"auto\n{tmp_path}/nvidia\n\n{tmp_path}/nvidia-current\n500\n\n")
    env["DPKG_ADMINDIR"] = str(admin)
    printed = run(shell, driver_facts.DEBIAN_NAMES.snippet, env)
    assert printed == run(shell, old, env)
    assert printed.startswith(b"alt "), printed  # asked: the alternative is known (its link is not made here)


# ---- one stat for every file group ---------------------------------------------------------------------------------

GROUPS = ("a/*.conf", "a/x", "b/*"), ("c/*.conf", "b/*"), ("d/*",)  # b/* twice: a file two groups read


def stat_shim(tmp_path: Path) -> dict[str, str]:
    """A PATH whose `stat` logs its call to tmp_path/stat.log and runs the real stat."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = shutil.which("stat")
    (bin_dir / "stat").write_text(f'#!/bin/sh\necho call >> {tmp_path}/stat.log\nexec {real} "$@"\n')
    (bin_dir / "stat").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def stat_calls(tmp_path: Path, counted: bool = True) -> int | None:
    """How many times the shim ran since the last look (None where the shell does not run it: any count passes)."""
    log = tmp_path / "stat.log"
    calls = len(log.read_text().splitlines()) if log.exists() else 0
    log.unlink(missing_ok=True)
    return calls if counted else None


def groups_script(groups: tuple[tuple[str, ...], ...], shared: bool, between: str = "") -> str:
    """The groups' sections as the probe runs them (functions of its shell, each framed), with or without the
    shared stat; `between` runs after the first group (a file made or removed meanwhile)."""
    body = [registry.files_stat((), tuple(p for g in groups for p in g))] if shared else []
    for i, patterns in enumerate(groups):
        snippet = registry.files_snippet(patterns)
        assert in_shell(snippet)
        body.append(f'echo "== {i}"; g() {{ {snippet}\n}}; g 2>/dev/null; echo "status $?"')
        if i == 0 and between:
            body.append(between)
    return "\n".join(body)


@pytest.mark.skipif(not shutil.which("stat"), reason="needs stat")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_file_groups_share_one_stat_and_read_as_each_group_alone(shell, tmp_path):
    root = tmp_path / "root"
    for name, text in {"a/one.conf": "options x\n", "a/two.conf": "no newline", "a/x": "",
                       "a/with\n1 2 newline.conf": "odd name\n", "a/9 9 z.conf": "a name like a record\n",
                       "b/big": "y" * (registry.CAT_MAX + 1), "c/z.conf": "c\n\n", "d/d": "d\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)

    def reset() -> None:
        for name, text in {"c/z.conf": "c\n\n", "b/big": "y" * (registry.CAT_MAX + 1)}.items():
            (root / name).write_text(text)
        for name in ("c/new.conf", "d/e"):
            (root / name).unlink(missing_ok=True)
        (root / "d/d").write_text("d\n")
        for i, path in enumerate(sorted(root.glob("*/*"))):  # each its own mtime: one taken for another shows
            os.utime(path, (1_000_000_000 + 1000 * i, 1_000_000_000 + 1000 * i))

    reset()
    env = stat_shim(tmp_path)
    counted = Path(shell[0]).name != "busybox"  # busybox sh runs its own stat applet, not the one on PATH

    def ran(script: str) -> bytes:
        out = subprocess.run([*shell, "-c", script], capture_output=True, check=False, env=env, cwd=root).stdout
        return out

    alone = ran(groups_script(GROUPS, shared=False))
    assert stat_calls(tmp_path, counted) in (3, None) and b"a/one.conf\noptions x\n" in alone
    assert b"odd name" in alone and b"a name like a record" in alone and alone.count(b"y" * (registry.CAT_MAX + 1)) == 2
    assert ran(groups_script(GROUPS, shared=True)) == alone
    assert stat_calls(tmp_path, counted) in (1, None)  # one for all the groups
    # no files at all: no stat
    empty = (("none/*",), ("nothing/*",))
    assert ran(groups_script(empty, shared=True)) == ran(groups_script(empty, shared=False))
    assert stat_calls(tmp_path, counted) in (0, None)
    # twins that must ask stat again: a file made or removed after the shared stat (each group reads what it finds
    # when it runs), one file put for another. A file only written in between keeps its record (its text is read
    # then, as always: a stat never was one moment with the read); new mtimes pinned so that the runs compare.
    pin = "touch -r a/two.conf"
    for between, again in ((f"echo new > c/new.conf && {pin} c/new.conf", True), ("rm c/z.conf", True),
                           (f"rm d/d && echo ee > d/e && {pin} d/e", True),
                           ("touch -r b/big ../kept && echo longer >> b/big && touch -r ../kept b/big", False)):
        shared = ran(groups_script(GROUPS, shared=True, between=between))
        calls = stat_calls(tmp_path, counted)
        assert calls is None or (calls > 1) == again, between
        reset()
        assert shared == ran(groups_script(GROUPS, shared=False, between=between)), between
        assert (b"new\n" in shared) == ("new" in between) and (b"longer\n" in shared) == ("longer" in between)
        reset()
        stat_calls(tmp_path)
    # stat failing in the shared call: every group asks for itself
    (tmp_path / "bin" / "stat").write_text(f'#!/bin/sh\necho call >> {tmp_path}/stat.log\n'
                                           f'case "$*" in *%n*) exit 1 ;; esac\nexec {shutil.which("stat")} "$@"\n')
    assert ran(groups_script(GROUPS, shared=True)) == alone
    assert stat_calls(tmp_path, counted) in (4, None)


def test_the_probe_defines_each_shared_function_once_and_its_sections_still_run_alone():
    from gpunode.facts.probe import build_probe
    for probe, part in ((registry.RUN, registry.CHECK), (registry.FULL, registry.ALL)):
        body = build_probe("n0nce", probe, part)[0].body
        for function in registry.FUNCTIONS:
            name = function.split("(")[0]
            assert body.count(f"{name}()") == 1, (probe, name)
            # defined before its first call
            assert body.index(f"{name}()") < body.index(f"{name} ", body.index(f"{name}()") + len(function))
        assert "@FILE@" not in body and "@n0nce@file" in body
        assert body.count("gpunode_stat_all()") == 1
    for fact in registry.REGISTRY.values():
        for function in registry.FUNCTIONS:
            name = function.split("(")[0]
            if f"{name} " in fact.snippet.replace(function, "") or f"$({name}" in fact.snippet:
                assert function in fact.snippet, (fact, name)  # each snippet defines what it calls


@pytest.mark.skipif(not (shutil.which("unshare") and shutil.which("stat")), reason="needs unshare and stat")
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: Path(s[0]).name)
def test_the_initramfs_mtimes_taken_from_the_shared_stat_are_what_its_own_stat_printed(shell, tmp_path):
    from gpunode.facts import kernel
    assert in_shell(kernel.INITRAMFS.snippet) and kernel.INITRAMFS.stats == kernel.INITRAMFS_PATHS
    env = stat_shim(tmp_path)
    counted = Path(shell[0]).name != "busybox"
    (tmp_path / "old").write_text("")
    os.utime(tmp_path / "old", (1_000_000_000, 1_000_000_000))
    (tmp_path / "grp").mkdir()
    (tmp_path / "grp" / "a.conf").write_text("a\n")
    group = registry.files_snippet((f"{tmp_path}/grp/*",))
    # /boot of a mount namespace of its own (a tmpfs): the running kernel's initrd.img (an old mtime) and Arch's
    # name as a symbolic link (stat without -L: the link's own mtime, as before)
    boot = (f'mount -t tmpfs none /boot || exit 9; touch -r {tmp_path}/old "/boot/initrd.img-$(uname -r)"; '
            'ln -s "initrd.img-$(uname -r)" /boot/initramfs-linux.img\n')

    def ran(shared: bool, between: str = "") -> bytes:
        parts = [boot]
        if shared:
            parts += [registry.SHARED[registry.KERNEL_MARKER],
                      registry.files_stat(kernel.INITRAMFS_PATHS, (f"{tmp_path}/grp/*",))]
        parts += [between, f'f() {{ {kernel.INITRAMFS.snippet}\n}}; f 2>/dev/null; echo "status $?"',
                  f'g() {{ {group}\n}}; g 2>/dev/null; echo "status $?"']
        return subprocess.run(["unshare", "-rm", *shell, "-c", "\n".join(parts)], capture_output=True, check=False,
                              env=env).stdout

    alone = ran(shared=False)
    assert alone.startswith(b"1000000000 /boot/initrd.img-") and b" /boot/initramfs-linux.img\n" in alone
    assert stat_calls(tmp_path, counted) in (3, None)  # two images, one group
    assert ran(shared=True) == alone
    assert stat_calls(tmp_path, counted) in (1, None)
    # twin: an image made after the shared stat is not in it: the section and the group ask stat themselves
    made = f'touch -r {tmp_path}/old "/boot/initrd-$(uname -r)"'
    assert ran(shared=True, between=made) == ran(shared=False, between=made)
    assert stat_calls(tmp_path, counted) in (1 + 3 + 1 + 4, None)  # shared, 3 images, the group; then alone
