"""Throwaway root filesystems for simulated nodes, and the host-safety rules around them.

Layout (everything below BASE is ours; nothing else on the machine is written):

    /var/lib/gpunode-nodesim/                 mode 755, root-owned (sshd insists on that for a chroot)
        tpl-<pid>-<token>/root/               the template: binaries copied ONCE per test process
        node-<pid>-<token>/                   one simulated node
            owner                             "<pid> <start-time>" of the process that created it
            root/                             the node's chroot (mode 755)
            sshd_config, sshd.pid, sshd.log, host/user keys, authorized_keys, known_hosts

Host binaries (dash, busybox, python, ...) are COPIED into the template; a node's root hardlinks the template
files, so a node costs a few hundred link(2) calls.  Nothing in a node is ever a hardlink to a host file.
Only files that the simulated node never rewrites in place are hardlinked (binaries, shim scripts, the
python stdlib zip); every mutable file (etc/, var/, proc/, sys/ ...) is written fresh per node.

Crash safety: `cleanup_stale()` removes directories whose owner process is gone, after stopping the sshd
recorded in them (checked by its command line) and any process still running inside that chroot.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

BASE = Path("/var/lib/gpunode-nodesim")
HERE = Path(__file__).resolve().parent
NODE_FILES = HERE / "node_files"
DATA = HERE / "data"

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
MAKESELF = "/usr/bin/makeself"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
DASH_CANDIDATES = ("/usr/bin/dash", "/bin/dash")
# Small host tools busybox-static lacks but scripts expect on any Linux box (copied with their libraries). openssl:
# real nodes have it (Debian's and Ubuntu's ca-certificates depend on it; RHEL's base has it), and the upload hashes
# a large file with it (a node without it falls back to sha256sum: tests/connection/test_upload_nodesim.py).
HOST_TOOLS = ("cksum", "install", "nohup", "getent", "flock", "openssl")

# busybox applets linked into every node.  Everything the simulator fakes (uname, hostname, modprobe, lsmod,
# rmmod, reboot, dpkg, rpm, wget, ...) is deliberately NOT in this list; neither is `sh`/`ash` (the shell is
# the real dash) nor anything that would need procfs (ps, pidof, top ...).
BUSYBOX_APPLETS = """
[ awk base64 basename bunzip2 bzcat bzip2 cat chgrp chmod chown cmp cp cpio cut date dd df diff dirname
du echo egrep env expand expr false fgrep find fold getopt grep groups gunzip gzip head hexdump id kill
less ln logname ls lzcat md5sum mkdir mkfifo mknod mktemp more mv nl nproc od paste patch printf pwd
readlink realpath rev rm rmdir sed seq setsid sha1sum sha256sum sha512sum shuf sleep sort stat strings stty sync
tac tail tar tee test timeout touch tr true truncate tty uniq unlink unxz unzip usleep vi wc which whoami
xargs xxd xz xzcat yes zcat
""".split()

# Modules the node-side python helpers import; the private interpreter gets exactly these (and what they
# pull in) as precompiled bytecode in one zip file.
NODE_PY_IMPORTS = ("json", "tomllib", "re", "os", "sys", "time", "datetime", "shlex", "glob", "fnmatch",
                   "copy", "hashlib", "subprocess", "io", "string", "collections", "functools", "itertools",
                   # what Ansible's own Python modules need (AnsiballZ, setup with gather_subset=min, find, ping):
                   # ansible.builtin.reboot runs setup and find, as on any real host with python3 (tests/ansible)
                   *("argparse array ast atexit base64 binascii bisect bz2 codecs concurrent.futures configparser "
                     "contextlib ctypes dataclasses decimal dis enum errno fcntl getpass gettext grp heapq "
                     "importlib.util inspect ipaddress json.decoder locale logging lzma math multiprocessing numbers "
                     "pathlib pickle pkgutil platform pwd queue random runpy select selectors shutil signal socket "
                     "ssl stringprep struct syslog tempfile termios textwrap threading token tokenize traceback "
                     "types typing unicodedata urllib.parse warnings weakref zipfile zipimport zlib encodings.cp437 "
                     "encodings.idna encodings.utf_16 encodings.utf_32 encodings.unicode_escape multiprocessing.pool "
                     "multiprocessing.dummy email.parser uuid hmac secrets string concurrent.futures.thread "
                     "concurrent.futures.process multiprocessing.connection multiprocessing.queues "
                     "multiprocessing.synchronize multiprocessing.popen_fork multiprocessing.util").split())

_lock = threading.Lock()
_template: Path | None = None


class NodesimUnavailable(RuntimeError):
    """The machine lacks something the simulator needs (reason in the message)."""


# ----------------------------------------------------------------------------------------------------------
# requirements


def _first_existing(candidates: tuple[str, ...]) -> str | None:
    for c in candidates:
        if os.path.exists(c):
            return c
    return None


def node_python() -> str:
    """The interpreter copied into nodes (at a path that is not on the node's PATH)."""
    for cand in (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}", "/usr/bin/python3"):
        if os.path.exists(cand):
            return os.path.realpath(cand)
    return os.path.realpath(sys.executable)


def missing_requirements() -> list[str]:
    """Human-readable list of what is missing; empty when nodes can be simulated here."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root privileges (sshd with ChrootDirectory must run as root)")
    if not os.path.exists(SSHD):
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    if not os.path.exists(SSH_KEYGEN):
        missing.append(f"{SSH_KEYGEN} (apt-get install openssh-client)")
    if _first_existing(BUSYBOX_CANDIDATES) is None:
        missing.append("busybox (apt-get install busybox-static)")
    if not os.path.exists(MAKESELF):
        missing.append(f"{MAKESELF} (apt-get install makeself)")
    if _first_existing(DASH_CANDIDATES) is None:
        missing.append("dash")
    if not shutil.which("ldd"):
        missing.append("ldd")
    if not os.path.exists("/usr/sbin/chroot"):
        missing.append("/usr/sbin/chroot (coreutils)")
    try:
        with open("/etc/shadow", encoding="utf-8") as fh:
            for line in fh:
                f = line.split(":")
                if f[0] == "root" and f[1].startswith("!"):
                    missing.append("an unlocked root account (sshd with UsePAM no refuses locked accounts; "
                                   "root's password field starts with '!')")
    except OSError:
        pass
    return missing


# ----------------------------------------------------------------------------------------------------------
# ownership / stale cleanup


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return None
    # the command name may contain spaces and parentheses: split after the last ')'
    fields = data.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def owner_token() -> str:
    return f"{os.getpid()} {_proc_start_time(os.getpid())}"


def _owner_alive(owner_file: Path) -> bool:
    try:
        pid_s, start = owner_file.read_text().split()
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    return _proc_start_time(pid) == start


def _being_made(entry: Path) -> bool:
    """A directory whose owner file is not written yet (new_dir: mkdir, then the owner), by a process that is
    alive: the PID in its name (another test process, an xdist worker, making it at this moment)."""
    try:
        pid = int(entry.name.split("-")[1])
    except (IndexError, ValueError):
        return False
    owner = entry / "owner"
    try:
        complete = len(owner.read_text().split()) == 2
    except OSError:
        complete = False
    return not complete and Path(f"/proc/{pid}").exists()


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                data = fh.read().decode(errors="replace")
            ppid = int(data.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def children(pid: int) -> list[int]:
    """The child processes of `pid`, from the host's /proc."""
    return _children_map().get(pid, [])


def descendants(pid: int) -> list[int]:
    """All descendants of `pid` (children first-level first), from the host's /proc."""
    children = _children_map()
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def processes_rooted_in(root: Path) -> list[int]:
    """PIDs of processes whose root directory is `root` or below it (i.e. running inside that chroot)."""
    root_s = str(root)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            r = os.readlink(f"/proc/{entry}/root")
        except OSError:
            continue
        if r == root_s or r.startswith(root_s + "/"):
            found.append(int(entry))
    return found


def pid_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def sshd_pid_if_ours(node_dir: Path) -> int | None:
    """The sshd recorded in node_dir, only if it really is an sshd started with node_dir's config."""
    try:
        pid = int((node_dir / "sshd.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CFG ... [listener] ..."): match the joined text
    cmd = " ".join(pid_cmdline(pid))
    if cmd.startswith(("sshd", SSHD)) and f"-f {node_dir / 'sshd_config'}" in cmd:
        return pid
    return None


def _safe_rmtree(path: Path) -> None:
    path = Path(path)
    if not str(path).startswith(str(BASE) + "/") or ".." in path.parts:
        raise ValueError(f"refusing to remove {path}: not below {BASE}")
    if path.is_symlink():
        path.unlink()
        return
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():  # something was still being written: one more pass
            time.sleep(0.05)
            shutil.rmtree(path, ignore_errors=True)


def destroy_node_dir(node_dir: Path, sshd_pid: int | None = None) -> None:
    """Stop everything belonging to a node directory (by PID) and remove it."""
    pid = sshd_pid or sshd_pid_if_ours(node_dir)
    if pid is not None:
        kill_pids(descendants(pid))
        kill_pids([pid], signal.SIGTERM)
    root = node_dir / "root"
    if root.exists():
        for _ in range(3):
            inside = processes_rooted_in(root)
            if not inside:
                break
            kill_pids(inside)
            time.sleep(0.02)
    if pid is not None:
        deadline = time.time() + 2
        while time.time() < deadline and pid_cmdline(pid):
            time.sleep(0.01)
        kill_pids([pid])
    _safe_rmtree(node_dir)


def cleanup_stale() -> list[str]:
    """Remove node and template directories left behind by test processes that no longer exist."""
    removed = []
    if not BASE.is_dir():
        return removed
    for entry in sorted(BASE.iterdir()):
        if not entry.is_dir() or entry.is_symlink():
            continue
        if not (entry.name.startswith("node-") or entry.name.startswith("tpl-")):
            continue
        if _owner_alive(entry / "owner") or _being_made(entry):
            continue
        destroy_node_dir(entry)
        removed.append(entry.name)
    return removed


def ensure_base() -> None:
    """Create BASE (mode 755) and check that every path component is root-owned and not writable by others,
    which sshd requires of a ChrootDirectory."""
    if not BASE.exists():
        BASE.mkdir(mode=0o755, parents=False)
    os.chmod(BASE, 0o755)
    p = BASE
    while True:
        st = os.lstat(p)
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise NodesimUnavailable(f"{p} must be root-owned and not group/world-writable for sshd's chroot")
        if p == p.parent:
            break
        p = p.parent


def new_dir(prefix: str) -> Path:
    ensure_base()
    d = BASE / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    (d / "owner").write_text(owner_token())
    return d


# ----------------------------------------------------------------------------------------------------------
# the template


def _ldd(path: str) -> list[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" (")[0].strip()
            if target.startswith("/"):
                libs.append(target)
        elif line.startswith("/"):
            libs.append(line.split(" (")[0].strip())
    return libs


def _chroot_rel(host_path: str) -> str:
    """Where a host library goes in the merged-/usr chroot (/lib -> usr/lib, /lib64 -> usr/lib64)."""
    rel = host_path.lstrip("/")
    return rel if rel.startswith("usr/") else "usr/" + rel


def _copy_file(src: str, dst: Path, mode: int | None = None) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.realpath(src), dst)
    os.chmod(dst, mode if mode is not None else (os.stat(src).st_mode & 0o777))


_PY_ZIP_BUILDER = r"""
import importlib, importlib.util, marshal, os, sys, sysconfig, zipfile
out_zip, mods = sys.argv[1], sys.argv[2].split(",")
for m in mods:
    importlib.import_module(m)
import encodings, encodings.utf_8, encodings.aliases, encodings.latin_1, encodings.ascii  # noqa
stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
dynload = []
with zipfile.ZipFile(out_zip, "w", zipfile.ZIP_STORED) as zf:
    for name, mod in sorted(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f:
            continue
        f = os.path.realpath(f)
        if f.endswith(".so"):
            dynload.append(f)
            continue
        if not f.startswith(stdlib + os.sep) or not f.endswith(".py"):
            continue
        rel = os.path.relpath(f, stdlib)
        with open(f, "rb") as fh:
            src = fh.read()
        code = compile(src, rel, "exec", dont_inherit=True, optimize=0)
        data = importlib.util.MAGIC_NUMBER + b"\0\0\0\0" + b"\0" * 8 + marshal.dumps(code)
        zf.writestr(rel[:-3] + ".pyc", data)
print("\n".join(dynload))
"""


def _build_python(tpl_root: Path) -> None:
    py = node_python()
    ver = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    prefix = tpl_root / "opt/nodesim/python"
    _copy_file(py, prefix / "bin/python3", 0o755)
    for lib in _ldd(py):
        dst = tpl_root / _chroot_rel(lib)
        if not dst.exists():
            _copy_file(lib, dst, 0o755)
    libdir = prefix / "lib"
    libdir.mkdir(parents=True, exist_ok=True)
    zip_path = libdir / f"python{ver.replace('.', '')}.zip"
    res = subprocess.run([py, "-S", "-c", _PY_ZIP_BUILDER, str(zip_path), ",".join(NODE_PY_IMPORTS)],
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    dyn = libdir / f"python{ver}" / "lib-dynload"
    dyn.mkdir(parents=True, exist_ok=True)
    # the landmark getpath looks for, so PYTHONHOME resolution is unambiguous
    (libdir / f"python{ver}" / "os.py").write_text("# landmark only; the stdlib is in the zip\n")
    for so in filter(None, res.stdout.splitlines()):
        _copy_file(so, dyn / os.path.basename(so), 0o755)
        for lib in _ldd(so):
            dst = tpl_root / _chroot_rel(lib)
            if not dst.exists():
                _copy_file(lib, dst, 0o755)


def _build_template(tpl: Path) -> None:
    root = tpl / "root"
    root.mkdir(mode=0o755)
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "usr/local/bin", "usr/local/sbin", "opt/nodesim"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        os.symlink(target, root / link)

    dash = _first_existing(DASH_CANDIDATES)
    busybox = _first_existing(BUSYBOX_CANDIDATES)
    assert dash and busybox
    _copy_file(dash, root / "usr/bin/dash", 0o755)
    _copy_file(busybox, root / "usr/bin/busybox", 0o755)
    copied = [dash]
    for tool in HOST_TOOLS:
        path = _first_existing((f"/usr/bin/{tool}", f"/bin/{tool}"))
        if path:
            _copy_file(path, root / "usr/bin" / tool, 0o755)
            copied.append(path)
    for binary in copied:
        for lib in _ldd(binary):
            dst = root / _chroot_rel(lib)
            if not dst.exists():
                _copy_file(lib, dst, 0o755)
    for applet in BUSYBOX_APPLETS:
        os.symlink("busybox", root / "usr/bin" / applet)
    os.symlink("dash", root / "usr/bin/sh")

    _build_python(root)

    # simulator scripts and data (copied, never linked to the repo)
    dest = root / "opt/nodesim"
    for sub in ("lib", "shims", "py", "installer"):
        shutil.copytree(NODE_FILES / sub, dest / sub)
    for sub in ("errors", "containerd"):  # what node-side scripts read; the rest of data/ is host-side only
        shutil.copytree(DATA / sub, dest / "data" / sub)
    for p in (dest / "shims").iterdir():
        os.chmod(p, 0o755)
    for p in (dest / "installer").iterdir():
        os.chmod(p, 0o755)


def template() -> Path:
    """The template root for this process (built on first use)."""
    global _template
    with _lock:
        if _template is not None and _template.exists():
            return _template
        reasons = missing_requirements()
        if reasons:
            raise NodesimUnavailable("node simulator unavailable: missing " + "; ".join(reasons))
        cleanup_stale()
        tpl = new_dir("tpl")
        try:
            _build_template(tpl)
        except BaseException:
            _safe_rmtree(tpl)
            raise
        _template = tpl / "root"
        import atexit

        atexit.register(_remove_template, tpl)
        return _template


def _remove_template(tpl: Path) -> None:
    try:
        _safe_rmtree(tpl)
    except Exception:  # noqa: BLE001 - best effort at interpreter exit
        pass


def clone_template(dst_root: Path) -> None:
    """Recreate the template tree at dst_root: directories made, files hardlinked, symlinks copied."""
    src_root = template()
    dst_root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(dst_root, 0o755)
    src_len = len(str(src_root)) + 1
    for dirpath, dirnames, filenames in os.walk(src_root):
        rel = dirpath[src_len:]
        target_dir = dst_root / rel if rel else dst_root
        for d in list(dirnames):
            s = os.path.join(dirpath, d)
            t = target_dir / d
            if os.path.islink(s):
                os.symlink(os.readlink(s), t)
                dirnames.remove(d)
            else:
                t.mkdir(mode=0o755)
        for f in filenames:
            s = os.path.join(dirpath, f)
            t = target_dir / f
            if os.path.islink(s):
                os.symlink(os.readlink(s), t)
            else:
                os.link(s, t)
