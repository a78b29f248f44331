"""SSH to a node with paramiko. The only module that imports paramiko.

Host keys are verified against known_hosts by default (never AutoAddPolicy); `accept_new_host_key` adds an
unknown key (trust on first use) but a changed key is always refused. Every command has a wall-clock deadline
and both output streams are drained together, so large outputs cannot deadlock the channel.
"""

from __future__ import annotations

import base64
import hashlib
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from gpunode.connection.base import Connection, ProgressCallback
from gpunode.errors import ConnectError, UsageError
from gpunode.shell import Script, Secret

_known_hosts_lock = threading.Lock()


@dataclass(frozen=True)
class SSHTarget:
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


@dataclass
class SSHOptions:
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


def _load_known_hosts(client: paramiko.SSHClient, paths: list[Path]) -> None:
    """Load known_hosts files line by line so one malformed line does not discard the whole file."""
    keys = client.get_host_keys()
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.strip() or line.lstrip().startswith(("#", "@")):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
            except Exception:  # noqa: BLE001 - paramiko raises several unrelated types on bad lines
                continue
            if entry is None or entry.key is None:
                continue
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)


@dataclass
class _Resolved:
    host: str
    port: int
    user: str
    identities: list[str]
    known_hosts: list[Path]
    proxy_jump: str | None
    proxy_command: str | None
    label: str


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
        self._sftp: paramiko.SFTPClient | None = None

    # -- connecting ------------------------------------------------------------------------------------
    def connect(self) -> SSHConnection:
        if self._client is not None:
            return self
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
        started = time.monotonic()
        try:
            for index, key in enumerate(keys or [None]):
                try:
                    client.connect(
                        r.host, port=r.port, username=r.user, pkey=key, password=password,
                        # An encrypted identity is expected to be in the agent; otherwise no guessing, so
                        # MaxAuthTries is not spent on unrelated keys.
                        allow_agent=encrypted or not explicit, look_for_keys=not explicit,
                        timeout=self.options.connect_timeout, banner_timeout=self.options.connect_timeout,
                        auth_timeout=30, channel_timeout=30, sock=sock,
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
                               fix="add it to ssh-agent (ssh-add KEY) and run again") from None
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
            text = str(exc).lower()
            silent = "banner" in text or ("no existing session" in text
                                          and time.monotonic() - started >= 0.8 * self.options.connect_timeout)
            if silent:  # paramiko's words for a peer that accepted TCP and then said nothing
                raise ConnectError(f"{self.name}: timed out after {self.options.connect_timeout:.0f}s waiting for "
                                   f"the SSH banner from {r.host}:{r.port} (something answers, but not sshd)",
                                   fix="check sshd on the node (it may be hung or overloaded), or the port") from None
            raise ConnectError(f"{self.name}: SSH error: {exc}", fix="check that an SSH server answers on "
                               f"{r.host}:{r.port}") from None
        except OSError as exc:
            client.close()
            raise ConnectError(f"{self.name}: cannot connect to {r.host}:{r.port}: {exc.strerror or exc}",
                               fix="check the node is up, the port is right and sshd is running") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self._client = client
        return self

    def close(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:  # noqa: BLE001
                pass
            self._sftp = None
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
            try:
                self.connect()
                return
            except ConnectError as exc:
                if "host key" in exc.message or "authentication" in exc.message:
                    raise
                last = exc
                time.sleep(1.0)
        raise ConnectError(f"{self.name}: did not come back within {timeout:.0f}s ({last})",
                           fix="check the node's console; raise --reboot-timeout if it boots slowly")

    # -- running ---------------------------------------------------------------------------------------
    def _exec(self, line: str, stdin: bytes, timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        self.connect()
        assert self._client is not None
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            # Nothing is running yet, so connecting again (same host-key checks) is safe.
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
        try:
            return self._exec_on(transport, line, stdin, timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A reset or a closed transport mid-command (a reboot, a network drop) is a connection problem.
            raise ConnectError(f"{self.name}: the SSH connection dropped while running a command ({exc})",
                               fix="the node may have rebooted or lost its network; run again") from None

    def _exec_on(self, transport: paramiko.Transport, line: str, stdin: bytes,
                 timeout: float | None) -> tuple[int, bytes, bytes, bool]:
        chan = transport.open_session(timeout=30)
        chan.exec_command(line)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            drained = False
            while chan.recv_ready():
                out += chan.recv(65536)
                drained = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                drained = True
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
                raise ConnectError(f"{self.name}: the SSH connection dropped while running a command",
                                   fix="the node may have rebooted or lost its network; run again")
            if not drained:
                select.select([chan], [], [], 0.05)
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        return status, bytes(out), bytes(err), False

    def upload(self, local_path: str | os.PathLike[str], remote_path: str, *, mode: int = 0o644,
               sudo: bool = True, progress: ProgressCallback | None = None) -> None:
        """SFTP into a directory only the login user can read, verify the sha256, then move into place."""
        self.connect()
        assert self._client is not None
        if self._sftp is None:
            self._sftp = self._client.open_sftp()
        staging = self.make_private_dir("/var/tmp", sudo=False)
        staged = f"{staging}/upload"
        try:
            self._sftp.put(os.fspath(local_path), staged, callback=progress, confirm=True)
            local_sum = _sha256_file(local_path)
            move = Script(
                name="install-upload",
                body='set -e; sum=$(sha256sum -- "$1"); [ "${sum%% *}" = "$3" ] || '
                     '{ echo "checksum mismatch after upload" >&2; exit 3; }; '
                     'install -m "$4" -- "$1" "$2.gpunode-tmp"; mv -f -- "$2.gpunode-tmp" "$2"',
                args=(staged, remote_path, local_sum, f"{mode:o}"),
            )
            self.run(move, sudo=sudo, timeout=600).check(f"installing the upload at {remote_path}")
        finally:
            self.run(Script('rm -rf -- "$1"', (staging,), "cleanup"), timeout=60)


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


def _sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
