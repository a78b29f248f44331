"""SSH to a node with paramiko. The only module that imports paramiko.

Host keys are verified against known_hosts by default (never AutoAddPolicy); `accept_new_host_key` adds an
unknown key (trust on first use) but a changed key is always refused. Every command has a wall-clock deadline
and both output streams are drained together, so large outputs cannot deadlock the channel.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import posixpath
import re
import select
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode import cancel, fixes
from gpunode.connection.base import (
    UPLOAD_DISCARD,
    UPLOAD_INSTALL,
    UPLOAD_RECEIVE,
    Connection,
    Held,
    NoSpaceError,
    ProgressCallback,
    Result,
    parse_received,
)
from gpunode.errors import CommandError, ConnectError, UsageError
from gpunode.record import Frozen, Record
from gpunode.shell import Script, Secret, render


def _installed_version(name: str) -> str | None:
    """What `importlib.metadata.version(name)` answers for a distribution installed the usual way, without importing
    importlib.metadata: the Version header of NAME-*.dist-info/METADATA in the first sys.path directory holding
    metadata of that name. None (ask importlib.metadata) for anything else: a zip or egg on the path, two
    candidates in one directory, an unreadable file, a finder of distributions other than the standard one."""
    import importlib.machinery
    import os

    if any(hasattr(finder, "find_distributions") and finder is not importlib.machinery.PathFinder
           for finder in sys.meta_path):
        return None
    for entry in sys.path:
        directory = entry or "."
        if not os.path.isdir(directory):
            if os.path.exists(directory):
                return None  # a zip file: importlib.metadata reads inside it
            continue
        found = [child for child in os.listdir(directory) if child.lower().startswith(name + "-")
                 or child.lower().startswith(name + ".") or child.lower() == name + ".egg-info"]
        found = [child for child in found if child.lower().endswith((".dist-info", ".egg-info"))]
        if not found:
            continue
        if len(found) > 1 or not found[0].startswith(name + "-") or not found[0].endswith(".dist-info"):
            return None
        try:
            with open(os.path.join(directory, found[0], "METADATA"), encoding="utf-8") as metadata:
                for line in metadata:
                    if line in ("\n", "\r\n"):
                        break
                    if line.startswith("Version:"):
                        return line[len("Version:"):].strip() or None
        except (OSError, UnicodeDecodeError):
            return None
        return None
    return None


def _import_paramiko_without_invoke() -> None:
    """Import paramiko without two imports it does not need for gpunode:
    - paramiko.config imports invoke (~45 ms, most of it importlib.metadata and unittest.mock) only to run
      ssh_config's `Match exec` commands: invoke is hidden; _resolve loads it for the rare config that has a
      Match exec line.
    - paramiko's __init__ reads its own version with importlib.metadata (which imports email, zipfile, csv and
      more: ~4% of a converged install's CPU) for its SSH banner: it is handed a stand-in whose `version` is
      _installed_version's answer, or importlib.metadata's own where that has none. The stand-in is gone once
      paramiko is imported: anything else importing importlib.metadata gets the real one."""
    hide = "invoke" not in sys.modules
    if hide:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # None in sys.modules: ImportError
    stand_in = None
    if "importlib.metadata" not in sys.modules and "paramiko" not in sys.modules:
        import types

        def real() -> Any:  # the real importlib.metadata, imported in the stand-in's place
            if sys.modules.get("importlib.metadata") is stand_in:
                del sys.modules["importlib.metadata"]
            import importlib.metadata as imported
            return imported

        def version(name: str) -> str:
            found = _installed_version(name)
            return real().version(name) if found is None else found

        def anything_else(name: str) -> Any:  # a paramiko that asks more than its version gets the real module's
            return getattr(real(), name)

        stand_in = types.ModuleType("importlib.metadata")
        stand_in.version = version  # type: ignore[attr-defined]
        stand_in.__getattr__ = anything_else  # type: ignore[method-assign]
        sys.modules["importlib.metadata"] = stand_in
    try:
        import paramiko
    finally:
        if hide and sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
        if stand_in is not None and sys.modules.get("importlib.metadata") is stand_in:
            del sys.modules["importlib.metadata"]
    if stand_in is not None and getattr(paramiko, "metadata", None) is stand_in:
        delattr(paramiko, "metadata")  # the name paramiko's __init__ bound it to: no stand-in left behind


_import_paramiko_without_invoke()
import paramiko  # noqa: E402

_known_hosts_lock = threading.Lock()
log = logging.getLogger("gpunode.ssh")
_SHELL_OK = "gpunode-shell-ok"
_AHEAD_STOP = 2.0  # seconds close() waits for connect_ahead's thread to end
SEND_TIMEOUT = 120.0  # seconds a command's stdin may wait for the node to accept more data
# how to go on after a command's fate is unknown: every step re-plans from what it finds on the node
_GO_ON = ("once the node answers again (it may have rebooted or lost its network), check it with "
          + fixes.gpunode("status") + ", then run the same command again: each step starts from what it finds on "
          "the node")
UPLOAD_CHUNK = 1 << 18  # bytes read and sent at a time: one Ctrl-C check and progress call each
# AES-GCM first where both ends offer it: an AEAD cipher is one pass over the data (paramiko's default, aes128-ctr
# with a separate HMAC, is two), which is what keeps a large upload near scp's speed. The rest keep paramiko's order.
_GCM = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

# One long-lived command channel per connection (a channel costs a round trip or two of its own: with one per
# command a driver upgrade opened ~40). The login shell runs this loop once; it reads framed commands from its stdin
# and runs each in a subshell, as sshd would have run it with `$SHELL -c`: with its stdin from /dev/null or exactly
# the bytes sent for it, and its stdout and stderr on the channel's. A frame, client to node:
#   NONCE FEED -          NONCE: fresh random hex per command; FEED 1: a stdin line follows the command
#   the command line's lines, then a line NONCE
#   (FEED 1) the stdin, base64 on one line
# A long ASCII command line comes as `NONCE FEED LENGTH` and its LENGTH bytes instead, read by dd (one read(2)
# never takes more than it asks for, and a short read is read on): the builtin `read` takes a byte per system call,
# which on a probe of ~35 kB costs more than a channel of its own. A frame that ends early (the connection cut
# half way) runs nothing: the loop ends.
# Node to client: the command's output, then on stdout `NONCE CODE` (its exit status, written by the subshell's
# EXIT trap, so a subshell killed by a signal writes none: "ended without an exit status", as before) and
# `NONCE .`, and on stderr `NONCE`. The nonce is never in the command's environment, so nothing it prints (a
# file's content) can end a frame early. Only the builtin `read` (never past a newline) and dd (never past the
# length it asks for) consume the channel's input, so what follows stays for the next frame. The first line,
# `gpunode-serve B64`, proves the login shell runs commands and says whether base64 is there to decode a stdin
# (without it, a command with stdin runs on a channel of its own); `gpunode-serve` on stderr too, so nothing a login
# script printed before it is taken for the first command's output. The client does not wait for it: the channel's
# first command rides in the exec request (serve_command), run as if it had come as the first frame, and the greeting
# is read ahead of its output; only a first command with stdin, or too long a line, comes as a frame, after the
# greeting. A command eval'd by the loop sees the loop's $PPID: sshd's process of this connection, which lives
# exactly as long as the connection; the node lock names it (Connection.lock_owner: a word that becomes "$PPID" in
# the command line, expanded by the loop on the node).
_SERVE_HELLO = b"gpunode-serve "
_SERVE_DD = 2048  # command lines longer than this (bytes) are read by dd, shorter ones by the builtin read
_SERVE_HEAD = r"""if command -v base64 >/dev/null 2>&1; then gpunode_b=1; else gpunode_b=0; fi
echo "gpunode-serve $gpunode_b"; echo gpunode-serve >&2
gpunode_frame() { printf '%s %s\n' "$gpunode_n" "$1"; }
gpunode_run() {
  if [ "$gpunode_f" = 1 ]; then
    IFS= read -r gpunode_l || exit 0
    printf %s "$gpunode_l" | base64 -d | ( trap 'gpunode_frame $?' EXIT; eval "$gpunode_c" )
  else
    ( trap 'gpunode_frame $?' EXIT; eval "$gpunode_c" ) </dev/null
  fi
  printf '%s .\n' "$gpunode_n"; printf '%s\n' "$gpunode_n" >&2
}
"""
_SERVE_LOOP = r"""while IFS= read -r gpunode_h; do
  gpunode_n=${gpunode_h%% *}; gpunode_h=${gpunode_h#* }; gpunode_r=${gpunode_h#* }; gpunode_c=
  if [ "$gpunode_r" = - ]; then
    while :; do
      IFS= read -r gpunode_l || exit 0
      [ "$gpunode_l" = "$gpunode_n" ] && break
      gpunode_c="$gpunode_c$gpunode_l
"
    done
  else
    while [ "$gpunode_r" -gt 0 ]; do
      gpunode_l=$(dd bs="$gpunode_r" count=1 2>/dev/null; echo x); gpunode_l=${gpunode_l%x}
      [ -n "$gpunode_l" ] || exit 0
      gpunode_c=$gpunode_c$gpunode_l; gpunode_r=$((gpunode_r - ${#gpunode_l}))
    done
  fi
  gpunode_f=${gpunode_h%% *}; gpunode_run
done
"""
_SERVE = _SERVE_HEAD + _SERVE_LOOP
# The first command of a channel rides in the exec request itself when it has no stdin and the request's command (the
# loop with the line quoted into it) is at most this long (bytes): OpenSSH opens a session channel's window only once
# the command started, so a frame sent after the request waits a round trip for it. That command is a single
# argument of `$SHELL -c` (Linux: 128 KiB at most).
_SERVE_INLINE = 120 * 1024


def serve_command(first: tuple[bytes, str] | None = None) -> str:
    """The command the channel's exec request runs: the loop, with `first` (nonce, command line) run before it as
    if it had come as a frame without stdin."""
    if first is None:
        return _SERVE
    nonce, line = first
    return (_SERVE_HEAD + f"gpunode_n={nonce.decode()}; gpunode_f=0; gpunode_c={shlex.quote(line)}\ngpunode_run\n"
            + _SERVE_LOOP)


def gcm_first(ciphers: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in _GCM if c in ciphers) + tuple(c for c in ciphers if c not in _GCM)


class _LoginAtOnce(paramiko.auth_handler.AuthHandler):
    """paramiko's client login by key, with the login request sent right behind the service request instead of after
    sshd's acceptance of it: one round trip less. sshd handles a connection's messages in order, and its answer to
    the service request (ssh-userauth) is what readies it for the login request that follows. For an RSA key whose
    signature algorithm depends on the server's server-sig-algs not yet received, paramiko's own order is kept."""

    _sent_early = False

    def _request_auth(self) -> None:
        super()._request_auth()  # type: ignore[misc]  # paramiko's private hook (typeshed leaves it out)
        key = self.private_key
        if self.auth_method != "publickey" or key is None:
            return
        kind = self._get_key_type_and_bits(key)[0]  # type: ignore[attr-defined]
        if "rsa" in kind and "server-sig-algs" not in self.transport.server_extensions:  # type: ignore[attr-defined]
            return
        accepted = paramiko.Message()
        accepted.add_string("ssh-userauth")
        accepted.rewind()
        super()._parse_service_accept(accepted)  # type: ignore[misc]  # paramiko's own login request, as on acceptance
        self._sent_early = True
        if isinstance(self.transport, _Transport):
            self.transport.open_early()

    def _parse_service_accept(self, m: paramiko.Message) -> None:
        if not self._sent_early:
            super()._parse_service_accept(m)  # type: ignore[misc]


# the private hooks _LoginAtOnce relies on (paramiko 2.9 to 5.x have them all); without them, paramiko's own order
_LOGIN_AT_ONCE_HOOKS = all(hasattr(paramiko.auth_handler.AuthHandler, name)
                           for name in ("_request_auth", "_parse_service_accept", "_get_key_type_and_bits"))


class _Transport(paramiko.Transport):
    """paramiko's Transport whose login by key is _LoginAtOnce (every auth_* method makes a fresh AuthHandler).
    With `session_early`, the command channel's request to open follows the login request at once, from a thread
    of its own (paramiko's open_session waits for its answer): RFC 4252 5.1 has a server pass what follows the
    request that logs in to the service, and OpenSSH's sshd does. Only where this connection tries one key and
    nothing else: a refused key ends the connection (the next key has one of its own), so the request never
    meets a second login attempt."""

    session_early = False
    _early: tuple[threading.Thread, dict[str, Any]] | None = None
    _early_done = False

    def open_early(self) -> None:
        if not self.session_early or self._early is not None or self._early_done:
            return
        box: dict[str, Any] = {}

        def opener() -> None:
            try:  # sent once the login request went (the caller holds the transport's lock until then)
                box["chan"] = self.open_session(timeout=30)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                box["error"] = exc

        thread = threading.Thread(target=opener, name="gpunode-session-early", daemon=True)
        self._early = (thread, box)
        thread.start()

    def early_session(self) -> paramiko.Channel | None:
        """The channel opened behind the login request, the first time it is asked for (None: none was opened,
        or the node refused it: the caller opens one as usual)."""
        if self._early is None or self._early_done:
            return None
        thread, box = self._early
        self._early_done = True
        thread.join(30)
        chan = box.get("chan")
        return chan if chan is not None and not chan.closed else None

    @property
    def auth_handler(self) -> paramiko.auth_handler.AuthHandler | None:
        return self.__dict__.get("_gpunode_auth_handler")

    @auth_handler.setter
    def auth_handler(self, handler: paramiko.auth_handler.AuthHandler | None) -> None:
        if type(handler) is paramiko.auth_handler.AuthHandler and _LOGIN_AT_ONCE_HOOKS:
            handler.__class__ = _LoginAtOnce
        self.__dict__["_gpunode_auth_handler"] = handler


def _transport(sock: str | tuple[str, int] | socket.socket | paramiko.Channel | paramiko.ProxyCommand,
               session_early: bool = False, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport with the cipher order above (the keywords differ between paramiko 3 and 5), the
    login request sent at once (_LoginAtOnce) and, with `session_early`, the channel's request behind it."""
    transport = _Transport(sock, **kwargs)
    transport.session_early = session_early
    options = transport.get_security_options()
    options.ciphers = gcm_first(tuple(options.ciphers))
    return transport


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class _AckingSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (TCP_QUICKACK, set again after every read: the kernel
    drops it by itself). sshd leaves Nagle's algorithm on for a session without a terminal, so after one small
    packet it holds the next until the first is acknowledged, and a receiver with nothing to send delays that ACK
    by up to 40 ms. Every converged run waited so right after login: the command channel's confirmation sat behind
    sshd's hostkeys and debug messages for ~40 ms (OpenSSH's own client waits there, and once more in its login)."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        try:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # type: ignore[arg-type]  # set where it is not None
        except OSError:
            pass  # closed meanwhile by Transport.close: the next read says so
        return data


def _tcp_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection with TCP_NODELAY: without it every small packet after the first (each command's request,
    each reply) waits on Nagle's algorithm for the peer's delayed ACK, ~40 ms a round trip. It acknowledges at
    once too, where the system can (_AckingSocket), which spares the node's sshd the same wait. An ASCII host name
    is handed to the resolver as bytes, as Python's idna codec would encode it; that codec is imported only for
    a name that needs it (its import is ~2 ms of a converged install's CPU)."""
    address = host.encode("ascii") if host.isascii() else host  # getaddrinfo takes bytes too (typeshed says str)
    sock = socket.create_connection((address, port), timeout=timeout)  # type: ignore[arg-type]
    if _QUICKACK is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock = _AckingSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        sock.settimeout(timeout)
    nodelay(sock)
    return sock


def nodelay(sock: object) -> None:
    """TCP_NODELAY on a TCP socket; anything else (a jump host's channel, a ProxyCommand pipe) is left alone."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _ToGpunodeLog(logging.Handler):
    """paramiko's transport thread logs tracebacks at ERROR while a node reboots or a port forward answers for
    a node that is down. Those records belong in gpunode's log at DEBUG, never on the terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s", record.name, record.getMessage())


def _route_paramiko_logging() -> None:
    paramiko_log = logging.getLogger("paramiko")
    if not any(isinstance(h, _ToGpunodeLog) for h in paramiko_log.handlers):
        paramiko_log.addHandler(_ToGpunodeLog())
    paramiko_log.propagate = False  # never reaches the root logger, nor logging's last-resort stderr handler
    root = logging.getLogger("gpunode")
    if not root.handlers:
        root.addHandler(logging.NullHandler())


_route_paramiko_logging()


@dataclass(frozen=True, eq=False, repr=False)
class SSHTarget(Frozen):
    """`[user@]host[:port]` as the user typed it; `[v6addr]:port` for IPv6."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> SSHTarget:
        raw = text.strip()
        if not raw or any(c.isspace() for c in raw):
            raise UsageError(f"invalid --host {text!r}", fix="use [user@]host[:port], e.g. ubuntu@gpu-01:22")
        user = None
        if "@" in raw:
            user, raw = raw.rsplit("@", 1)
            if not user:
                raise UsageError(f"invalid --host {text!r}: empty user name", fix="use [user@]host[:port]")
        port_text = None
        if raw.startswith("["):
            host, sep, rest = raw[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise UsageError(f"invalid --host {text!r}", fix="write IPv6 addresses as [addr]:port")
            port_text = rest[1:] or None
        elif raw.count(":") == 1:
            host, port_text = raw.split(":")
        else:
            host = raw
        if not host:
            raise UsageError(f"invalid --host {text!r}: no host name", fix="use [user@]host[:port]")
        port = None
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise UsageError(f"invalid port in --host {text!r}", fix="the port must be a number from 1 to 65535")
            port = int(port_text)
        return cls(host, user, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}{':' + str(self.port) if self.port else ''}"


@dataclass(eq=False, repr=False)
class SSHOptions(Record):
    identity: list[str] = field(default_factory=list)
    known_hosts: list[str] = field(default_factory=list)
    accept_new_host_key: bool = False
    ssh_config: str | None = None  # None: ~/.ssh/config when it exists
    password: Secret | None = None
    connect_timeout: float = 15.0


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _known_host_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _UnknownHostKey(Exception):
    def __init__(self, key: paramiko.PKey) -> None:
        super().__init__("unknown host key")
        self.key = key


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or with accept-new record them in `save_to` first."""

    def __init__(self, accept_new: bool, save_to: Path) -> None:
        self.accept_new = accept_new
        self.save_to = save_to

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise _UnknownHostKey(key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.save_to, "a", encoding="utf-8") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


# known_hosts files as parsed, by path, with the text they were parsed from: a fleet run connects to every node of
# an inventory whose known_hosts has a line per node, and parsing each file once per connection made that N x N
# key decodes (~90 us each: ~1 s of CPU for 100 nodes). Reading the text again is cheap; only a changed text is
# parsed again.
_parsed_known_hosts: dict[Path, tuple[str, list[tuple[str, paramiko.PKey]]]] = {}


def _known_host_entries(path: Path) -> list[tuple[str, paramiko.PKey]]:
    """(host name, key) of each usable line of a known_hosts file; one malformed line does not discard the rest."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    with _known_hosts_lock:
        cached = _parsed_known_hosts.get(path)
    if cached is not None and cached[0] == text:
        return cached[1]
    entries: list[tuple[str, paramiko.PKey]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
        except Exception:  # noqa: BLE001 - paramiko raises several unrelated types on bad lines
            continue
        if entry is None or entry.key is None:
            continue
        entries += [(name, entry.key) for name in entry.hostnames]
    with _known_hosts_lock:
        _parsed_known_hosts[path] = (text, entries)
    return entries


def _load_known_hosts(client: paramiko.SSHClient, paths: list[Path]) -> None:
    keys = client.get_host_keys()
    for path in paths:
        for name, key in _known_host_entries(path):
            keys.add(name, key.get_name(), key)


@dataclass(eq=False, repr=False)
class _Resolved(Record):
    host: str
    port: int
    user: str
    identities: list[str]
    known_hosts: list[Path]
    proxy_jump: str | None
    proxy_command: str | None
    label: str


_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def _load_invoke() -> None:
    """What paramiko.config runs a `Match exec` command with (see _import_paramiko_without_invoke)."""
    import paramiko.config

    if getattr(paramiko.config, "invoke", None) is None:
        import invoke

        paramiko.config.invoke = invoke  # type: ignore[attr-defined]


def _resolve(target: SSHTarget, options: SSHOptions) -> _Resolved:
    """Apply ~/.ssh/config (Host alias, HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile)."""
    config = paramiko.SSHConfig()
    config_path = Path(options.ssh_config).expanduser() if options.ssh_config else Path("~/.ssh/config").expanduser()
    if options.ssh_config and not config_path.is_file():
        raise UsageError(f"ssh config {config_path} does not exist", fix="check the --ssh-config path")
    if config_path.is_file():
        try:
            config = paramiko.SSHConfig.from_path(str(config_path))
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"cannot parse {config_path}: {exc}", fix="fix the ssh config file") from exc
        if _MATCH_EXEC.search(config_path.read_text(errors="replace")):
            _load_invoke()
    entry = config.lookup(target.host)
    host = entry.get("hostname", target.host)
    port = target.port or int(entry.get("port", 22))
    user = target.user or entry.get("user") or os.environ.get("USER") or "root"
    identities = list(options.identity) or [os.path.expanduser(p) for p in entry.get("identityfile", [])
                                            if os.path.exists(os.path.expanduser(p))]
    known = [Path(p).expanduser() for p in options.known_hosts]
    for value in entry.get("userknownhostsfile", "").split():
        known.append(Path(value).expanduser())
    known.append(Path("~/.ssh/known_hosts").expanduser())
    jump = entry.get("proxyjump")
    if jump and jump.lower() == "none":
        jump = None
    command = entry.get("proxycommand")
    if command and command.lower() == "none":
        command = None
    return _Resolved(host, port, user, identities, known, jump, command, f"{user}@{_known_host_name(host, port)}")


class SSHConnection(Connection):
    def __init__(self, target: SSHTarget | str, options: SSHOptions | None = None, *,
                 become_password: Secret | None = None) -> None:
        super().__init__(become_password=become_password)
        self.target = SSHTarget.parse(target) if isinstance(target, str) else target
        self.options = options or SSHOptions()
        self.resolved = _resolve(self.target, self.options)
        self.name = str(self.target)
        self._client: paramiko.SSHClient | None = None
        self._jump: SSHConnection | None = None
        self._shell_unchecked = False  # the login-shell check rides on the next command (connect(defer_checks))
        self._serve: paramiko.Channel | None = None  # the command channel (_SERVE), opened by the first command
        self._serve_b64 = False  # the node can decode a command's stdin sent on it
        self._serve_greeted = False  # the command channel's greeting was read (it follows the first frame's send)
        # the word a command line carries where the node should put the pid of sshd's process of this connection
        # (lock_owner): the command loop's $PPID, expanded on the node; random, so no other text is taken for it
        self._owner_word = f"gpunode.owner.{os.urandom(8).hex()}"
        self._serve_busy = threading.Lock()  # one command at a time on it; another thread's gets its own channel
        self._ahead: _Ahead | None = None  # connect_ahead's thread, until the first use waits for it
        self._ahead_error: BaseException | None = None  # what connecting raised there, raised again by that use
        self._connecting: Any = None  # the socket a login uses while it is made: shut to stop connect_ahead's

    # -- connecting ------------------------------------------------------------------------------------
    def connect(self, *, defer_checks: bool = False) -> SSHConnection:
        """Log in and check that the login shell runs commands. With `defer_checks` that check (and learning
        whether the login user is root) rides on the first command instead of costing round trips of its own:
        `gpunode plan` and `doctor` then open exactly one SSH channel, the probe."""
        self._await_ahead()
        if self._client is not None:
            return self
        cancel.check_abort(f"connecting to {self.name}")  # a thread whose run was aborted starts no login
        r = self.resolved
        client = paramiko.SSHClient()
        _load_known_hosts(client, r.known_hosts)
        save_to = r.known_hosts[0]
        client.set_missing_host_key_policy(_HostKeyPolicy(self.options.accept_new_host_key, save_to))
        sock: socket.socket | paramiko.Channel | paramiko.ProxyCommand | None = None
        if r.proxy_jump:
            jump_target = SSHTarget.parse(r.proxy_jump.split(",")[0])
            jump_options = SSHOptions(known_hosts=self.options.known_hosts,
                                      accept_new_host_key=self.options.accept_new_host_key,
                                      ssh_config=self.options.ssh_config,
                                      connect_timeout=self.options.connect_timeout)
            self._jump = SSHConnection(jump_target, jump_options).connect()
            assert self._jump._client is not None
            transport = self._jump._client.get_transport()
            assert transport is not None
            try:
                sock = transport.open_channel("direct-tcpip", (r.host, r.port), ("127.0.0.1", 0),
                                              timeout=self.options.connect_timeout)
            except Exception as exc:  # noqa: BLE001
                raise ConnectError(f"{self.name}: jump host {jump_target} could not reach {r.host}:{r.port}: {exc}",
                                   fix="check the ProxyJump host can reach the node") from exc
        elif r.proxy_command:
            sock = paramiko.ProxyCommand(r.proxy_command.replace("%h", r.host).replace("%p", str(r.port)))
        keys, encrypted = _load_keys(self.name, r.identities)
        password = self.options.password.value if self.options.password else None
        explicit = bool(r.identities) or password is not None
        # one key and nothing else per connection: the command channel may be asked for right behind the login
        single = explicit and not encrypted and password is None

        def factory(sock: Any, **kwargs: Any) -> paramiko.Transport:
            return _transport(sock, session_early=single, **kwargs)

        started = time.monotonic()
        try:
            for index, key in enumerate(keys or [None]):
                try:
                    if not (r.proxy_jump or r.proxy_command):
                        sock = _tcp_socket(r.host, r.port, self.options.connect_timeout)
                    self._connecting = sock
                    if sock is not None and _Ahead.abandoned_here():
                        _shut(sock)  # closed meanwhile (close() may have missed this socket): stop
                    client.connect(
                        r.host, port=r.port, username=r.user, pkey=key, password=password,
                        # An encrypted identity is expected to be in the agent; otherwise no guessing, so
                        # MaxAuthTries is not spent on unrelated keys.
                        allow_agent=encrypted or not explicit, look_for_keys=not explicit,
                        timeout=self.options.connect_timeout, banner_timeout=self.options.connect_timeout,
                        auth_timeout=30, channel_timeout=30, sock=sock, transport_factory=factory,
                    )
                    break
                except paramiko.AuthenticationException:
                    if index + 1 >= len(keys) or r.proxy_jump or r.proxy_command:
                        raise
                    client.close()
        except _UnknownHostKey as exc:
            client.close()
            raise ConnectError(
                f"{self.name}: host key of {_known_host_name(r.host, r.port)} is not in known_hosts "
                f"({exc.key.get_name()} {fingerprint(exc.key)})",
                fix="verify the fingerprint out of band, then re-run with --accept-new-host-key "
                    "(or add it with ssh-keyscan to ~/.ssh/known_hosts)") from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise ConnectError(
                f"{self.name}: host key of {_known_host_name(r.host, r.port)} has CHANGED "
                f"(now {exc.key.get_name()} {fingerprint(exc.key)}); refusing to connect: this may be an attack",
                fix=f"if the node was reinstalled, remove the old key with: ssh-keygen -R "
                    f"'{_known_host_name(r.host, r.port)}'") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise ConnectError(f"{self.name}: the private key is encrypted",
                               fix="load it into ssh-agent (`ssh-add " + shlex.join(self.options.identity or ["~/.ssh/id_ed25519"])
                                   + "`, which asks for its passphrase once) and run again") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise ConnectError(f"{self.name}: authentication failed for user {r.user} ({exc})",
                               fix="check the user and key (--identity), or use --ask-pass") from None
        except socket.gaierror:
            client.close()
            raise ConnectError(f"{self.name}: cannot resolve host name {r.host}",
                               fix="check the host name or your ~/.ssh/config HostName") from None
        except TimeoutError:
            client.close()
            raise ConnectError(f"{self.name}: timed out after {self.options.connect_timeout:.0f}s connecting "
                               f"to {r.host}:{r.port}",
                               fix="check the node is up and reachable, or raise --connect-timeout") from None
        except (paramiko.SSHException, EOFError) as exc:
            client.close()
            raise _ssh_failure(self.name, r, exc, time.monotonic() - started, self.options.connect_timeout) from None
        except OSError as exc:
            client.close()
            reasons = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one error per address
            reason = "; ".join(sorted({e.strerror or str(e) for e in reasons.values()})) if reasons else None
            raise ConnectError(f"{self.name}: cannot connect to {r.host}:{r.port}: {reason or exc.strerror or exc}",
                               fix="check the node is up, the port is right and sshd is running") from None
        finally:
            self._connecting = None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self._client = client
        if defer_checks:
            self._shell_unchecked = True
            return self
        try:
            self._check_login_shell()
        except BaseException:
            self.close()
            raise
        return self

    def connect_ahead(self) -> SSHConnection:
        """`connect(defer_checks=True)` in a thread of its own; returns at once, so that the caller's own work
        (imports, building the first command) overlaps the network's round trips. The first use (a command, an
        upload, `connect`) waits for that thread and raises what connecting raised, as `connect` would have; `close`
        stops it. Host keys are checked exactly as `connect` checks them."""
        if self._client is None and self._ahead is None:
            self._ahead = _Ahead(target=self._connect_ahead, name=f"gpunode-connect {self.name}", daemon=True)
            self._ahead.start()
        return self

    def _connect_ahead(self) -> None:
        """The login (and, behind its request, the command channel's open: _LoginAtOnce, _Transport.open_early); the
        first command then rides in the exec request that starts the command loop, so nothing more is done ahead."""
        try:
            self.connect(defer_checks=True)
        except BaseException as exc:  # noqa: BLE001 - raised again in the thread that uses the connection
            self._ahead_error = exc
            return
        if _Ahead.abandoned_here():  # closed meanwhile: nothing may outlive that close
            self.close()

    def wait_connected(self) -> None:
        self._await_ahead()

    def _await_ahead(self) -> None:
        """Wait for connect_ahead's thread (a Ctrl-C interrupts the wait) and raise what it raised."""
        ahead = self._ahead
        if ahead is None or ahead is threading.current_thread():
            return
        ahead.join()
        self._ahead = None
        error, self._ahead_error = self._ahead_error, None
        if error is not None:
            raise error

    def _stop_ahead(self) -> None:
        """Stop connect_ahead's thread if it still runs (close, a Ctrl-C, an error meanwhile): it is told, the login's
        stream is shut, and it is waited for a moment; whatever it still opens it closes itself."""
        ahead = self._ahead
        if ahead is None or ahead is threading.current_thread():
            return
        ahead.abandoned = True
        if self._connecting is not None:
            _shut(self._connecting)  # the login in that thread reads the end of the stream and fails at once
        ahead.join(_AHEAD_STOP)  # a daemon: one stuck in the kernel's TCP connect ends with the process
        self._ahead, self._ahead_error = None, None

    def _learns_root_inline(self) -> bool:
        return True

    def _check_login_shell(self) -> None:
        """sshd runs every command through the user's login shell: nologin/false accept the login and then
        refuse to run anything. Say so now rather than failing later with a confusing probe error."""
        assert self._client is not None
        transport = self._client.get_transport()
        assert transport is not None
        try:
            self._greet(transport, self._start_serving(transport))  # the command channel's greeting is the proof
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectError(f"{self.name}: the SSH connection dropped right after login ({exc})",
                               fix="check the node and run again") from None

    def _shell_refuses(self, code: int, out: bytes, err: bytes) -> ConnectError:
        said = (err or out).decode("utf-8", "replace").strip().splitlines()
        detail = f" (it said: {said[0][:200]!r})" if said else f" (exit code {code})"
        user = self.resolved.user
        return ConnectError(f"{self.name}: the login shell of {user} refuses to run commands{detail}",
                            fix=f"log in as a user with a shell (e.g. --host {shlex.quote('root@' + str(self.resolved.host))}), or give {user} one on "
                                f"the node: chsh -s /bin/sh {user}")

    def close(self) -> None:
        self._stop_ahead()
        self._serve = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def reconnect(self, timeout: float) -> None:
        """Connect again, retrying until `timeout` (the node may be rebooting)."""
        self.close()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            cancel.check_abort(f"waiting for {self.name} to come back")
            try:
                self.connect()
                return
            except ConnectError as exc:
                if "host key" in exc.message or "authentication" in exc.message or "login shell" in exc.message:
                    raise
                last = exc
                log.debug("%s: not back yet: %s", self.name, exc.message)
                cancel.sleep(1.0)
        raise ConnectError(f"{self.name}: did not come back within {timeout:.0f}s ({last})",
                           fix="check the node's console; raise --reboot-timeout if it boots slowly")

    # -- running ---------------------------------------------------------------------------------------
    def _transport(self) -> paramiko.Transport:
        """The live transport, connecting (again) first when needed: safe, since nothing is running yet."""
        self.connect()
        assert self._client is not None
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            self.close()
            try:
                self.connect()
            except ConnectError as exc:
                raise ConnectError(f"{self.name}: the SSH connection was lost and could not be re-established "
                                   f"({exc.message})", fix="check the node and run again") from None
            assert self._client is not None
            transport = self._client.get_transport()
            if transport is None or not transport.is_active():
                raise ConnectError(f"{self.name}: the SSH connection was lost", fix="check the node and run again")
        return transport

    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        transport = self._transport()
        try:
            if self._serve_busy.acquire(blocking=False):
                try:
                    chan = self._serving(transport, line, stdin)
                    if not stdin or self._serve_b64:
                        try:
                            return self._exec_framed(transport, chan, line, stdin, timeout)
                        except _Unsent:
                            # the frame never reached the node whole, so nothing ran: connect again (or say why
                            # that fails) and send it once more
                            self.close()
                            transport = self._transport()
                            chan = self._serving(transport, line, stdin)
                        try:
                            return self._exec_framed(transport, chan, line, stdin, timeout)
                        except _Unsent as again:
                            raise again.cause from None
                finally:
                    self._serve_busy.release()
            if self._shell_unchecked:
                return self._exec_checking_shell(transport, line, stdin, timeout)
            return self._exec_on(transport, line, stdin, timeout)
        except KeyboardInterrupt:
            raise cancel.Cancelled(f"{self.name}: interrupted (Ctrl-C) while a command was running on the node; "
                                   "it may still be running there",
                                   fix=fixes.CHECK_AND_RERUN) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A reset or a closed transport mid-command (a reboot, a network drop) is a connection problem.
            raise ConnectError(f"{self.name}: the SSH connection dropped while a command was running on the node ({exc})",
                               fix="the node may have rebooted or lost its network; run again") from None

    def _start_serving(self, transport: paramiko.Transport,
                       first: tuple[bytes, str] | None = None) -> paramiko.Channel:
        """Open the command channel and ask for the loop, running `first` (nonce, command line) before it, without
        waiting for the answer: the loop's greeting is read with the first command's output (_collect_framed) or
        by `_greet`."""
        early = transport.early_session() if isinstance(transport, _Transport) else None
        chan = early if early is not None else transport.open_session(timeout=30)
        try:
            chan.settimeout(SEND_TIMEOUT)
            _exec_request(chan, serve_command(first))
        except BaseException:
            _drop(chan)
            if self._shell_unchecked:
                self.close()
            raise
        self._serve, self._serve_greeted = chan, False
        return chan

    def _greet(self, transport: paramiko.Transport, chan: paramiko.Channel) -> None:
        """Wait for the command loop's greeting (nothing was sent on the channel yet); a login shell that refuses to
        run commands (nologin, false) is named here, which is the login-shell check."""
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + 30
        try:
            while True:
                _drain(chan, out, err)
                split = _split_greeting(out, err)
                if split is not None:
                    break
                ended = (chan.closed or chan.eof_received) and not (chan.recv_ready() or chan.recv_stderr_ready())
                if ended or time.monotonic() > deadline or not transport.is_active():
                    raise self._ended_before_greeting(transport, chan, out, err)
                cancel.check_abort(f"connecting to {self.name}")
                select.select([chan], [], [], 0.05)
        except BaseException:
            self._serve = None
            _drop(chan)
            if self._shell_unchecked:
                self.close()
            raise
        self._greeted(split)

    def _greeted(self, split: tuple[bytes, bytes, bytes]) -> None:
        self._shell_unchecked = False
        self._serve_greeted = True
        self._serve_b64 = split[0].split()[:1] == [b"1"]

    def _ended_before_greeting(self, transport: paramiko.Transport, chan: paramiko.Channel, out: bytearray,
                               err: bytearray) -> Exception:
        """Why the command channel ended (or went quiet for 30 s) without the loop's greeting."""
        if not transport.is_active():
            return self._dropped()
        if chan.closed and not chan.event_ready:  # sshd answered the exec request with a failure: nothing ran
            return ConnectError(f"{self.name}: the node's sshd refused to start a command on a new channel",
                                fix="check sshd's log on the node (MaxSessions, ForceCommand, a failing "
                                    "PAM session), then run again")
        code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        return self._shell_refuses(code, bytes(out), bytes(err))

    def lock_owner(self) -> str | None:
        """sshd's process of this connection on the node (the command loop's parent): it ends when the connection
        does (gpunode done, killed, the network gone), whichever channel is open, so a lock naming it lives exactly
        as long as this connection. It is a word of the command line that the node itself turns into that pid
        (the loop's $PPID: see _SERVE), so taking the lock needs no round trip before it."""
        return self._owner_word

    def _serving(self, transport: paramiko.Transport, line: str, stdin: bytes) -> paramiko.Channel | None:
        """The command channel for a command, opened (again) when there is none or it ended, and greeted when the
        command has stdin (whether the node can decode it). None: there is none, and the command is to ride in the
        exec request that opens it (_exec_framed)."""
        chan = self._serve
        if chan is not None and (chan.closed or chan.eof_received or chan.exit_status_ready()
                                 or chan.get_transport() is not transport):
            _drop(chan)
            chan = self._serve = None
        if chan is None and not stdin and len(serve_command((b"", self._owned(line))).encode()) <= _SERVE_INLINE:
            return None
        if chan is None:
            chan = self._start_serving(transport)
        if stdin and not self._serve_greeted:
            self._greet(transport, chan)
        return chan

    def _owned(self, line: str) -> str:
        """`line` with lock_owner's word as the node's "$PPID": expanded by the shell that runs the line (the command
        loop, or the login shell of a channel of its own), whose parent is sshd's process of this connection."""
        return line.replace(self._owner_word, '"$PPID"') if self._owner_word in line else line

    def _exec_framed(self, transport: paramiko.Transport, chan: paramiko.Channel | None, line: str, stdin: bytes,
                     timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """Run one command on the command channel (see _SERVE): the same deadline, Ctrl-C checks and drop
        detection as a channel of its own. A command that times out, is interrupted or fails to frame takes the
        channel with it (closed, as its own channel would be); the next command opens a fresh one."""
        nonce = os.urandom(16).hex().encode()
        if chan is None:  # the channel's first command: it rides in the exec request that starts the loop
            try:
                chan = self._start_serving(transport, (nonce, self._owned(line)))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise _Unsent(exc) from None  # the request never went whole, or no channel opened: nothing ran
            return self._collected(transport, chan, nonce, timeout)
        text = self._owned(line).encode()
        if len(text) > _SERVE_DD and text.isascii():
            head, body = f" {len(text)}\n".encode(), text  # ASCII: the shell's ${#} counts bytes in any locale
        else:
            head, body = b" -\n", text + b"\n" + nonce + b"\n"
        try:
            try:
                chan.settimeout(SEND_TIMEOUT)
                chan.sendall(nonce + (b" 1" if stdin else b" 0") + head + body)
                if stdin:
                    self._send_stdin(chan, base64.b64encode(stdin) + b"\n")
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not self._serve_greeted and transport.is_active():
                    # the channel ended under a first frame: a shell that refuses commands, or sshd refused the loop
                    out, err = bytearray(), bytearray()
                    _drain(chan, out, err)
                    if _split_greeting(out, err) is None:
                        raise self._ended_before_greeting(transport, chan, out, err) from None
                raise _Unsent(exc) from None  # the loop runs only a whole frame: this one ran nothing
        except BaseException:
            self._serve = None
            _drop(chan)
            raise
        return self._collected(transport, chan, nonce, timeout)

    def _collected(self, transport: paramiko.Transport, chan: paramiko.Channel, nonce: bytes,
                   timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """_collect_framed; a command that times out or fails takes the channel with it."""
        try:
            result = self._collect_framed(transport, chan, nonce, timeout)
        except BaseException:
            self._serve = None
            _drop(chan)
            if not self._serve_greeted and self._shell_unchecked:
                self.close()
            raise
        if result[3] or result[0] == -1:
            self._serve = None
            _drop(chan)
        return result

    def _collect_framed(self, transport: paramiko.Transport, chan: paramiko.Channel, nonce: bytes,
                        timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """Read both streams until the command's end marks (`NONCE .` on stdout, `NONCE` on stderr), the
        channel ends or `timeout` passes. On a channel not yet greeted, the loop's greeting comes first: what
        precedes it and it are not the command's; a channel that ends (or stays silent 30 s) without it is a
        login shell that refuses commands."""
        out, err = bytearray(), bytearray()
        out_end, err_end = nonce + b" .\n", nonce + b"\n"
        out_at = err_at = -1
        out_seen = err_seen = 0  # searched up to here (less a mark's length): a large output is scanned once
        now = time.monotonic()
        deadline = now + timeout if timeout else None
        greeting_by = None if self._serve_greeted else now + 30
        while True:
            drained = _drain(chan, out, err)
            if out_at < 0:
                out_at = out.find(out_end, max(0, out_seen - len(out_end)))
                out_seen = len(out)
            if err_at < 0:
                err_at = err.find(err_end, max(0, err_seen - len(err_end)))
                err_seen = len(err)
            if greeting_by is not None:
                split = _split_greeting(out, err)
                if split is not None:
                    greeting_by = None
                    self._greeted(split)
                    skip_out, skip_err = len(out) - len(split[1]), len(err) - len(split[2])
                    del out[:skip_out], err[:skip_err]  # the marks cannot be in what precedes the greeting
                    out_at, out_seen = (out_at - skip_out if out_at >= 0 else -1), max(0, out_seen - skip_out)
                    err_at, err_seen = (err_at - skip_err if err_at >= 0 else -1), max(0, err_seen - skip_err)
            if out_at >= 0 and err_at >= 0 and greeting_by is None:
                break
            if (chan.closed or chan.eof_received) and not (chan.recv_ready() or chan.recv_stderr_ready()):
                # the loop itself ended mid-command (killed on the node, its session cut), or never started
                if greeting_by is not None:
                    raise self._ended_before_greeting(transport, chan, out, err)
                _drop(chan)
                if not _outlives(transport):
                    raise self._dropped()
                raise self._no_status(_upto(out, nonce), _upto(err, nonce))
            if greeting_by is not None and time.monotonic() > greeting_by:
                raise self._ended_before_greeting(transport, chan, out, err)
            if deadline is not None and time.monotonic() > deadline:
                return -1, _upto(out, nonce), _upto(err, nonce), True
            if not transport.is_active():
                raise self._dropped()
            cancel.check_abort(f"running a command on {self.name}")
            if not drained:
                select.select([chan], [], [], 0.05)
        stdout, _, tail = bytes(out[:out_at]).partition(nonce)
        code = tail.split(b"\n", 1)[0].strip()
        if not code.isdigit():  # no status from the subshell: it was killed, or its session is being cut
            if not _outlives(transport):
                raise self._dropped()
            raise self._no_status(stdout, bytes(err[:err_at]))
        return int(code), stdout, bytes(err[:err_at]), False

    def _exec_checking_shell(self, transport: paramiko.Transport, line: str, stdin: bytes,
                             timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """The deferred login-shell check: a marker on stderr before the command proves the shell ran it."""
        code, out, err, timed_out = self._exec_on(transport, f"echo {_SHELL_OK} >&2; {line}", stdin, timeout)
        marker = _SHELL_OK.encode() + b"\n"
        if not err.startswith(marker):
            self.close()
            raise self._shell_refuses(code, out, err)
        self._shell_unchecked = False
        return code, out, err[len(marker):], timed_out

    def _exec_on(self, transport: paramiko.Transport, line: str, stdin: bytes,
                 timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        chan = transport.open_session(timeout=30)
        try:
            return self._run_on(transport, chan, line, stdin, timeout)
        except BaseException:
            chan.close()
            raise

    def _run_on(self, transport: paramiko.Transport, chan: paramiko.Channel, line: str, stdin: bytes,
                timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        chan.settimeout(SEND_TIMEOUT)  # bounds exec_command and sendall; reading below polls
        chan.exec_command(line)
        if stdin:
            self._send_stdin(chan, stdin)
        chan.shutdown_write()
        return self._collect(transport, chan, timeout)

    def _collect(self, transport: paramiko.Transport, chan: paramiko.Channel,
                 timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        """Read both output streams together until the command ends or `timeout` passes."""
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            drained = _drain(chan, out, err)
            pending = chan.recv_ready() or chan.recv_stderr_ready()
            # sshd may send exit-status before the last output: finish only once EOF has arrived as well.
            if chan.eof_received and chan.exit_status_ready() and not pending:
                break
            if chan.closed and not pending:
                break
            if deadline is not None and time.monotonic() > deadline:
                chan.close()
                return -1, bytes(out), bytes(err), True
            if not transport.is_active():
                chan.close()
                raise self._dropped()
            cancel.check_abort(f"running a command on {self.name}")
            if not drained:
                select.select([chan], [], [], 0.05)
        # paramiko reports -1 for a channel that closed without the command's exit status
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        if status == -1:
            chan.close()
            if not transport.is_active():
                raise self._dropped()
            raise self._no_status(bytes(out), bytes(err))
        chan.close()
        return status, bytes(out), bytes(err), False

    def _no_status(self, out: bytes, err: bytes) -> CommandError:
        return CommandError(f"{self.name}: a command ended without an exit status: it was killed on the node "
                            "(a signal, the OOM killer) or its SSH session was cut; it may not have finished",
                            fix=_GO_ON, stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                            exit_code=-1)

    def _dropped(self) -> ConnectError:
        return ConnectError(f"{self.name}: the SSH connection dropped while a command was running on the node (it "
                            "may or may not have finished there)", fix=_GO_ON)

    def _hold(self, line: str, stdin: bytes, until: bytes, timeout: float) -> Held | None:
        if self._shell_unchecked:
            self.run(["true"], timeout=30)  # the deferred login-shell check
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=30)
            chan.settimeout(SEND_TIMEOUT)
            chan.exec_command(line)
            if stdin:
                chan.sendall(stdin)
            out = bytearray()
            deadline = time.monotonic() + timeout
            while until not in out and time.monotonic() < deadline:
                if chan.recv_ready():  # what a command that already ended printed is still buffered: read it first
                    chunk = chan.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                elif chan.eof_received or chan.closed:
                    break
                else:
                    select.select([chan], [], [], 0.05)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectError(f"{self.name}: the SSH connection dropped while starting a command ({exc})",
                               fix="check the node and its network, then run the same command again") from None

        def release() -> None:
            try:
                chan.shutdown_write()
                end = time.monotonic() + 10
                while not chan.exit_status_ready() and time.monotonic() < end and transport.is_active():
                    time.sleep(0.02)
            except (paramiko.SSHException, EOFError, OSError):
                pass
            _drop(chan)

        return Held(bytes(out), until not in out, release)

    def _send_stdin(self, chan: paramiko.Channel, data: bytes) -> None:
        """Feed a command's stdin in pieces (a seam for tests that cut the connection half way)."""
        for offset in range(0, len(data), 32768):
            chan.sendall(data[offset:offset + 32768])

    def upload(self, local_path: str | os.PathLike[str], remote_path: str, *, mode: int = 0o644,
               sudo: bool = True, progress: ProgressCallback | None = None, sha256: str | None = None) -> str:
        """Stream the file through an exec channel into a private temp file beside `remote_path`, compare the
        length and sha256 the node computed with what was sent (or with `sha256`, the file's known hash: then
        the file is read here once, to send it, and never hashed here), then chmod and rename it into place;
        returns that sha256.
        A stall, a drop, a full disk or a Ctrl-C ends in a GpunodeError, and the temp file is removed."""
        total = os.path.getsize(local_path)
        prefix, with_password = self._privilege() if sudo else ((), False)
        if self._shell_unchecked:
            self.run(["true"], timeout=30)  # the deferred login-shell check, before any byte is sent
        receive = Script(UPLOAD_RECEIVE.body, (remote_path, str(total)), UPLOAD_RECEIVE.name)
        head = self._password_line() if with_password else b""
        code, out, err, sent_sum = self._stream(render(receive, privilege=prefix), head, local_path, total, progress,
                                                 hash_sent=sha256 is None)
        want = sha256 or sent_sum
        received = parse_received(out)
        if received is None:
            text = err.decode("utf-8", "replace")
            if "No space left on device" in text or "Disk quota exceeded" in text:
                raise NoSpaceError(self.name, posixpath.dirname(remote_path) or "/", f"uploading {total} bytes")
            Result(f"receiving {remote_path}", code, out.decode("utf-8", "replace"), text).check(
                f"uploading to {remote_path} (nothing was installed)")
            raise CommandError(f"{self.name}: the node did not confirm the upload to {remote_path}; nothing was "
                               "installed", fix="run the same command again")
        size, node_sum, staged = received
        installed = False
        try:
            if size != total or node_sum != want:
                raise CommandError(f"{self.name}: the upload to {remote_path} arrived altered ({size} of {total} "
                                   "bytes, sha256 mismatch); nothing was installed",
                                   fix="check the node's disk and memory, then run the same command again")
            install = Script(UPLOAD_INSTALL.body, (staged, remote_path, f"{mode:o}"), UPLOAD_INSTALL.name)
            self.run(install, sudo=sudo, timeout=120).check(f"installing the upload at {remote_path}")
            installed = True
        finally:
            if not installed:
                try:
                    self.run(Script(UPLOAD_DISCARD.body, (staged,), UPLOAD_DISCARD.name), sudo=sudo, timeout=60)
                except (ConnectError, cancel.Cancelled):
                    pass  # the connection is gone: the error already raised says so
        return node_sum

    def _stream(self, line: str, head: bytes, local_path: str | os.PathLike[str], total: int,
                progress: ProgressCallback | None, *, hash_sent: bool = True) -> tuple[int, bytes, bytes, str]:
        """Run `line` with `head` and then the file on its stdin. Returns (exit code, stdout, stderr, sha256 of
        the bytes sent; "" when not `hash_sent`). Every send waits at most SEND_TIMEOUT for the node's window; on a
        Ctrl-C, a stall or a drop the channel is closed at once (the node's command then sees its input end)."""
        transport = self._transport()
        chan = transport.open_session(timeout=30)
        digest = hashlib.sha256() if hash_sent else None
        sent = 0
        try:
            chan.settimeout(SEND_TIMEOUT)
            chan.exec_command(line)
            if head:
                chan.sendall(head)
            with open(local_path, "rb") as source:
                for chunk in iter(lambda: source.read(UPLOAD_CHUNK), b""):
                    cancel.check_abort(f"uploading to {self.name}")
                    if chan.exit_status_ready():
                        break  # the node stopped reading (a full disk): its stderr says why
                    _send_packets(chan, chunk)
                    if digest is not None:
                        digest.update(chunk)
                    sent += len(chunk)
                    if progress:
                        progress(sent, total)
            if progress and total == 0:
                progress(0, 0)
            # the node's command ended before reading everything (or the connection did)
            if sent < total and (chan.exit_status_ready() or not transport.is_active()):
                _drop(chan)
                code, out, err = self._leftover(chan)
                if code == -1:  # paramiko's status for a channel that ended without one: a drop
                    raise self._upload_error(transport, total, sent, EOFError())
                return code, out, err, _hex(digest)
            chan.shutdown_write()  # (sent < total here: the local file ended early; the node removes its short copy)
            # the node hashes what arrived: allow for a slow disk (10 MB/s) on top of the usual command time
            code, out, err, timed_out = self._collect(transport, chan, 120 + total / 10e6)
        except KeyboardInterrupt:
            _drop(chan)
            raise cancel.Cancelled(f"{self.name}: interrupted (Ctrl-C) during the upload; nothing was installed",
                                   fix="run the same command again") from None
        except cancel.Cancelled:
            _drop(chan)
            raise
        except (ConnectError, CommandError):  # the channel ended without an exit status (_collect)
            _drop(chan)
            raise self._upload_error(transport, total, sent, EOFError()) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            _drop(chan)
            if transport.is_active() and chan.exit_status_ready():  # the node's command ended early
                code, out, err = self._leftover(chan)
                if code != -1:
                    return code, out, err, _hex(digest)
            raise self._upload_error(transport, total, sent, exc) from None
        if sent < total and code == 46:  # the local file ended early; the node found its copy short and removed it
            raise CommandError(f"{self.name}: {local_path} ended after {sent} of {total} bytes (it changed during the "
                               "upload); nothing was installed", fix="run the same command again")
        if timed_out:
            raise ConnectError(f"{self.name}: the node did not confirm the upload within {120 + total / 10e6:.0f}s "
                               "of the last byte; nothing was installed",
                               fix="check the node's disk and load, then run the same command again")
        if code == -1 or not transport.is_active():  # ended with the connection, not with the command
            raise self._upload_error(transport, total, sent, EOFError())
        return code, out, err, _hex(digest)

    @staticmethod
    def _leftover(chan: paramiko.Channel) -> tuple[int, bytes, bytes]:
        """Exit code and whatever output a channel that already ended has buffered."""
        out, err = bytearray(), bytearray()
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        return chan.recv_exit_status(), bytes(out), bytes(err)

    def _upload_error(self, transport: paramiko.Transport, total: int, sent: int, exc: BaseException) -> Exception:
        if isinstance(exc, TimeoutError) and transport.is_active():
            return ConnectError(f"{self.name}: the upload stalled for {SEND_TIMEOUT:.0f}s ({sent} of {total} bytes "
                                "sent); nothing was installed", fix="check the node's network and disk, then run again")
        return ConnectError(f"{self.name}: the SSH connection dropped during the upload ({sent} of {total} "
                            "bytes sent); nothing was installed",
                            fix="check the node and its network, then run the same command again")


class _Unsent(Exception):
    """A framed command that could not be sent whole (the connection went first): the node ran nothing of it."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _outlives(transport: paramiko.Transport, wait: float = 1.0) -> bool:
    """Whether the connection is still up a moment after a command died without a status. A node that drops a
    session (a reboot, sshd killed) kills its processes in some order: the command's shell can die, and the loop
    report it, a few milliseconds before the connection itself goes; that is a dropped connection, not a command
    killed on the node."""
    end = time.monotonic() + wait
    while transport.is_active() and time.monotonic() < end:
        time.sleep(0.02)
    return transport.is_active()


def _greeting(data: bytearray) -> tuple[bytes, bytes] | None:
    """What follows `gpunode-serve` on its own line in what the command loop printed first, and what the stream
    holds after that line (None: not yet); what a login script printed before it is skipped."""
    text = b"\n" + bytes(data)
    at = text.find(b"\n" + _SERVE_HELLO.rstrip())
    if at < 0:
        return None
    line, ended, rest = text[at + 1:].partition(b"\n")
    return (line[len(_SERVE_HELLO.rstrip()):].strip(), rest) if ended else None


def _split_greeting(out: bytearray, err: bytearray) -> tuple[bytes, bytes, bytes] | None:
    """The greeting's words and what follows it on stdout and on stderr, once both streams greeted (else None)."""
    said, said_err = _greeting(out), _greeting(err)
    if said is None or said_err is None:
        return None
    return said[0], said[1], said_err[1]


def _exec_request(chan: paramiko.Channel, command: str) -> None:
    """paramiko's Channel.exec_command without waiting for sshd's answer: what is sent next on the channel
    follows the request at once. A refusal closes the channel (paramiko's Channel._request_failed), which whoever
    reads the channel next finds (chan.closed, event_ready still False)."""
    m = paramiko.Message()
    m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("exec")
    m.add_boolean(True)
    m.add_string(command)
    transport = chan.get_transport()
    if transport is None or not transport.is_active():  # paramiko would drop the request without a word
        raise paramiko.SSHException("the SSH connection is closed")
    chan._event_pending()  # type: ignore[attr-defined]
    transport._send_user_message(m)  # type: ignore[attr-defined]


def _upto(data: bytearray, nonce: bytes) -> bytes:
    """A framed command's output without the end marks (all of it when none arrived)."""
    at = data.find(nonce)
    return bytes(data if at < 0 else data[:at])


def _send_packets(chan: paramiko.Channel, data: bytes) -> None:
    """`data` on the channel in pieces of one SSH packet's payload each. paramiko's sendall slices off what each
    packet took and copies the rest (`s = s[sent:]`): a 256 KiB chunk in 32 KiB packets was copied 4.5 times
    over. In pieces, 400 MB cost 0.85-0.87 s of client CPU against 1.00-1.03 s (interleaved, 2026-11-25); a piece
    that fits a packet is sent by one `send` and never re-sliced. The packet size is the node's: its sshd's
    maximum for this channel (OpenSSH: 32 KiB, with a 2 MiB window; the receiver sets both, so gpunode cannot
    raise them for an upload)."""
    step = max(chan.out_max_packet_size - 64, 1024)  # paramiko's own per-packet limit (Channel._wait_for_send_window)
    for at in range(0, len(data), step):
        chan.sendall(data[at:at + step])


def _hex(digest: Any) -> str:
    return digest.hexdigest() if digest is not None else ""


class _Ahead(threading.Thread):
    """connect_ahead's thread; `abandoned` once the connection was closed while it ran."""

    abandoned = False

    @staticmethod
    def abandoned_here() -> bool:
        """Whether the calling thread is a connect_ahead whose connection was closed meanwhile."""
        current = threading.current_thread()
        return isinstance(current, _Ahead) and current.abandoned


def _shut(sock: socket.socket | paramiko.Channel | paramiko.ProxyCommand) -> None:
    """End a login's stream from another thread: a socket is shut down (its reader sees the end at once, and the
    socket is closed by its owner), a proxy closed."""
    try:
        if isinstance(sock, socket.socket):
            sock.shutdown(socket.SHUT_RDWR)
        else:
            sock.close()
    except (OSError, paramiko.SSHException):
        pass


def _drop(chan: paramiko.Channel) -> None:
    """Close a channel without waiting for anything; on a dead transport that close itself fails, harmlessly."""
    try:
        chan.close()
    except (paramiko.SSHException, EOFError, OSError):
        pass


def _ssh_failure(name: str, r: _Resolved, exc: Exception, elapsed: float, timeout: float) -> ConnectError:
    """paramiko's SSHException during connect, as what actually happened and what to do about it."""
    text = str(exc)
    where = f"{r.host}:{r.port}"
    if "No authentication methods available" in text:
        return ConnectError(f"{name}: no SSH key or password to log in as {r.user} (no --identity, no key in "
                            "ssh-agent or ~/.ssh, no password)",
                            fix="pass your private key with --identity (e.g. --identity ~/.ssh/id_ed25519), load it into "
                                "ssh-agent (`ssh-add ~/.ssh/id_ed25519`), or use --ask-pass")
    if text.startswith("Indecipherable protocol version"):
        said = text.split('"', 1)[-1].rstrip('"')
        return ConnectError(f"{name}: something answers on {where} but it is not an SSH server "
                            f"(it said {said[:80]!r})", fix=f"check the port: --host {shlex.quote(f'[{r.host}]:22' if ':' in r.host else f'{r.host}:22')} if sshd listens on the usual "
                                                  "port, or Port in ~/.ssh/config")
    banner = "banner" in text.lower() or "no existing session" in text.lower() or isinstance(exc, EOFError)
    if banner and elapsed >= 0.8 * timeout:
        return ConnectError(f"{name}: timed out after {timeout:.0f}s waiting for the SSH banner from {where} "
                            "(something answers, but not sshd)",
                            fix="check sshd on the node (it may be hung or overloaded), or the port")
    if banner:
        cause = "reset the connection" if "reset" in text.lower() else "closed the connection"
        return ConnectError(f"{name}: {where} accepted the connection, then {cause} after {elapsed:.1f}s without "
                            "speaking SSH (not sshd, a port forward to a node that is down, or sshd refusing "
                            "connections: MaxStartups, TCP wrappers)",
                            fix=f"check the port, and that sshd runs on the node: ssh -v -p {r.port} {r.host}")
    return ConnectError(f"{name}: SSH error: {text}",
                        fix=f"check that sshd on {where} accepts this client: ssh -v -p {r.port} {r.host}")


def _load_keys(name: str, paths: list[str]) -> tuple[list[paramiko.PKey], bool]:
    """Read identity files ourselves (any key type), so a bad file is named instead of masking an auth failure.
    Returns the usable keys and whether an encrypted one was skipped (then the agent is asked)."""
    keys: list[paramiko.PKey] = []
    encrypted = False
    for path in paths:
        try:
            keys.append(paramiko.PKey.from_path(os.path.expanduser(path)))
        except paramiko.PasswordRequiredException:
            encrypted = True
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ConnectError(f"{name}: cannot use the private key {path}: {exc}",
                               fix="check the --identity / IdentityFile path and that it is a private key") from None
    if paths and not keys and not encrypted:
        raise ConnectError(f"{name}: no usable private key", fix="check --identity")
    return keys, encrypted


def _drain(chan: paramiko.Channel, out: bytearray, err: bytearray) -> bool:
    """Append what both of the channel's streams hold now to `out` and `err`; whether anything came."""
    drained = False
    while chan.recv_ready():
        out += chan.recv(65536)
        drained = True
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
        drained = True
    return drained
