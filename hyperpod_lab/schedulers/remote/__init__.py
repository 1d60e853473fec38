"""The one seam through which hyperpod-lab runs commands and touches files on a cluster.

Every command is an argv list. Over SSH it is joined with :func:`quote_argv` (``shlex.quote``
on each word), so nothing a user types is ever interpreted by the remote shell; locally it is
run with ``subprocess`` and no shell at all. Files go over SFTP on the same connection.

Connections are reused: :func:`connect` keeps one open ``SSHRemote`` per cluster profile.
Host keys are verified against the profile's known_hosts file with paramiko's RejectPolicy;
an unknown or changed key is an error, never silently accepted.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import posixpath
import re
import secrets
import shlex
import socket
import stat
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hyperpod_lab import envexec
from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import ClusterUnreachable, HostKeyError, RemoteCommandError
from hyperpod_lab.events import LocalFiles
from hyperpod_lab.submit.clusters import ClusterProfile, config_path

log = logging.getLogger("hyperpod_lab.remote")


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


class CommandOutcomeUnknown(ClusterUnreachable):
    """The connection was lost after a command that must not run twice (``sbatch``, ``scancel``)
    went out: it may or may not have run on the login node. It is not repeated."""


@dataclass(frozen=True)
class StagedFile:
    """One file of a job directory to stage: ``rel`` below the directory, its bytes and mode
    (0600; 0700 for a batch script)."""

    rel: str
    data: bytes
    mode: int = 0o600


@dataclass
class Staging:
    """What staging a new job puts on shared storage: the job directory ``folder`` (as the
    cluster sees it; it must not exist yet), its sub-directories (relative, parents first) and
    files. Everything is private to the user: directories 0700, files 0600 (or 0700)."""

    folder: str
    dirs: tuple[str, ...]
    files: list[StagedFile]


class Remote(ABC):
    """Runs argv lists and reads/writes files where the cluster's tools and storage are."""

    @abstractmethod
    def run(self, argv: list[str], check: bool = True, timeout_s: float | None = 60.0,
            input: bytes | None = None, idempotent: bool = False) -> CommandResult:
        """Run ``argv`` (``input``: bytes for its standard input, then EOF; the way to pass a
        secret, never in ``argv``); raise RemoteCommandError on a non-zero exit when ``check``, or
        when it gives no output for ``timeout_s`` seconds (exit status -1). ``idempotent``: the
        command only reads, so it may run again after a dropped connection (see
        :class:`SSHRemote`)."""

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

    def local_path(self, path: str) -> str | None:
        """Where this machine sees the cluster path ``path`` (local-mount mode, see
        :class:`MountedRemote`), or None when its files are reached only through this Remote."""
        return None

    def stage(self, staging: Staging) -> None:
        """Create ``staging``'s job directory and write its files, one call each (``makedirs``,
        atomic ``write_bytes``): the local and EKS backends' staging. A Slurm submit stages and
        runs sbatch in one command instead (:meth:`stage_and_run`)."""
        self.makedirs(staging.folder)
        for d in staging.dirs:
            self.makedirs(posixpath.join(staging.folder, d))
        for f in staging.files:
            self.write_bytes(posixpath.join(staging.folder, f.rel), f.data, mode=f.mode)

    def stage_and_run(self, staging: Staging, argv: list[str], env: dict[str, str], python: str,
                      event: dict | None = None, timeout_s: float | None = 60.0) -> tuple[CommandResult, bool]:
        """Stage a new job and run ``argv`` (``sbatch``) on the login node in **one command**:
        :mod:`hyperpod_lab.envexec` (``python -c <its source> --stage -- argv``) reads the files,
        the variables ``env`` (secrets: never in argv or a file) and ``event`` from its standard
        input, writes the files (0700 directories, ``O_EXCL``/``O_NOFOLLOW`` files), runs
        ``argv`` and, when it exits 0, appends ``event`` (``{"path": relative path, "record":
        event dict}``) with ``data.native_id`` = the job id ``argv`` printed. See envexec's
        docstring for why one exec rather than SFTP.

        Returns:
            ``(result, event_written)``: ``result.stdout`` is ``argv``'s output alone.

        Raises:
            RemoteCommandError: ``argv`` (or the staging: exit status 2) failed; exit status -1
                when it gave no output for ``timeout_s`` (it may still run).
            CommandOutcomeUnknown: the connection was lost after the command went out.
            ClusterUnreachable: as :meth:`run`.
        """
        files = [(f.rel, f.mode, f.data) for f in staging.files]
        frame = envexec.frame(staging.folder, staging.dirs, files, env, event)
        argv_all = envexec.program_argv(python, stage=True) + list(argv)
        try:
            res = self.run(argv_all, check=False, timeout_s=timeout_s, input=frame)
        except RemoteCommandError as e:  # name the command, not the program's source
            raise RemoteCommandError(list(argv), e.exit_status, e.stderr) from None
        out, written = envexec.split_output(res.stdout)
        res = CommandResult(res.exit_status, out, res.stderr)
        if res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res, bool(written)

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

    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        quote_argv(argv)  # same validation as over SSH
        try:
            p = subprocess.run(list(argv), capture_output=True, timeout=timeout_s,
                               input=input if input is not None else b"")
        except FileNotFoundError:
            raise RemoteCommandError(list(argv), 127, f"{argv[0]}: command not found") from None
        except subprocess.TimeoutExpired:
            raise RemoteCommandError(list(argv), -1, f"not finished within {timeout_s:g} s on this machine "
                                                     f"(killed)") from None
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if check and res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res

    def write_bytes(self, path, data, mode=0o600):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_atomic(path, data, mode=mode)


_ONE_REQUEST = 32768  # paramiko's largest SFTP read request: a read up to this size needs no prefetch thread

#: seconds to wait before each reconnect of one call: a dropped connection is retried after 0.5 s,
#: then 1, 2, 4 s (at most ``len(RECONNECT_DELAYS_S)`` reconnects per call, and none that would end
#: past the call's ``op_timeout_s`` budget)
RECONNECT_DELAYS_S = (0.5, 1.0, 2.0, 4.0)


class _Attempt:
    """One try of a call: ``sent`` is set once something that must not run twice went out (a
    non-idempotent command, an append's data, an ``O_EXCL`` create), so a connection lost after it
    is not retried."""

    __slots__ = ("sent",)

    def __init__(self):
        self.sent = False


class _NoAnswer(Exception):
    """Internal: a protocol step got no answer within the op timeout (``what`` says which)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def answered_within(chan, timeout_s: float, request, what: str) -> None:
    """Run a channel request whose reply paramiko awaits without a timeout (``exec_command``,
    ``invoke_subsystem``); a timer closes the channel after ``timeout_s`` seconds, which ends the
    wait. Raises _NoAnswer then."""
    fired = threading.Event()

    def expire():
        fired.set()
        try:
            chan.close()
        except Exception:  # the transport is gone already
            pass

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        request()
    except Exception:
        if fired.is_set():
            raise _NoAnswer(what) from None
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise _NoAnswer(what)


class SSHRemote(Remote):
    """A cluster's login node over SSH (paramiko) with SFTP on the same transport.

    The login node is reached as :func:`hyperpod_lab.schedulers.remote.route.resolve_route` says:
    directly, through the OpenSSH config's ProxyJump hops or ProxyCommand, or over an SSM session
    (``profile.ssm_target``).

    Timeouts (seconds): every SFTP operation (open, read, write, list, stat, mkdir, chmod,
    rename) fails when the login node sends nothing for ``profile.op_timeout_s`` (paramiko's
    channel timeout on the SFTP channel), and so do opening a channel and the exec / subsystem
    requests (a timer closes the channel). A command's output may pause up to the ``timeout_s``
    its caller passes to :meth:`run`. An SFTP operation or request that gets no answer raises
    ClusterUnreachable naming the cluster, the host (alias and address), the operation and path,
    and drops the connection (the SFTP session is out of step after a lost reply): the next call
    reconnects.

    Dead links: the transport sends keepalives (``ServerAliveInterval``, default 15 s) and a
    monitor closes it when ``ServerAliveCountMax`` (default 3) go unanswered
    (:class:`~hyperpod_lab.schedulers.remote.route.KeepaliveMonitor`), so a call waiting on a dead
    link ends then, before its own timeout.

    Reconnects: a call that finds its connection dropped (closed, reset, found dead) reconnects
    after 0.5, 1, 2, 4 s (:data:`RECONNECT_DELAYS_S`; never past ``op_timeout_s`` from its start)
    and runs again when that is safe: reads, listings, stats, ``makedirs`` and the atomic
    ``write_bytes`` always; a command only when the caller says ``idempotent=True`` or the
    connection was found dead before the command went out; an append or ``create_new`` only
    before its data / create went out. A read retried at the same offset returns the same bytes,
    so an :class:`~hyperpod_lab.events.EventReader`'s cursors resume with no gap or duplicate.

    Thread safety: SFTP calls on one connection run one at a time (paramiko's SFTP client is not
    safe for concurrent replies); commands run on their own channels concurrently.

    Args:
        profile: a slurm cluster profile (host, port, user, key_file, known_hosts, ssh_config,
            ssm_target, connect_timeout_s, op_timeout_s).

    Attributes:
        reconnects: times the connection was reopened after a drop (tests, logs).
        last_drop: why the connection was last dropped (None: never).

    Raises:
        ConfigError: the OpenSSH config is missing, unreadable or contradictory.
        ClusterUnreachable: a hop did not answer within its connect timeout, refused the key or
            the tunnel, or its proxy command failed (the message names the hop, host and port).
        HostKeyError: a hop's host key is not in, or differs from, its known_hosts files.
    """

    def __init__(self, profile: ClusterProfile):
        from hyperpod_lab.schedulers.remote.route import open_route, resolve_route

        self.profile = profile
        self.op_timeout_s = float(getattr(profile, "op_timeout_s", None) or 30.0)
        self._conn_lock = threading.Lock()  # guards _open, _sftp, _gen; held while (re)connecting
        self._sftp_lock = threading.RLock()  # one SFTP call at a time
        self.reconnects = 0
        #: calls made, by kind: "exec" (one command, its own channel) and "sftp" (one SFTP call:
        #: a read, list, stat, write, append, create, mkdir -p or remove), and per operation
        #: ("sftp read", ...): what tests and benchmarks count round trips with
        self.ops: collections.Counter = collections.Counter()
        # the OpenSSH config, jump hosts, ProxyCommand and SSM: ssh_route.py; every hop's host
        # key is verified (RejectPolicy), errors name the hop
        self.route = resolve_route(profile)
        self._open_route = open_route
        self._open = open_route(self.route, profile.name)
        self._gen = 1
        self._sftp = None
        self.last_drop: str | None = None

    # ---- the connection --------------------------------------------------------------
    @property
    def client(self):
        """The login node's paramiko SSHClient now (None while dropped)."""
        o = self._open
        return o.client if o is not None else None

    @property
    def alive(self) -> bool:
        """Whether the connection is open now (False after a drop, until the next call reconnects)."""
        o = self._open
        return bool(o is not None and o.active)

    @property
    def host(self) -> str:
        """How messages name the login node: its alias and address (``login node a (h:p)``)."""
        return self.route.target.label

    def _where(self) -> str:
        return f"cluster '{self.profile.name}' ({self.host})"

    def _connection(self):
        """(generation, OpenRoute): the open connection, reconnecting if it was dropped. Raises
        ClusterUnreachable, HostKeyError."""
        with self._conn_lock:
            o = self._open
            if o is not None and o.active:
                return self._gen, o
            if o is not None:
                self.last_drop = o.dead_reason or "the connection had closed when a call began"
                self._close_quietly(o)
                self._open, self._sftp = None, None
            self._open = self._open_route(self.route, self.profile.name)
            self._gen += 1
            self.reconnects += 1
            log.info("hyperpod_lab: reconnected to %s (was: %s)", self._where(), self.last_drop)
            return self._gen, self._open

    def reconnect(self) -> None:
        """Open the connection now if it was dropped. Raises ClusterUnreachable, HostKeyError."""
        self._connection()

    def _drop(self, gen: int, why: str) -> None:
        """Close connection generation ``gen`` (if it is still the current one): the next call
        reconnects."""
        with self._conn_lock:
            if gen != self._gen or self._open is None:
                return
            o, sftp = self._open, self._sftp
            self._open, self._sftp = None, None
            self.last_drop = o.dead_reason or why
        log.warning("hyperpod_lab: dropped the connection to %s: %s", self._where(), self.last_drop)
        if sftp is not None:
            try:
                sftp.get_channel().close()
            except Exception:
                pass
        self._close_quietly(o)

    @staticmethod
    def _close_quietly(o) -> None:
        try:
            o.close()
        except Exception:
            pass

    def _usable(self, gen: int, sftp: bool, settle_s: float = 0.0) -> bool:
        """Whether connection ``gen`` (and, for ``sftp``, its SFTP channel once opened) is still
        open. ``settle_s``: wait up to that long for a closing transport to say so (paramiko
        closes the channels a moment before it marks the transport inactive)."""
        deadline = time.monotonic() + settle_s
        while True:
            o = self._open
            if gen != self._gen or o is None or not o.active:
                return False
            if sftp:
                s = self._sftp
                if s is not None and s.get_channel().closed:
                    return False
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.05)

    def _sftp_of(self, gen: int, o):
        """The SFTP client of connection ``gen`` (opened on first use, its channel timeout set).
        Called holding ``_sftp_lock``."""
        import paramiko

        with self._conn_lock:
            if gen == self._gen and self._sftp is not None:
                return self._sftp
        t = self.op_timeout_s
        try:
            chan = o.transport.open_session(timeout=t)
        except paramiko.SSHException as e:
            if "Timeout opening channel" in str(e):
                raise _NoAnswer("opening an SSH channel") from None
            raise
        chan.settimeout(t)  # every read of a reply, and every write that waits for window
        answered_within(chan, t, lambda: chan.invoke_subsystem("sftp"), "starting the SFTP subsystem")
        try:
            sftp = paramiko.SFTPClient(chan)  # version exchange: reads under the channel timeout
        except (socket.timeout, TimeoutError):
            chan.close()
            raise _NoAnswer("the SFTP version exchange") from None
        with self._conn_lock:
            if gen != self._gen:
                chan.close()
                raise EOFError("the connection was replaced")
            self._sftp = sftp
        return sftp

    def _call(self, op: str, path: str, fn, *, sftp: bool = True, idempotent: bool = True):
        """Run ``fn(client_or_sftp, attempt)`` with the timeout, drop and reconnect rules of the
        class docstring. ``op`` / ``path`` name the operation in errors."""
        import paramiko

        self.ops["sftp" if sftp else "exec"] += 1
        if sftp:
            self.ops[f"sftp {op}"] += 1
        start = time.monotonic()
        tries = 0
        last: str = ""
        while True:
            gen = None
            attempt = _Attempt()
            try:
                gen, o = self._connection()
                if not sftp:
                    return fn(o, attempt)
                if not self._sftp_lock.acquire(timeout=self.op_timeout_s):
                    raise ClusterUnreachable(
                        f"{self._where()}: SFTP {op} {path} waited {self.op_timeout_s:g} s for another SFTP "
                        f"call on the same connection to finish; retry, or raise op_timeout_s in the profile")
                try:
                    return fn(self._sftp_of(gen, o), attempt)
                finally:
                    self._sftp_lock.release()
            except (_NoAnswer, socket.timeout, TimeoutError) as e:
                what = e.what if isinstance(e, _NoAnswer) else "a reply"
                if gen is not None:
                    self._drop(gen, f"{op} {path}: no answer within {self.op_timeout_s:g} s")
                # a command request that went out unanswered may have started it
                unknown = attempt.sent and not idempotent
                raise (CommandOutcomeUnknown if unknown else ClusterUnreachable)(
                    f"{self._where()}: {'SFTP ' if sftp else ''}{op} {path} got no answer ({what}) within "
                    f"{self.op_timeout_s:g} s; the connection was dropped and the next call reconnects. Check that "
                    f"the login node and its file system respond (ssh {self.route.target.alias}), or raise "
                    f"op_timeout_s (seconds) in cluster '{self.profile.name}' of {config_path()}") from None
            except (HostKeyError, RemoteCommandError):
                raise
            except ClusterUnreachable as e:
                if gen is not None:  # raised by fn itself
                    raise
                last = str(e)  # reconnecting failed: try again after the next delay
                retry = tries < len(RECONNECT_DELAYS_S)
            except (paramiko.SSHException, EOFError, OSError) as e:
                # an errno (no such file, permission denied) or SFTP's end-of-file is an answer;
                # anything else on a command may be its channel closing with the link: let it settle
                answer = getattr(e, "errno", None) is not None or (sftp and isinstance(e, EOFError))
                if gen is None or self._usable(gen, sftp, 0.0 if answer or sftp else 1.0):
                    if isinstance(e, paramiko.SSHException):  # a refused channel etc.: the connection is fine
                        raise ClusterUnreachable(f"{self._where()}: {op} {path} failed: {e}") from None
                    raise  # an answer (no such file, permission denied, a command's EOF): not the link
                o_reason = self._open.dead_reason if self._open is not None else None
                last = o_reason or (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                self._drop(gen, f"lost during {op} {path}: {last}")
                retry = (idempotent or not attempt.sent) and tries < len(RECONNECT_DELAYS_S)
                if not retry and attempt.sent and not idempotent:
                    raise CommandOutcomeUnknown(
                        f"{self._where()}: the connection was lost during {op} {path} ({last}), after the request "
                        f"went out, so it is not repeated: it may or may not have taken effect; check on the "
                        f"cluster. The next call reconnects.") from None
            if retry:
                delay = RECONNECT_DELAYS_S[tries]
                if time.monotonic() + delay - start > self.op_timeout_s:
                    retry = False
            if not retry:
                raise ClusterUnreachable(
                    f"{self._where()}: the connection was lost during {op} {path} and not restored after "
                    f"{tries} reconnect(s): {last}. Check that the login node is up (ssh {self.route.target.alias}); "
                    f"the next call tries again") from None
            tries += 1
            time.sleep(delay)

    # ---- commands --------------------------------------------------------------------
    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        """Run ``argv`` on the login node (see :meth:`Remote.run`).

        Args:
            timeout_s: seconds the command's output may pause (None: ``op_timeout_s``).
            idempotent: the command only reads (``squeue``, ``sacct``, ``sinfo``): rerun it after
                a reconnect if the connection drops while it runs. Otherwise (``sbatch``,
                ``scancel``) it is rerun only if the connection was found dead before it went out.

        Raises:
            RemoteCommandError: a non-zero exit (with ``check``), or no output for ``timeout_s``
                seconds (exit status -1; the channel is closed, the connection kept).
            ClusterUnreachable: no answer to the channel or exec request within ``op_timeout_s``,
                or the connection was lost (and not retried, or not restored).
        """
        line = quote_argv(argv)
        t_out = self.op_timeout_s if timeout_s is None else float(timeout_s)

        def once(o, attempt):
            import paramiko

            try:
                chan = o.transport.open_session(timeout=self.op_timeout_s)
            except paramiko.SSHException as e:
                if "Timeout opening channel" in str(e):
                    raise _NoAnswer("opening an SSH channel") from None
                raise
            try:
                chan.settimeout(t_out)
                attempt.sent = True  # from here the command may run
                answered_within(chan, self.op_timeout_s, lambda: chan.exec_command(line), "the exec request")
                try:
                    if input:
                        chan.sendall(input)
                    chan.shutdown_write()
                    out, err = chan.makefile("rb"), chan.makefile_stderr("rb")
                    stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
                    if not chan.status_event.wait(t_out):
                        raise socket.timeout()
                except (socket.timeout, TimeoutError):
                    raise RemoteCommandError(list(argv), -1, (
                        f"no output and no exit within {t_out:g} s on {self._where()}; the command may still be "
                        f"running there (it is slow, or the link is down): retry, or check the login node")) from None
                status = chan.recv_exit_status()
                if status == -1:  # no exit status (a signal, or the link went: the transport notices last)
                    for _ in range(20):
                        if not o.active:
                            break
                        time.sleep(0.05)
                if status == -1 and not o.active:
                    raise EOFError(o.dead_reason or "the connection closed before the command's exit status came")
                return CommandResult(status, stdout, stderr)
            finally:
                chan.close()

        res = self._call("exec", f"`{argv[0]}`", once, sftp=False, idempotent=idempotent)
        if check and res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res

    # ---- files -----------------------------------------------------------------------
    @staticmethod
    @contextlib.contextmanager
    def _file(sftp, path, mode):
        """``sftp.open`` whose close does not wait again after a timeout (the channel is closed
        first: the session is out of step, and the connection is dropped anyway)."""
        f = sftp.open(path, mode)
        try:
            yield f
        except (socket.timeout, TimeoutError):
            try:
                sftp.get_channel().close()
            except Exception:
                pass
            raise
        finally:
            f.close()

    def read_from(self, path, offset=0, length=None):
        """At most ``length`` bytes of ``path`` from ``offset`` (see :meth:`Remote.read_from`);
        retried at the same offset after a reconnect. Raises FileNotFoundError, ClusterUnreachable."""

        def once(sftp, attempt):
            try:
                with self._file(sftp, path, "rb") as f:
                    if offset:
                        f.seek(offset)
                    left = max(0, f.stat().st_size - offset)  # to the end as of now
                    n = left if length is None else min(max(0, length), left)
                    if n <= 0:
                        return b""
                    if n > _ONE_REQUEST:  # pipelined reads of the range asked for, never the rest
                        f.prefetch(offset + n)
                    return f.read(n)
            except IOError as e:
                if getattr(e, "errno", None) == errno.ENOENT:
                    raise FileNotFoundError(path) from None
                raise

        return self._call("read", path, once)

    def listdir(self, path):
        def once(sftp, attempt):
            try:
                return sftp.listdir(path)
            except IOError as e:
                if getattr(e, "errno", None) == errno.ENOENT:
                    return []
                raise

        return self._call("list", path, once)

    def list_files(self, path):
        """Regular files and sizes (SFTP's readdir attributes are lstat's: links are not files)."""
        def once(sftp, attempt):
            try:
                return {a.filename: a.st_size or 0 for a in sftp.listdir_attr(path) if stat.S_ISREG(a.st_mode or 0)}
            except IOError as e:
                if getattr(e, "errno", None) == errno.ENOENT:
                    return {}
                raise

        return self._call("list", path, once)

    def stat(self, path):
        """The SFTP attributes of ``path`` (``st_size``, ``st_mode``, ``st_mtime``). Raises
        FileNotFoundError, ClusterUnreachable."""
        def once(sftp, attempt):
            try:
                return sftp.stat(path)
            except IOError as e:
                if getattr(e, "errno", None) == errno.ENOENT:
                    raise FileNotFoundError(path) from None
                raise

        return self._call("stat", path, once)

    def write_bytes(self, path, data, mode=0o600):
        """Atomic (temporary name, then rename): retried whole after a reconnect."""
        self.makedirs(posixpath.dirname(path))
        tmp = f"{path}.tmp-{os.getpid()}"

        def once(sftp, attempt):
            with self._file(sftp, tmp, "wb") as f:
                f.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)

        self._call("write", path, once)

    def append_bytes(self, path, data):
        """One append (created 0600 if missing); not repeated once its data went out."""
        def once(sftp, attempt):
            try:
                sftp.stat(path)
                new = False
            except FileNotFoundError:
                new = True
            with self._file(sftp, path, "ab") as f:
                if new:  # private to the user, before anything is written
                    sftp.chmod(path, 0o600)
                attempt.sent = True
                f.write(data)

        self._call("append", path, once, idempotent=False)

    def create_new(self, path):
        def once(sftp, attempt):
            attempt.sent = True  # O_EXCL: a repeat would find our own file
            try:
                with self._file(sftp, path, "x"):
                    pass
            except IOError as e:
                if getattr(e, "errno", None) == errno.EEXIST:
                    return False
                try:
                    sftp.stat(path)
                    return False
                except FileNotFoundError:
                    raise e from None
            sftp.chmod(path, 0o600)
            return True

        return self._call("create", path, once, idempotent=False)

    def exists(self, path):
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def remove(self, path):
        """Remove the file ``path`` (absent: nothing to do)."""
        def once(sftp, attempt):
            try:
                sftp.remove(path)
            except IOError as e:
                if getattr(e, "errno", None) != errno.ENOENT:
                    raise

        self._call("remove", path, once)

    def makedirs(self, path):
        def once(sftp, attempt):
            parts, cur = [p for p in path.split("/") if p], "/" if path.startswith("/") else ""
            for p in parts:
                cur = posixpath.join(cur, p) if cur else p
                try:
                    if stat.S_ISDIR(sftp.stat(cur).st_mode):
                        continue
                except FileNotFoundError:
                    sftp.mkdir(cur, mode=0o700)

        self._call("mkdir", path, once)

    def close(self):
        with self._conn_lock:
            o, sftp = self._open, self._sftp
            self._open, self._sftp = None, None
            self._gen += 1
        if sftp is not None:
            try:
                sftp.close()
            except Exception:
                pass
        if o is not None:
            self._close_quietly(o)  # the login node's client, then jump hosts and proxy commands


class MountedRemote(Remote):
    """Local-mount mode (issue 16, item 3): this machine mounts the cluster's shared storage (a
    SageMaker Studio space with the cluster's FSx attached; the dev cluster, whose nodes are this
    host), so every file below the profile's ``shared_root`` is read and written here, at the
    same place below ``local_mount``, and SSH carries only scheduler commands.

    Staging writes the job directory locally (the same ``O_EXCL``/``O_NOFOLLOW``, 0700/0600 rules
    as :mod:`hyperpod_lab.envexec`) and then runs ``sbatch`` in one command; events, logs, rank
    files, fault requests and ``find_native_id``'s ``native_id`` are read and written locally. A
    path outside ``shared_root`` (none the backends use) still goes to the wrapped Remote.

    The files are written as this machine's user: the cluster user must be the same uid on the
    shared file system (``local_mount = "auto"`` checks it on its probe; see :func:`connect`).

    Args:
        ssh: the login node's Remote (commands; attributes such as ``alive``, ``reconnect``,
            ``ops`` are its own).
        shared_root: the profile's ``shared_root`` (the cluster's path).
        local_mount: where this machine sees ``shared_root``.
        how: ``"profile"`` (the profile said where) or ``"probe"`` (detected).
    """

    def __init__(self, ssh: Remote, shared_root: str, local_mount: str, how: str = "profile"):
        self.ssh = ssh
        self.shared_root = posixpath.normpath(shared_root)
        self.local_mount = os.path.normpath(local_mount)
        self.how = how
        self._local = LocalRemote()

    def __getattr__(self, name):  # the login node's connection state: alive, reconnect, ops, host ...
        ssh = self.__dict__.get("ssh")
        if ssh is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(ssh, name)

    def local_path(self, path):
        p = posixpath.normpath(path)
        root = self.shared_root.rstrip("/") or "/"
        if p == root:
            return self.local_mount
        prefix = root if root.endswith("/") else root + "/"
        if not p.startswith(prefix):
            return None
        return os.path.join(self.local_mount, p[len(prefix):])

    # ---- commands: the login node --------------------------------------------------------
    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        return self.ssh.run(argv, check=check, timeout_s=timeout_s, input=input, idempotent=idempotent)

    def stage_and_run(self, staging, argv, env, python, event=None, timeout_s=60.0):
        """Stage locally, then one command: ``argv`` with ``env`` from its standard input
        (``python -c <envexec> -- argv``; ``env SLURM_UMASK=...`` style words would put values in
        a command line). The event is not appended here (returns False): the caller appends it
        through this Remote, locally, where a reader here sees it at once."""
        folder = self.local_path(staging.folder)
        if folder is None:
            return self.ssh.stage_and_run(staging, argv, env, python, event=event, timeout_s=timeout_s)
        envexec.make_job_folder(folder, staging.dirs)
        for f in staging.files:
            envexec.write_new(os.path.join(folder, f.rel), f.mode, [f.data])
        if env:
            full, data = envexec.program_argv(python) + list(argv), json.dumps(env).encode()
        else:
            full, data = list(argv), None
        try:
            res = self.ssh.run(full, check=False, timeout_s=timeout_s, input=data)
        except RemoteCommandError as e:
            raise RemoteCommandError(list(argv), e.exit_status, e.stderr) from None
        if res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res, False

    # ---- files: this machine, below local_mount ------------------------------------------
    def _on(self, path):
        lp = self.local_path(path)
        return (self._local, lp) if lp is not None else (self.ssh, path)

    def read_from(self, path, offset=0, length=None):
        files, p = self._on(path)
        return files.read_from(p, offset, length)

    def listdir(self, path):
        files, p = self._on(path)
        return files.listdir(p)

    def list_files(self, path):
        files, p = self._on(path)
        return files.list_files(p)

    def append_bytes(self, path, data):
        files, p = self._on(path)
        return files.append_bytes(p, data)

    def create_new(self, path):
        files, p = self._on(path)
        return files.create_new(p)

    def makedirs(self, path):
        files, p = self._on(path)
        return files.makedirs(p)  # LocalFiles: 0700

    def exists(self, path):
        files, p = self._on(path)
        return os.path.lexists(p) if files is self._local else files.exists(p)

    def remove(self, path):
        files, p = self._on(path)
        if files is not self._local:
            return files.remove(p)
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass

    def write_bytes(self, path, data, mode=0o600):
        """Atomic (a private temporary file, then rename), never through a link."""
        files, p = self._on(path)
        if files is not self._local:
            return files.write_bytes(p, data, mode=mode)
        self._local.makedirs(os.path.dirname(p))
        write_atomic(p, data, mode=mode, fsync=False)

    def stage(self, staging):
        folder = self.local_path(staging.folder)
        if folder is None:
            return self.ssh.stage(staging)
        Remote.stage(self, staging)

    def close(self):
        self.ssh.close()


#: file system types whose mounts :func:`mount_candidates` looks in for a cluster's shared storage
NETWORK_FS = ("lustre", "nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "gpfs", "beegfs", "virtiofs", "9p")


def mount_candidates(shared_root: str, mounts_file: str = "/proc/self/mounts", most: int = 64) -> list[str]:
    """Local directories that may be the cluster's ``shared_root``: the same path here, then,
    for each network or FUSE file system mounted here (``mounts_file``), its mount point joined
    with each tail of ``shared_root`` (``/fsx/users/me`` on the cluster may be ``M/fsx/users/me``,
    ``M/users/me``, ``M/me`` or ``M`` here). Existing directories only, at most ``most``."""
    root = posixpath.normpath(shared_root)
    parts = [p for p in root.split("/") if p]
    tails = ["/".join(parts[i:]) for i in range(len(parts) + 1)]
    out = [root] if os.path.isdir(root) else []
    try:
        with open(mounts_file) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or not (fields[2] in NETWORK_FS or fields[2].startswith("fuse")):
            continue
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        for t in tails:
            cand = os.path.join(mnt, t) if t else mnt
            if cand not in out and os.path.isdir(cand):
                out.append(cand)
                if len(out) >= most:
                    return out
    return out


def detect_local_mount(remote: Remote, shared_root: str, candidates: list[str] | None = None) -> tuple[str | None, str]:
    """Find where this machine sees the cluster's ``shared_root``: write a probe file (random
    name and content, 0600) into ``<shared_root>/hyperpod-lab/`` through ``remote`` (SFTP), look
    for it below each of ``candidates`` (default :func:`mount_candidates`), remove it.

    A candidate counts only when the probe there is a regular file with the same content and
    owned by this process's user: files staged from here must belong to the cluster user.

    Returns:
        ``(local path of shared_root or None, what was found, as one sentence)``.
    """
    token = secrets.token_hex(16)
    base = posixpath.join(posixpath.normpath(shared_root), "hyperpod-lab")
    name = f".mount-probe-{token}"
    probe = posixpath.join(base, name)
    remote.makedirs(base)
    remote.write_bytes(probe, token.encode(), mode=0o600)
    notes: list[str] = []
    try:
        cands = mount_candidates(shared_root) if candidates is None else candidates
        for cand in cands:
            p = os.path.join(cand, "hyperpod-lab", name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_uid != os.geteuid():
                notes.append(f"{cand} holds the probe but as uid {st.st_uid}, not this user's {os.geteuid()} "
                             f"(files staged from here would not be the cluster user's)")
                continue
            try:
                with open(p, "rb") as f:
                    if f.read(64) != token.encode():
                        continue
            except OSError:
                continue
            return cand, f"the probe written over SFTP to {probe} is {p} here"
        where = ", ".join(cands) or "no candidate directory"
        return None, f"the probe written over SFTP to {probe} was not found here (looked in {where})" + (
            "; " + "; ".join(notes) if notes else "")
    finally:
        try:
            remote.remove(probe)
        except Exception:
            pass


def with_local_mount(profile: ClusterProfile, ssh: Remote) -> Remote:
    """``ssh`` wrapped in a :class:`MountedRemote` when the profile's ``local_mount`` says so:
    a path (checked to be a directory here), or ``"auto"`` (:func:`detect_local_mount`; not
    found: ``ssh`` itself, SFTP for files). Raises ConfigError for a path that is no directory."""
    lm = getattr(profile, "local_mount", None)
    if not lm or not profile.shared_root:
        return ssh
    if lm == "auto":
        found, why = detect_local_mount(ssh, profile.shared_root)
        log.info("hyperpod_lab: cluster '%s' local_mount auto: %s", profile.name, why)
        return MountedRemote(ssh, profile.shared_root, found, how="probe") if found else ssh
    path = os.path.abspath(os.path.expanduser(lm))
    if not os.path.isdir(path):
        from hyperpod_lab.errors import ConfigError

        raise ConfigError(f"cluster '{profile.name}': local_mount {lm!r} is not a directory on this machine; "
                          f"set it to where this machine mounts the cluster's {profile.shared_root}, to \"auto\" "
                          f"(found by a probe file), or remove it (files then go over SFTP)")
    return MountedRemote(ssh, profile.shared_root, path)


_CONNECTIONS: dict[str, Remote] = {}
_KEY_LOCKS: dict[str, threading.Lock] = {}
_CONN_LOCK = threading.Lock()  # guards the two dicts only, never held while connecting


def connect(profile: ClusterProfile) -> Remote:
    """The Remote of a profile: one reused SSH connection per slurm cluster (reopened in place
    if it was dropped), or LocalRemote. With the profile's ``local_mount`` (a path, or
    ``"auto"`` and the probe found one), a :class:`MountedRemote` over that connection: files
    on this machine, commands over SSH.

    Connecting to one cluster never waits for another's connect (a lock per profile).

    Raises:
        ClusterUnreachable, HostKeyError, ConfigError: as :class:`SSHRemote`.
    """
    if profile.orchestrator == "local":
        return LocalRemote()
    key = (f"{profile.name}|{profile.host}|{profile.port}|{profile.user}|{profile.ssh_config}|"
           f"{profile.ssm_target}|{profile.key_file}|{profile.known_hosts}|{profile.connect_timeout_s}|"
           f"{getattr(profile, 'op_timeout_s', None)}|{profile.shared_root}|{getattr(profile, 'local_mount', None)}")
    with _CONN_LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        with _CONN_LOCK:
            conn = _CONNECTIONS.get(key)
        if conn is not None:
            if not conn.alive:
                conn.reconnect()
            return conn
        ssh = SSHRemote(profile)
        try:
            conn = with_local_mount(profile, ssh)
        except BaseException:
            ssh.close()
            raise
        with _CONN_LOCK:
            _CONNECTIONS[key] = conn
        return conn


def close_all() -> None:
    """Close every cached connection (tests; interpreter exit)."""
    with _CONN_LOCK:
        conns = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for conn in conns:
        conn.close()
