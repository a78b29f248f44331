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
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from gpunode import cancel
from gpunode.connection.base import Connection, NoSpaceError, ProgressCallback
from gpunode.errors import CommandError, ConnectError, UsageError
from gpunode.shell import Script, Secret

_known_hosts_lock = threading.Lock()
log = logging.getLogger("gpunode.ssh")
SFTP_TIMEOUT = 60.0  # seconds without progress on the SFTP channel (every request, close included)
SEND_TIMEOUT = 120.0  # seconds a command's stdin may wait for the node to accept more data


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
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self._client = client
        try:
            self._check_login_shell()
        except BaseException:
            self.close()
            raise
        return self

    def _check_login_shell(self) -> None:
        """sshd runs every command through the user's login shell: nologin/false accept the login and then
        refuse to run anything. Say so now rather than failing later with a confusing probe error."""
        assert self._client is not None
        transport = self._client.get_transport()
        assert transport is not None
        try:
            code, out, err, _ = self._exec_on(transport, "echo gpunode-shell-ok", b"", 30)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectError(f"{self.name}: the SSH connection dropped right after login ({exc})",
                               fix="check the node and run again") from None
        if b"gpunode-shell-ok" not in out:
            said = (err or out).decode("utf-8", "replace").strip().splitlines()
            detail = f" (it said: {said[0][:200]!r})" if said else f" (exit code {code})"
            user = self.resolved.user
            raise ConnectError(f"{self.name}: the login shell of {user} refuses to run commands{detail}",
                               fix=f"log in as a user with a shell (e.g. --host {shlex.quote('root@' + str(self.resolved.host))}), or "
                                   f"give {user} one on "
                                   f"the node: chsh -s /bin/sh {user}")

    def _drop_sftp(self) -> None:
        """Close the SFTP channel without waiting for the node to acknowledge pending writes (that wait is
        what hung for minutes after a Ctrl-C): the server ends the session and its open handles."""
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            try:
                sftp.get_channel().close()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - already broken is fine: we are discarding it
                pass

    def close(self) -> None:
        self._drop_sftp()
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
        except KeyboardInterrupt:
            raise cancel.Cancelled(f"{self.name}: interrupted (Ctrl-C) while a command was running on the node; "
                                   "it may still be running there",
                                   fix="check the node (gpunode status), then run the same command again") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A reset or a closed transport mid-command (a reboot, a network drop) is a connection problem.
            raise ConnectError(f"{self.name}: the SSH connection dropped while running a command ({exc})",
                               fix="the node may have rebooted or lost its network; run again") from None

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
            cancel.check_abort(f"running a command on {self.name}")
            if not drained:
                select.select([chan], [], [], 0.05)
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        chan.close()
        return status, bytes(out), bytes(err), False

    def _send_stdin(self, chan: paramiko.Channel, data: bytes) -> None:
        """Feed a command's stdin in pieces (a seam for tests that cut the connection half way)."""
        for offset in range(0, len(data), 32768):
            chan.sendall(data[offset:offset + 32768])

    def upload(self, local_path: str | os.PathLike[str], remote_path: str, *, mode: int = 0o644,
               sudo: bool = True, progress: ProgressCallback | None = None) -> None:
        """SFTP into a directory only the login user can read, verify the sha256, then move into place.
        Every SFTP request has a timeout; a drop, a full disk or a Ctrl-C ends in a GpunodeError."""
        self.connect()
        staging = self.make_private_dir("/var/tmp", sudo=False)
        staged = f"{staging}/upload"
        try:
            local_sum = self._put(local_path, staged, progress)
            move = Script(
                name="install-upload",
                body='set -e; sum=$(sha256sum -- "$1"); [ "${sum%% *}" = "$3" ] || '
                     '{ echo "checksum mismatch after upload" >&2; exit 3; }; '
                     'install -m "$4" -- "$1" "$2.gpunode-tmp"; mv -f -- "$2.gpunode-tmp" "$2"',
                args=(staged, remote_path, local_sum, f"{mode:o}"),
            )
            result = self.run(move, sudo=sudo, timeout=600)
            if "No space left on device" in result.stderr:
                raise NoSpaceError(self.name, posixpath.dirname(remote_path) or "/", f"installing {remote_path}")
            result.check(f"installing the upload at {remote_path}")
        finally:
            try:
                self.run(Script('rm -rf -- "$1"', (staging,), "cleanup"), timeout=60)
            except (ConnectError, cancel.Cancelled):
                pass  # the connection is gone: the error already raised says so; /var/tmp is cleaned at boot

    def _open_sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            assert self._client is not None
            try:
                self._sftp = self._client.open_sftp()
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectError(f"{self.name}: cannot start SFTP ({exc})",
                                   fix="enable the sftp subsystem in the node's sshd_config "
                                       "(Subsystem sftp ...)") from None
            self._sftp.get_channel().settimeout(SFTP_TIMEOUT)  # type: ignore[union-attr]
        return self._sftp

    def _put(self, local_path: str | os.PathLike[str], staged: str, progress: ProgressCallback | None) -> str:
        """Copy the file; returns its sha256. On any failure the SFTP channel is dropped, not closed politely."""
        total = os.path.getsize(local_path)
        digest = hashlib.sha256()
        sent = 0
        try:
            sftp = self._open_sftp()
            with open(local_path, "rb") as source:
                remote = sftp.open(staged, "wb")
                remote.set_pipelined(True)
                for chunk in iter(lambda: source.read(32768), b""):
                    cancel.check_abort(f"uploading to {self.name}")
                    remote.write(chunk)
                    digest.update(chunk)
                    sent += len(chunk)
                    if progress:
                        progress(sent, total)
                remote.close()  # waits for every acknowledgement, within SFTP_TIMEOUT each
            if progress and total == 0:
                progress(0, 0)
            return digest.hexdigest()
        except KeyboardInterrupt:
            self._drop_sftp()
            raise cancel.Cancelled(f"{self.name}: interrupted (Ctrl-C) during the upload to {staged}; nothing "
                                   "was installed", fix="run the same command again") from None
        except cancel.Cancelled:
            self._drop_sftp()
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop_sftp()
            raise self._upload_error(staged, total, sent, exc) from None

    def _upload_error(self, staged: str, total: int, sent: int, exc: BaseException) -> Exception:
        dropped = ConnectError(f"{self.name}: the SSH connection dropped during the upload ({sent} of {total} "
                               "bytes sent); nothing was installed",
                               fix="check the node and its network, then run the same command again")
        assert self._client is not None
        transport = self._client.get_transport()
        closed = isinstance(exc, (EOFError, ConnectionError)) or "closed" in str(exc).lower()
        if closed or transport is None or not transport.is_active():
            return dropped
        if isinstance(exc, TimeoutError):
            return ConnectError(f"{self.name}: the upload stalled for {SFTP_TIMEOUT:.0f}s ({sent} of {total} bytes "
                                "sent); nothing was installed", fix="check the node's network and disk, then run again")
        directory = posixpath.dirname(staged)
        try:
            free = self._free_bytes(directory)
        except ConnectError:
            return dropped
        if free is not None and free < max(total - sent, 1) * 1.01 + 65536:
            return NoSpaceError(self.name, posixpath.dirname(directory), f"uploading {total} bytes")
        return CommandError(f"{self.name}: the upload to {staged} failed ({exc or type(exc).__name__}); "
                            "nothing was installed", fix=f"check {posixpath.dirname(directory)} on the node "
                            "(space, permissions), then run the same command again")

    def _free_bytes(self, directory: str) -> int | None:
        """Free bytes in `directory` on the node, None when df cannot tell. A dropped connection raises."""
        result = self.run(["df", "-Pk", "--", directory], timeout=30)
        lines = result.stdout.strip().splitlines()
        fields = lines[-1].split() if result.ok and len(lines) >= 2 else []
        return int(fields[3]) * 1024 if len(fields) >= 4 and fields[3].isdigit() else None


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

