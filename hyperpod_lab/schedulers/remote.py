"""The one seam through which hyperpod-lab runs commands and touches files on a cluster.

Every command is an argv list. Over SSH it is joined with :func:`quote_argv` (``shlex.quote``
on each word), so nothing a user types is ever interpreted by the remote shell; locally it is
run with ``subprocess`` and no shell at all. Files go over SFTP on the same connection.

Connections are reused: :func:`connect` keeps one open ``SSHRemote`` per cluster profile.
Host keys are verified against the profile's known_hosts file with paramiko's RejectPolicy;
an unknown or changed key is an error, never silently accepted.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shlex
import socket
import stat
import subprocess
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hyperpod_lab.clusters import ClusterProfile
from hyperpod_lab.errors import RemoteCommandError
from hyperpod_lab.events import LocalFiles


def quote_argv(argv: list[str]) -> str:
    """Join an argv list into one POSIX shell command line, each word quoted.

    Raises ValueError for an empty argv, a non-string word, or a NUL byte (which no shell
    word can carry).
    """
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("argv must be a non-empty list of strings")
    for word in argv:
        if not isinstance(word, str):
            raise ValueError(f"argv words must be strings, got {type(word).__name__}: {word!r}")
        if "\x00" in word:
            raise ValueError("argv words cannot contain NUL bytes")
    return shlex.join(argv)


@dataclass
class CommandResult:
    """Outcome of one command: exit status, stdout and stderr as text."""

    exit_status: int
    stdout: str
    stderr: str


class Remote(ABC):
    """Runs argv lists and reads/writes files where the cluster's tools and storage are."""

    @abstractmethod
    def run(self, argv: list[str], check: bool = True, timeout_s: float | None = 60.0,
            input: bytes | None = None) -> CommandResult:
        """Run ``argv`` (``input``: bytes for its standard input, then EOF; the way to pass a
        secret, never in ``argv``); raise RemoteCommandError on a non-zero exit when ``check``."""

    @abstractmethod
    def read_from(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """At most ``length`` bytes of ``path`` from ``offset`` (None: to its end). Raises
        FileNotFoundError."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in ``path``; [] if it does not exist."""

    @abstractmethod
    def list_files(self, path: str) -> dict[str, int]:
        """Regular files in ``path`` (no links, no directories) and their sizes, bytes; {} if missing."""

    @abstractmethod
    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` atomically (temporary name, then rename)."""

    @abstractmethod
    def append_bytes(self, path: str, data: bytes) -> None:
        """Append ``data`` to ``path`` (created if missing)."""

    @abstractmethod
    def create_new(self, path: str) -> bool:
        """Create an empty file (0600) unless it exists (``O_EXCL``); True for the one caller that created it."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """``mkdir -p``."""

    def exists(self, path: str) -> bool:
        try:
            self.read_from(path, 0)
            return True
        except (FileNotFoundError, IsADirectoryError):
            return False

    def close(self) -> None:
        pass


class LocalRemote(LocalFiles, Remote):
    """This machine: subprocess without a shell, and the local file system (reads, appends and
    directories as :class:`hyperpod_lab.events.LocalFiles`)."""

    def run(self, argv, check=True, timeout_s=60.0, input=None):
        quote_argv(argv)  # same validation as over SSH
        try:
            p = subprocess.run(list(argv), capture_output=True, timeout=timeout_s,
                               input=input if input is not None else b"")
        except FileNotFoundError:
            raise RemoteCommandError(list(argv), 127, f"{argv[0]}: command not found") from None
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if check and res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res

    def write_bytes(self, path, data, mode=0o600):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)


class SSHRemote(Remote):
    """A cluster's login node over SSH (paramiko) with SFTP on the same transport.

    The login node is reached as :func:`hyperpod_lab.schedulers.ssh_route.resolve_route` says:
    directly, through the OpenSSH config's ProxyJump hops or ProxyCommand, or over an SSM session
    (``profile.ssm_target``).

    Args:
        profile: a slurm cluster profile (host, port, user, key_file, known_hosts, ssh_config,
            ssm_target).

    Raises:
        ConfigError: the OpenSSH config is missing, unreadable or contradictory.
        ClusterUnreachable: a hop did not answer within its connect timeout, refused the key or
            the tunnel, or its proxy command failed (the message names the hop, host and port).
        HostKeyError: a hop's host key is not in, or differs from, its known_hosts files.
    """

    def __init__(self, profile: ClusterProfile):
        from hyperpod_lab.schedulers.ssh_route import open_route, resolve_route

        self.profile = profile
        self._lock = threading.Lock()
        # the OpenSSH config, jump hosts, ProxyCommand and SSM: ssh_route.py; every hop's host
        # key is verified (RejectPolicy), errors name the hop
        self.route = resolve_route(profile)
        self._open = open_route(self.route, profile.name)
        self.client = self._open.client
        self._sftp = None

    @property
    def sftp(self):
        with self._lock:
            if self._sftp is None:
                self._sftp = self.client.open_sftp()
            return self._sftp

    @property
    def alive(self) -> bool:
        t = self.client.get_transport()
        return bool(t and t.is_active())

    def run(self, argv, check=True, timeout_s=60.0, input=None):
        line = quote_argv(argv)
        chan = self.client.get_transport().open_session(timeout=self.profile.connect_timeout_s)
        chan.settimeout(timeout_s)
        chan.exec_command(line)
        if input:
            chan.sendall(input)
        chan.shutdown_write()
        out, err = chan.makefile("rb"), chan.makefile_stderr("rb")
        try:
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
            status = chan.recv_exit_status()
        except socket.timeout:
            chan.close()
            raise RemoteCommandError(list(argv), -1, f"no result within {timeout_s} s") from None
        chan.close()
        res = CommandResult(status, stdout, stderr)
        if check and status != 0:
            raise RemoteCommandError(list(argv), status, stderr or stdout)
        return res

    def read_from(self, path, offset=0, length=None):
        try:
            with self.sftp.open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                if length is None:
                    f.prefetch()
                    return f.read()
                n = min(max(0, length), max(0, f.stat().st_size - offset))
                if n <= 0:
                    return b""
                f.prefetch(offset + n)  # only the range asked for, never the rest of the file
                return f.read(n)
        except IOError as e:
            if getattr(e, "errno", None) == errno.ENOENT:
                raise FileNotFoundError(path) from None
            raise

    def listdir(self, path):
        try:
            return self.sftp.listdir(path)
        except IOError as e:
            if getattr(e, "errno", None) == errno.ENOENT:
                return []
            raise

    def list_files(self, path):
        """Regular files and sizes (SFTP's readdir attributes are lstat's: links are not files)."""
        try:
            return {a.filename: a.st_size or 0 for a in self.sftp.listdir_attr(path) if stat.S_ISREG(a.st_mode or 0)}
        except IOError as e:
            if getattr(e, "errno", None) == errno.ENOENT:
                return {}
            raise

    def write_bytes(self, path, data, mode=0o600):
        self.makedirs(posixpath.dirname(path))
        tmp = f"{path}.tmp-{os.getpid()}"
        with self.sftp.open(tmp, "wb") as f:
            f.write(data)
        self.sftp.chmod(tmp, mode)
        self.sftp.posix_rename(tmp, path)

    def append_bytes(self, path, data):
        try:
            self.sftp.stat(path)
            new = False
        except IOError:
            new = True
        with self.sftp.open(path, "ab") as f:
            if new:  # private to the user, before anything is written
                self.sftp.chmod(path, 0o600)
            f.write(data)

    def create_new(self, path):
        try:
            with self.sftp.open(path, "x"):
                pass
        except IOError as e:
            if getattr(e, "errno", None) == errno.EEXIST or self.exists(path):
                return False
            raise
        self.sftp.chmod(path, 0o600)
        return True

    def makedirs(self, path):
        parts, cur = [p for p in path.split("/") if p], "/" if path.startswith("/") else ""
        for p in parts:
            cur = posixpath.join(cur, p) if cur else p
            try:
                if stat.S_ISDIR(self.sftp.stat(cur).st_mode):
                    continue
            except IOError:
                self.sftp.mkdir(cur, mode=0o700)

    def close(self):
        if self._sftp is not None:
            self._sftp.close()
        self._open.close()  # the login node's client, then jump hosts and proxy commands


_CONNECTIONS: dict[str, SSHRemote] = {}
_CONN_LOCK = threading.Lock()


def connect(profile: ClusterProfile) -> Remote:
    """The Remote of a profile: one reused SSH connection per slurm cluster, or LocalRemote."""
    if profile.orchestrator == "local":
        return LocalRemote()
    key = (f"{profile.name}|{profile.host}|{profile.port}|{profile.user}|{profile.ssh_config}|"
           f"{profile.ssm_target}|{profile.key_file}|{profile.known_hosts}")
    with _CONN_LOCK:
        conn = _CONNECTIONS.get(key)
        if conn is not None and conn.alive:
            return conn
        conn = SSHRemote(profile)
        _CONNECTIONS[key] = conn
        return conn


def close_all() -> None:
    """Close every cached connection (tests; interpreter exit)."""
    with _CONN_LOCK:
        for conn in _CONNECTIONS.values():
            conn.close()
        _CONNECTIONS.clear()
