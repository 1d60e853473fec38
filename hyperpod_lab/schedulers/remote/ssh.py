"""The seam over SSH (paramiko): one connection per login node, commands joined with
:func:`~hyperpod_lab.schedulers.remote.base.quote_argv`, files over SFTP on the same connection;
every request bounded by the profile's ``op_timeout_s``, keepalives, reconnects with backoff;
host keys verified against known_hosts (RejectPolicy)."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import posixpath
import socket
import stat
import threading
import time

from hyperpod_lab.errors import ClusterUnreachable, HostKeyError, RemoteCommandError
from hyperpod_lab.schedulers.remote.base import CommandOutcomeUnknown, CommandResult, Remote, quote_argv
from hyperpod_lab.submit.clusters import ClusterProfile, config_path

log = logging.getLogger("hyperpod_lab.remote")


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



def _no_delay(o):
    """Turn Nagle's algorithm off on the connection's TCP socket (where it is one; a proxy
    command's pipe is not) and return ``o``. A request of more than one SSH packet (a
    ``read_tails`` request names every event file: 44 KB at 2,048 ranks) otherwise waits for the
    peer's delayed ACK: measured on the dev cluster's sshd, 51.7 ms per idle poll with it, 7.6 ms
    without (OpenSSH's client sets TCP_NODELAY for interactive sessions too)."""
    sock = getattr(getattr(o, "transport", None), "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    return o


def _unless_missing(op, sftp, path: str, missing=None):
    """``op(sftp)``; an SFTP "no such file" (``ENOENT``) becomes ``missing()`` where given, else
    FileNotFoundError(path). Other errors propagate."""
    try:
        return op(sftp)
    except IOError as e:
        if getattr(e, "errno", None) != errno.ENOENT:
            raise
        if missing is None:
            raise FileNotFoundError(path) from None
        return missing()

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
        self._open = _no_delay(open_route(self.route, profile.name))
        self._gen = 1
        self._sftp = None
        self.last_drop: str | None = None
        #: why :meth:`read_tails` reads over SFTP (None: it runs its one command)
        self.tails_fallback: str | None = None
        #: files the reader program's last fast poll probed (None after a listing), for benchmarks
        self.tails_probed: int | None = None
        self._tails = None  # (OpenRoute, channel, its stdout) of the reader program
        self._tails_last: dict[str, tuple[int, dict[str, int]]] = {}  # directory -> its last request's (gen, offsets)
        self._tails_lock = threading.Lock()

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
            self._open = _no_delay(self._open_route(self.route, self.profile.name))
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
        retried at the same offset after a reconnect.

        A symbolic link is never followed, as locally (``O_NOFOLLOW``): SFTP has no such open
        flag, so ``path`` is ``lstat``-ed first and must be a regular file, and the opened file's
        own attributes (``fstat``) must still show a regular file of the same owner (a link
        swapped in between would show its target's, or fail the check). A job directory is
        private (0700) to its user: only the user could swap a name inside it.

        Raises:
            FileNotFoundError: no such file.
            IsADirectoryError: ``path`` is a directory.
            OSError: ``path`` is a symbolic link (``ELOOP``, as ``O_NOFOLLOW``) or not a regular
                file, or changed between the check and the open.
            ClusterUnreachable: as every call.
        """

        def read(sftp):
            first = sftp.lstat(path)
            kind = stat.S_IFMT(first.st_mode or 0)
            if kind == stat.S_IFLNK:
                raise OSError(errno.ELOOP, "a symbolic link: not followed (it could lead out of the job directory)",
                              path)
            if kind == stat.S_IFDIR:
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            if kind != stat.S_IFREG:
                raise OSError(errno.EINVAL, "not a regular file: not read", path)
            with self._file(sftp, path, "rb") as f:
                now = f.stat()
                if not stat.S_ISREG(now.st_mode or 0) or now.st_uid != first.st_uid:
                    raise OSError(errno.ELOOP, "replaced while it was opened (a link or another file): not read",
                                  path)
                if offset:
                    f.seek(offset)
                left = max(0, (now.st_size or 0) - offset)  # to the end as of now
                n = left if length is None else min(max(0, length), left)
                if n <= 0:
                    return b""
                if n > _ONE_REQUEST:  # pipelined reads of the range asked for, never the rest
                    f.prefetch(offset + n)
                return f.read(n)

        return self._call("read", path, lambda sftp, attempt: _unless_missing(read, sftp, path))

    def read_tails(self, directory, starts, wants=None, max_bytes=None):
        """Every grown event file's bytes past ``starts`` in **one request and its answer** on
        the login node: :mod:`hyperpod_lab.tails` runs there as one command
        (``<profile.python> -I -S -c <its source>``), started once per connection and kept, each
        request one line of JSON on its standard input (so ``directory`` never reaches a shell),
        each reply on its standard output. A poll costs one round trip however many writer files
        the job has, where SFTP costs a listing and five requests (``lstat``, ``open``,
        ``fstat``, ``read``, ``close``) per grown file. Counted in ``ops["exec"]`` and
        ``ops["tails"]``. Returns ``(sizes, data, errors)`` as :func:`hyperpod_lab.events.read_tails`.

        Where the login node cannot run it (no such ``python``, a reply that is not the
        program's), this and every later call fall back to SFTP (one listing, then ``read_from``
        per grown file) and ``tails_fallback`` says why (logged once).

        Raises:
            ClusterUnreachable: as :meth:`run` (it only reads: retried after a reconnect).
        """
        from hyperpod_lab import events

        if self.tails_fallback is None:
            ask = (directory, dict(starts), wants, max_bytes)
            try:
                self.ops["tails"] += 1
                return self._call("tails", directory, lambda o, attempt: self._tails_request(o, *ask), sftp=False,
                                  idempotent=True)
            except _TailsUnavailable as e:
                self.tails_fallback = str(e)
                log.warning("hyperpod_lab: %s: event files are read over SFTP, file by file (%s); set the "
                            "profile's python to a Python 3 on the login node", self._where(), self.tails_fallback)
        return events.read_tails(_FilesOnly(self), directory, starts, wants, max_bytes)

    def _tails_request(self, o, directory: str, starts: dict[str, int], wants, max_bytes):
        """One request to the connection's reader program (started on first use, or again when
        it ended): ``(sizes, data, errors)``. Sends only the offsets that differ from the last
        request's for ``directory`` to the same program (``base``: :class:`hyperpod_lab.tails.Program`),
        every offset when it holds no such request. Raises _TailsUnavailable when a fresh one
        cannot answer; socket.timeout / EOFError as a command's (the link)."""
        from hyperpod_lab import tails

        with self._tails_lock:
            for fresh in (False, True):
                kept = self._tails
                if fresh or kept is None or kept[0] is not o or kept[1].closed:
                    if kept is not None:
                        self._tails = None
                        try:
                            kept[1].close()
                        except Exception:
                            pass
                    if not fresh and kept is not None and kept[0] is o:
                        continue  # (closed: start it again below)
                    chan = o.transport.open_session(timeout=self.op_timeout_s)
                    chan.settimeout(self.op_timeout_s)
                    line = quote_argv(tails.program_argv(self.profile.python))
                    answered_within(chan, self.op_timeout_s, lambda: chan.exec_command(line), "the exec request")
                    kept = self._tails = (o, chan, chan.makefile("rb"))
                    self._tails_last = {}
                _, chan, out = kept
                try:
                    last = self._tails_last.pop(directory, None)
                    for whole in ((False, True) if last is not None else (True,)):
                        if whole:
                            req = tails.request(directory, starts, wants, max_bytes)
                        else:
                            before = last[1].get
                            delta = {k: v for k, v in starts.items() if before(k) != v}
                            # names that left the cursor (another reader's request was the last)
                            drop = last[1].keys() - starts.keys() if len(starts) != len(last[1]) or delta else ()
                            req = tails.request(directory, delta, wants, max_bytes, base=last[0], drop=drop)
                        chan.sendall(req)
                        head = out.readline()
                        n = int(head) if head.strip().isdigit() else -1
                        body = out.read(n) if n >= 0 else b""
                        if n < 0 or len(body) != n:
                            raise EOFError(f"the reader program ended ({head[:100]!r})")
                        got = tails.parse_reply(body)
                        if got is not None:
                            break
                    if got is None:
                        raise ValueError("the reader program asked for every offset again after it was sent them")
                    sizes, data, errors, gen, self.tails_probed = got
                    if gen is not None:
                        while len(self._tails_last) >= 64:
                            self._tails_last.pop(next(iter(self._tails_last)))
                        self._tails_last[directory] = (gen, starts)
                    return sizes, data, errors
                except (EOFError, OSError, ValueError) as e:
                    if isinstance(e, (TimeoutError, socket.timeout)):
                        raise
                    self._tails = None
                    try:
                        chan.close()
                    except Exception:
                        pass
                    if fresh:  # a link going down shows a moment later: not a reason to stop using the program
                        settle = time.monotonic() + 1.0
                        while o.active and time.monotonic() < settle:
                            time.sleep(0.05)
                    if not o.active:
                        raise EOFError(o.dead_reason or "the connection closed during a read_tails request") from None
                    if fresh:
                        err = b""
                        try:
                            err = chan.makefile_stderr("rb").read(300)
                        except Exception:
                            pass
                        raise _TailsUnavailable(f"`{self.profile.python} -c <hyperpod_lab.tails>` gave no answer: "
                                                f"{e}; {err.decode(errors='replace').strip()}") from None
            raise _TailsUnavailable("unreachable")

    def listdir(self, path):
        return self._call("list", path, lambda sftp, attempt: _unless_missing(
            lambda s: s.listdir(path), sftp, path, missing=list))

    def list_files(self, path):
        """Regular files and sizes (SFTP's readdir attributes are lstat's: links are not files)."""
        def files(sftp):
            return {a.filename: a.st_size or 0 for a in sftp.listdir_attr(path) if stat.S_ISREG(a.st_mode or 0)}

        return self._call("list", path, lambda sftp, attempt: _unless_missing(files, sftp, path, missing=dict))

    def stat(self, path):
        """The SFTP attributes of ``path`` (``st_size``, ``st_mode``, ``st_mtime``). Raises
        FileNotFoundError, ClusterUnreachable."""
        return self._call("stat", path, lambda sftp, attempt: _unless_missing(lambda s: s.stat(path), sftp, path))

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

    def user_name(self):
        """The login user the route logs in as (profile ``user``, else the OpenSSH config's
        ``User``, else the local user name): no round trip."""
        return self.route.target.user

    def tree_ops(self):
        """:func:`hyperpod_lab.private_dir.ensure_job_tree`'s operations over SFTP (``lstat``,
        ``stat``, ``mkdir``, ``chmod``) and the login user's uid (``id -u``, asked once)."""
        return _SFTPTreeOps(self)

    def close(self):
        kept, self._tails = self._tails, None
        if kept is not None:
            try:
                kept[1].close()
            except Exception:
                pass
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


class _TailsUnavailable(Exception):
    """Internal: the login node cannot run :mod:`hyperpod_lab.tails` (read over SFTP instead)."""


class _FilesOnly:
    """An :class:`SSHRemote`'s ``list_files`` and ``read_from`` only (SFTP), without its
    ``read_tails``: what :meth:`SSHRemote.read_tails` falls back to."""

    def __init__(self, remote: SSHRemote):
        self.list_files, self.read_from = remote.list_files, remote.read_from


class _SFTPTreeOps:
    """The file operations of :func:`hyperpod_lab.private_dir.ensure_job_tree` on an
    :class:`SSHRemote` (each one SFTP call, under its timeouts and reconnects)."""

    def __init__(self, remote: SSHRemote):
        self.remote = remote

    def lstat(self, path):
        return self.remote._call("lstat", path, lambda sftp, attempt: _unless_missing(
            lambda s: s.lstat(path), sftp, path))

    def stat(self, path):
        return self.remote.stat(path)

    def mkdir(self, path, mode):
        def once(sftp, attempt):
            try:
                sftp.mkdir(path, mode=mode)
            except IOError as e:
                try:  # SFTP servers answer an existing name with a generic failure
                    sftp.lstat(path)
                except IOError:
                    raise e from None
                raise FileExistsError(errno.EEXIST, "File exists", path) from None

        self.remote._call("mkdir", path, once, idempotent=False)

    def makedirs(self, path):
        self.remote.makedirs(path)

    def chmod(self, path, mode):
        self.remote._call("chmod", path, lambda sftp, attempt: sftp.chmod(path, mode))

    def uid(self):
        cached = getattr(self.remote, "_login_uid", None)
        if cached is None:
            out = self.remote.run(["id", "-u"], timeout_s=30, idempotent=True).stdout.strip()
            if not out.isdigit():
                raise RemoteCommandError(["id", "-u"], 0, f"printed {out[:100]!r}, not a uid")
            cached = self.remote._login_uid = int(out)
        return cached
