"""How a Slurm profile's SSH connection gets to its login node: the OpenSSH config, jump hosts
(ProxyJump), ProxyCommand, and AWS Systems Manager (SSM) sessions.

:func:`resolve_route` turns a :class:`~hyperpod_lab.submit.clusters.ClusterProfile` into a
:class:`Route` (pure: it reads the OpenSSH config file and nothing else); :func:`open_route`
connects it hop by hop and returns the paramiko client of the login node. Used only by
:class:`hyperpod_lab.schedulers.remote.SSHRemote`, the one seam that runs commands on a cluster.

The OpenSSH config is the profile's ``ssh_config`` or else ``~/.ssh/config`` (when it exists),
read with paramiko's own ``SSHConfig`` (``Host`` patterns, wildcards, negation and ``Match`` as
paramiko supports them). A profile's ``host`` is looked up there like ``ssh HOST`` would.

Precedence, per setting of the login node (the profile is to the config what ``ssh``'s command
line is to it: what the profile states wins, what it leaves unset or at its default the config
decides, then OpenSSH's defaults):

==================  =====================================================================
address             config ``HostName`` (else ``host`` itself)
port                profile ``port`` unless 22 (the default), else config ``Port``, else 22
user                profile ``user``, else config ``User``, else the local user name
keys                profile ``key_file``, else config ``IdentityFile`` (those that exist),
                    else ``~/.ssh/id_*`` (never an agent)
known_hosts         profile ``known_hosts`` and config ``UserKnownHostsFile`` /
                    ``GlobalKnownHostsFile`` together; ``~/.ssh/known_hosts`` if none is named
connect timeout     profile ``connect_timeout_s`` unless 10 (the default), else config
                    ``ConnectTimeout``, else 10 s
keepalive           config ``ServerAliveInterval`` / ``ServerAliveCountMax``, else 15 s / 3
                    (SSM: 60 s / 3 when the config names none, since SSM drops idle sessions
                    after 20 min); ``ServerAliveInterval 0`` turns keepalives off
path                profile ``ssm_target`` (``aws ssm start-session ... AWS-StartSSHSession``),
                    else config ``ProxyJump`` (several hops) or ``ProxyCommand``, else direct
==================  =====================================================================

A jump host takes its own ``Host`` entry's settings (``user@host:port`` in ``ProxyJump`` first);
a jump host whose entry names no ``User`` / ``IdentityFile`` uses the profile's ``user`` /
``key_file``. Only the first jump host's own ``ProxyJump`` / ``ProxyCommand`` applies (as in
OpenSSH, ``-J a,b`` reaches ``b`` through ``a``). A config naming both ``ProxyJump`` and
``ProxyCommand`` for one host is refused (paramiko cannot tell which came first, and OpenSSH
would take that one).

Every hop's host key is verified with paramiko's ``RejectPolicy`` against the hop's
known_hosts files: an unknown or changed key is an error naming the hop, never accepted, whatever
``StrictHostKeyChecking`` says. ``HostKeyAlias`` and agents are not used.

Keepalives and dead links: the login node's transport sends a keepalive (``set_keepalive``) every
``ServerAliveInterval`` seconds, and a :class:`KeepaliveMonitor` asks it for an answer (an
``keepalive@openssh.com`` global request with want-reply, which OpenSSH answers with a failure
reply, as ``ssh`` does) every interval: when none comes within ``ServerAliveInterval *
ServerAliveCountMax`` seconds, the link is dead and the transport is closed, so every call in
flight on it ends at once (and :class:`~hyperpod_lab.schedulers.remote.SSHRemote` reconnects).
The probe travels through every jump host, so one monitor on the login node covers the route.

A ``ProxyCommand`` from the config runs as OpenSSH runs it (``/bin/sh -c 'exec COMMAND'``, after
paramiko's ``%h``/``%p``/``%r`` expansion; it is the config owner's own command). The SSM command
is an argv list built by :func:`ssm_proxy_argv` and run without a shell.
"""

from __future__ import annotations

import getpass
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

from hyperpod_lab.errors import ClusterUnreachable, ConfigError, HostKeyError
from hyperpod_lab.submit.clusters import ClusterProfile

DEFAULT_PORT = 22
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_KEEPALIVE_S = 15  # ServerAliveInterval when the config names none (OpenSSH's default is off)
DEFAULT_KEEPALIVE_COUNT = 3  # ServerAliveCountMax, as OpenSSH
SSM_KEEPALIVE_S = 60
SSM_KEEPALIVE_COUNT = 3
MAX_HOPS = 8
AWS_CLI_INSTALL = "https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html"
SSM_PLUGIN_INSTALL = ("https://docs.aws.amazon.com/systems-manager/latest/userguide/"
                      "session-manager-working-with-install-plugin.html")


@dataclass
class Hop:
    """One SSH connection of a route.

    Attributes:
        alias: the name as written (profile ``host``, a ``ProxyJump`` entry, or the SSM target).
        hostname: where to connect (config ``HostName``); also the host key's name.
        port: TCP port; user: login user.
        key_files: private keys to offer ([]: ``~/.ssh/id_*``).
        known_hosts: known_hosts files to verify the host key against.
        required_known_hosts: of those, the one the profile names (it must exist).
        proxy_argv: a command whose stdin/stdout carry this hop (ProxyCommand or SSM), or None.
        proxy_display: that command as the user wrote it (for messages).
        keepalive_s, keepalive_count: ``ServerAliveInterval``, seconds (0: off; default 15) and
            ``ServerAliveCountMax`` (default 3): the link is dead after ``keepalive_s *
            keepalive_count`` seconds without an answer to a keepalive.
        connect_timeout_s: TCP connect, banner, auth and tunnel timeout, seconds.
        label: how errors name the hop, e.g. ``ProxyJump hop 1 (bastion:2223)``.
    """

    alias: str
    hostname: str
    port: int
    user: str
    key_files: list[str] = field(default_factory=list)
    known_hosts: list[str] = field(default_factory=list)
    required_known_hosts: str | None = None
    proxy_argv: list[str] | None = None
    proxy_display: str | None = None
    keepalive_s: int = DEFAULT_KEEPALIVE_S
    keepalive_count: int = DEFAULT_KEEPALIVE_COUNT
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    label: str = ""

    @property
    def where(self) -> str:
        return f"{self.hostname}:{self.port}"


@dataclass
class Route:
    """The hops to a login node: jump hosts in order, the login node last.

    Attributes:
        hops: ``hops[-1]`` is the login node; each earlier hop carries the next one through a
            ``direct-tcpip`` channel. hops[0] may be carried by a proxy command.
        ssh_config: the OpenSSH config file read, or None.
    """

    hops: list[Hop]
    ssh_config: str | None = None

    @property
    def target(self) -> Hop:
        return self.hops[-1]


# ---------------------------------------------------------------- resolution (pure)

def ssh_config_path(profile: ClusterProfile) -> str | None:
    """The OpenSSH config the profile uses: its ``ssh_config`` (must exist), else
    ``~/.ssh/config`` if it exists, else None. Raises ConfigError for a missing ``ssh_config``."""
    if profile.ssh_config:
        path = os.path.abspath(os.path.expanduser(profile.ssh_config))
        if not os.path.isfile(path):
            raise ConfigError(f"cluster '{profile.name}': ssh_config {path} does not exist; fix the path "
                              f"or remove 'ssh_config' to use ~/.ssh/config")
        return path
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else None


def _load_config(profile: ClusterProfile, path: str | None):
    if path is None:
        return None
    import paramiko

    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as e:  # ConfigParseError, OSError, bad Match
        raise ConfigError(f"cluster '{profile.name}': cannot read OpenSSH config {path}: {e}") from None


def _lookup(profile: ClusterProfile, cfg, path: str | None, alias: str) -> dict:
    if cfg is None:
        return {"hostname": alias}
    try:
        return dict(cfg.lookup(alias))
    except Exception as e:  # e.g. 'Match exec' without the invoke package, a bad token
        raise ConfigError(f"cluster '{profile.name}': OpenSSH config {path} cannot be applied to "
                          f"host {alias!r}: {e}") from None


def _words(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [w for v in value for w in str(v).split()]
    return str(value).split()


def _int(profile: ClusterProfile, path, alias: str, key: str, value, low: int, high: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = None
    if n is None or not low <= n <= high:
        raise ConfigError(f"cluster '{profile.name}': {key} {value!r} for host {alias!r} in {path} "
                          f"must be a whole number {low}-{high}")
    return n


def _parse_jump(profile: ClusterProfile, path, spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` (IPv6 in brackets) -> (user, host, port)."""
    s = spec.strip()
    if s.startswith("ssh://"):
        s = s[len("ssh://"):].rstrip("/")
    user, _, hostport = s.rpartition("@")
    port: str | None = None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    else:
        host = hostport
    if not host or (port is not None and not port.isdigit()) or host.startswith("-"):
        raise ConfigError(f"cluster '{profile.name}': ProxyJump entry {spec!r} in {path} is not [user@]host[:port]")
    return user or None, host, int(port) if port else None


def _known_hosts(profile: ClusterProfile, opts: dict) -> list[str]:
    files = ([profile.known_hosts] if profile.known_hosts else []) + _words(opts.get("userknownhostsfile")) \
        + _words(opts.get("globalknownhostsfile"))
    files = [os.path.expanduser(f) for f in files if f.lower() != "none"]
    out = list(dict.fromkeys(files))
    return out or [os.path.expanduser("~/.ssh/known_hosts")]


def _make_hop(profile: ClusterProfile, path, opts: dict, alias: str, *, target: bool,
              user: str | None = None, port: int | None = None) -> Hop:
    """A hop from its config options; ``user``/``port`` from a ProxyJump entry win."""
    if target:
        port_ = profile.port if profile.port != DEFAULT_PORT else None
        user_ = profile.user
        keys = [profile.key_file] if profile.key_file else []
    else:
        port_, user_, keys = port, user, []
    if port_ is None:
        port_ = _int(profile, path, alias, "Port", opts.get("port", DEFAULT_PORT), 1, 65535)
    user_ = user_ or opts.get("user") or (profile.user if not target else None) or getpass.getuser()
    if not keys:
        keys = [os.path.expanduser(k) for k in _words(opts.get("identityfile"))]
        if not target and not keys and profile.key_file:
            keys = [profile.key_file]
    if profile.connect_timeout_s != DEFAULT_CONNECT_TIMEOUT_S or "connecttimeout" not in opts:
        timeout = float(profile.connect_timeout_s)
    else:
        timeout = float(_int(profile, path, alias, "ConnectTimeout", opts["connecttimeout"], 1, 86400))
    keepalive = _int(profile, path, alias, "ServerAliveInterval",
                     opts.get("serveraliveinterval", DEFAULT_KEEPALIVE_S), 0, 86400)
    count = _int(profile, path, alias, "ServerAliveCountMax",
                 opts.get("serveralivecountmax", DEFAULT_KEEPALIVE_COUNT), 0, 1000)
    return Hop(alias=alias, hostname=str(opts.get("hostname") or alias), port=port_, user=str(user_),
               key_files=[os.path.expanduser(k) for k in keys], known_hosts=_known_hosts(profile, opts),
               required_known_hosts=os.path.expanduser(profile.known_hosts) if profile.known_hosts else None,
               keepalive_s=keepalive, keepalive_count=count, connect_timeout_s=timeout)


def _proxies(profile: ClusterProfile, path, opts: dict, alias: str) -> tuple[str | None, str | None]:
    jump = opts.get("proxyjump")
    cmd = opts.get("proxycommand")
    jump = None if not jump or str(jump).strip().lower() == "none" else str(jump).strip()
    cmd = None if not cmd or str(cmd).strip().lower() == "none" else str(cmd).strip()
    if jump and cmd:
        raise ConfigError(f"cluster '{profile.name}': host {alias!r} has both ProxyJump and ProxyCommand in "
                          f"{path}; keep one (OpenSSH takes whichever comes first, paramiko cannot tell)")
    return jump, cmd


def _chain(profile: ClusterProfile, cfg, path, alias: str, *, target: bool, user=None, port=None,
           depth: int = 0) -> list[Hop]:
    if depth > MAX_HOPS:
        raise ConfigError(f"cluster '{profile.name}': the ProxyJump chain in {path} is longer than {MAX_HOPS} "
                          f"hops at {alias!r}; is there a loop?")
    opts = _lookup(profile, cfg, path, alias)
    hop = _make_hop(profile, path, opts, alias, target=target, user=user, port=port)
    jump, cmd = _proxies(profile, path, opts, alias)
    if jump:
        specs = [_parse_jump(profile, path, s) for s in jump.split(",") if s.strip()]
        u, h, p = specs[0]
        hops = _chain(profile, cfg, path, h, target=False, user=u, port=p, depth=depth + 1)
        for u, h, p in specs[1:]:  # later jump hosts: their own settings, not their own proxies
            hops.append(_make_hop(profile, path, _lookup(profile, cfg, path, h), h, target=False, user=u, port=p))
        if len(hops) + 1 > MAX_HOPS + 1:
            raise ConfigError(f"cluster '{profile.name}': more than {MAX_HOPS} ProxyJump hops to {alias!r}")
        return hops + [hop]
    if cmd:
        hop.proxy_argv = ["/bin/sh", "-c", f"exec {cmd}"]
        hop.proxy_display = f"ProxyCommand {cmd}"
    return [hop]


def ssm_proxy_argv(profile: ClusterProfile, port: int | None = None) -> list[str]:
    """The argv of the SSM session that carries SSH to ``profile.ssm_target`` (no shell):
    ``aws ssm start-session --target T --document-name AWS-StartSSHSession --parameters
    portNumber=P`` (+ ``--region``, ``--profile`` from the profile's ``region``, ``aws_profile``)."""
    argv = ["aws", "ssm", "start-session", "--target", str(profile.ssm_target),
            "--document-name", "AWS-StartSSHSession", "--parameters", f"portNumber={port or profile.port}"]
    if profile.region:
        argv += ["--region", profile.region]
    if profile.aws_profile:
        argv += ["--profile", profile.aws_profile]
    return argv


def _label(route: list[Hop]) -> None:
    n = len(route)
    for i, hop in enumerate(route, 1):
        at = f"{hop.alias}:{hop.port}" + (f", HostName {hop.hostname}" if hop.hostname != hop.alias else "")
        if i < n:
            hop.label = f"ProxyJump hop {i} ({at})"
        elif hop.alias == hop.hostname:
            hop.label = f"login node {hop.hostname}:{hop.port}"
        else:
            hop.label = f"login node {hop.alias} ({hop.hostname}:{hop.port})"
        if hop.proxy_display:
            hop.label += f" via {hop.proxy_display.split(' ', 1)[0]}"


def resolve_route(profile: ClusterProfile) -> Route:
    """The hops from here to the profile's login node (see the module docstring for precedence).

    Raises:
        ConfigError: the profile's ssh_config is missing or unreadable, a value in it is malformed,
            both ProxyJump and ProxyCommand apply to one host, or the ProxyJump chain is too long.
    """
    path = ssh_config_path(profile)
    cfg = _load_config(profile, path)
    if profile.ssm_target:
        alias = profile.host or profile.ssm_target
        opts = _lookup(profile, cfg, path, alias)
        hop = _make_hop(profile, path, opts, alias, target=True)
        if not profile.host:
            hop.hostname = profile.ssm_target  # the host key's name in known_hosts
        if "serveraliveinterval" not in opts:
            hop.keepalive_s, hop.keepalive_count = SSM_KEEPALIVE_S, SSM_KEEPALIVE_COUNT
        hop.proxy_argv = ssm_proxy_argv(profile, hop.port)
        hop.proxy_display = "SSM " + " ".join(hop.proxy_argv)
        hops = [hop]
    else:
        if not profile.host:
            raise ConfigError(f"cluster '{profile.name}': 'host' (or 'ssm_target') is required for a slurm cluster")
        hops = _chain(profile, cfg, path, profile.host, target=True)
    _label(hops)
    return Route(hops=hops, ssh_config=path)


# ---------------------------------------------------------------- the proxy command as a socket

class ProxyProcess:
    """A socket-like pipe through a command's stdin/stdout (what paramiko's Transport needs).

    Unlike ``paramiko.ProxyCommand`` it reports end of stream (``recv`` returns ``b""`` once the
    command exits, so a failed proxy fails the handshake at once instead of at the banner
    timeout), runs an argv list without a shell, and keeps the command's stderr for messages.
    """

    def __init__(self, argv: list[str], display: str):
        self.argv, self.display = list(argv), display
        self._err = tempfile.TemporaryFile()
        try:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=self._err, bufsize=0, start_new_session=True)
        except OSError as e:
            self._err.close()
            raise ClusterUnreachable(f"cannot start {display}: {e.strerror or e}") from None
        self.timeout: float | None = None
        self._closed = False
        self._tail = ""

    def send(self, data: bytes) -> int:
        try:
            return self.process.stdin.write(data) or len(data)
        except (OSError, ValueError) as e:
            raise EOFError(f"{self.display} ended: {e}") from None

    def recv(self, size: int) -> bytes:
        fd = self.process.stdout.fileno()
        try:
            r, _, _ = select.select([fd], [], [], self.timeout)
        except (OSError, ValueError):
            return b""
        if not r:
            raise socket.timeout()
        try:
            return os.read(fd, size)
        except OSError:
            return b""

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def stderr_tail(self, limit: int = 2000) -> str:
        """The last ``limit`` characters the command wrote to stderr (kept after :meth:`close`)."""
        if self._closed:
            return self._tail[-limit:]
        try:
            self._err.seek(0, os.SEEK_END)
            size = self._err.tell()
            self._err.seek(max(0, size - 4 * limit))
            return self._err.read().decode(errors="replace").strip()[-limit:]
        except (OSError, ValueError):
            return ""

    def exit_status(self, wait_s: float = 0.0) -> int | None:
        try:
            return self.process.wait(wait_s) if wait_s else self.process.poll()
        except subprocess.TimeoutExpired:
            return None

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._tail = self.stderr_tail()
        self._closed = True
        for f in (self.process.stdin, self.process.stdout):
            try:
                f.close()
            except OSError:
                pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except OSError:
                pass
            if self.exit_status(2.0) is None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.exit_status(2.0)
        self._err.close()


# ---------------------------------------------------------------- connecting

def _check_ssm_tools(hop: Hop) -> None:
    if not shutil.which("aws"):
        raise ClusterUnreachable(f"{hop.label}: the AWS CLI ('aws') is not on PATH; SSM sessions need it: "
                                 f"install AWS CLI v2 ({AWS_CLI_INSTALL}) and run 'aws configure'")
    if not shutil.which("session-manager-plugin"):
        raise ClusterUnreachable(f"{hop.label}: the Session Manager plugin ('session-manager-plugin') is not on "
                                 f"PATH; 'aws ssm start-session' needs it: install it ({SSM_PLUGIN_INSTALL})")


def _host_keys_client(hop: Hop, profile_name: str):
    import paramiko

    if hop.required_known_hosts and not os.path.isfile(hop.required_known_hosts):
        raise HostKeyError(f"{hop.label}: known_hosts file {hop.required_known_hosts!r} of cluster '{profile_name}' "
                           f"is missing; add the host key there (ssh-keyscan -p {hop.port} {hop.hostname} and check "
                           f"its fingerprint), or rerun 'hyperpod-lab dev-cluster up' for local-slurm")
    existing = [f for f in hop.known_hosts if os.path.isfile(f)]
    if not existing:
        raise HostKeyError(f"{hop.label}: none of its known_hosts files exists ({', '.join(hop.known_hosts)}); "
                           f"add the host key (ssh-keyscan -p {hop.port} {hop.hostname}, fingerprint checked) "
                           f"to the profile's known_hosts or the config's UserKnownHostsFile")
    client = paramiko.SSHClient()
    for f in existing:
        try:
            client.get_host_keys().load(f)
        except (OSError, paramiko.SSHException) as e:
            raise HostKeyError(f"{hop.label}: cannot read known_hosts file {f}: {e}") from None
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client, existing


def _keys(hop: Hop) -> list[str] | None:
    if not hop.key_files:
        return None
    found = [k for k in hop.key_files if os.path.isfile(k)]
    if not found:
        raise ClusterUnreachable(f"{hop.label}: no private key found at {', '.join(hop.key_files)}; "
                                 f"fix key_file in the profile or IdentityFile in the OpenSSH config")
    return found


def _connect_hop(hop: Hop, sock, profile_name: str, proxy: ProxyProcess | None):
    """Connect and authenticate one hop (its host key verified); return the paramiko client."""
    import paramiko

    client, kh_files = _host_keys_client(hop, profile_name)
    keys = _keys(hop)
    t = hop.connect_timeout_s

    def proxy_said() -> str:
        if proxy is None:
            return ""
        rc = proxy.exit_status(0.5)
        err = proxy.stderr_tail()
        return (f"; {proxy.display} " + (f"exited with status {rc}" if rc is not None else "is running")
                + (f": {err}" if err else ""))

    def proxy_ended() -> None:
        """A proxy command that exited is the cause: say so, with its stderr."""
        if proxy is not None and proxy.exit_status(0.5) is not None:
            raise ClusterUnreachable(f"cannot reach {hop.label} of cluster '{profile_name}': the connection "
                                     f"ended before SSH started{proxy_said()}") from None

    try:
        client.connect(hop.hostname, port=hop.port, username=hop.user, key_filename=keys,
                       allow_agent=False, look_for_keys=keys is None, timeout=t, banner_timeout=t,
                       auth_timeout=t, channel_timeout=t, sock=sock)
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyError(f"{hop.label}: host key does not match {', '.join(kh_files)} "
                           f"(got {e.key.get_name()} {e.key.get_base64()[:24]}...): possible man-in-the-middle, "
                           f"or the node was rebuilt; verify the new key before replacing the entry") from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise ClusterUnreachable(f"{hop.label}: {hop.user}@{hop.where} refused the key(s) "
                                 f"{', '.join(keys or ['~/.ssh/id_*'])}: {e}; check user and key_file of cluster "
                                 f"'{profile_name}' (or User / IdentityFile in the OpenSSH config)") from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" not in str(e):
            proxy_ended()
        if "not found in known_hosts" in str(e):
            raise HostKeyError(f"{hop.label}: host key not in known_hosts ({', '.join(kh_files)}): it is unknown; "
                               f"verify the host's key fingerprint and add it there (hyperpod-lab never trusts "
                               f"an unknown key on first use)") from None
        raise ClusterUnreachable(f"cannot reach {hop.label} of cluster '{profile_name}': SSH handshake failed "
                                 f"({e}); is sshd running there?{proxy_said()}") from None
    except (socket.timeout, TimeoutError):
        client.close()
        proxy_ended()
        raise ClusterUnreachable(f"cannot reach {hop.label} of cluster '{profile_name}': no answer within "
                                 f"{t:g} s; check host, port and network/VPN{proxy_said()}") from None
    except EOFError:
        client.close()
        proxy_ended()
        raise ClusterUnreachable(f"cannot reach {hop.label} of cluster '{profile_name}': the connection closed "
                                 f"before SSH started{proxy_said()}") from None
    except (OSError, paramiko.ssh_exception.NoValidConnectionsError) as e:
        client.close()
        reason = getattr(e, "strerror", None) or str(e)
        raise ClusterUnreachable(f"cannot reach {hop.label} of cluster '{profile_name}': {reason}; check host "
                                 f"and port, or start it ('hyperpod-lab dev-cluster up' for local-slurm)"
                                 f"{proxy_said()}") from None
    if hop.keepalive_s:
        client.get_transport().set_keepalive(hop.keepalive_s)
    return client


def probe(transport, timeout_s: float) -> bool:
    """Whether ``transport`` answers a keepalive (``keepalive@openssh.com``, want-reply) within
    ``timeout_s`` seconds. False for a closed transport. paramiko waits for the reply without a
    timeout, so the request runs in a short-lived daemon thread, which ends when the reply comes or
    the transport closes."""
    if transport is None or not transport.is_active():
        return False
    done = threading.Event()

    def ask():
        try:
            transport.global_request("keepalive@openssh.com", wait=True)  # a failure reply is an answer
        except Exception:  # the transport went away: no answer
            return
        if transport.is_active():
            done.set()

    threading.Thread(target=ask, name="hyperpod-lab-keepalive-probe", daemon=True).start()
    return done.wait(timeout_s)


class KeepaliveMonitor:
    """Detects a dead link to a login node (OpenSSH's ``ServerAliveInterval`` /
    ``ServerAliveCountMax``): every ``interval_s`` seconds it asks the transport for an answer
    (:func:`probe`); when none comes within ``interval_s * count`` seconds it records why in
    :attr:`dead_reason` and closes the transport, so every call waiting on it ends at once.

    Args:
        transport: the login node's paramiko Transport.
        interval_s: seconds between keepalives (> 0).
        count: keepalives that may go unanswered (``ServerAliveCountMax``; 0 counts as 1).
        label: the hop, for :attr:`dead_reason`.

    Attributes:
        dead_reason: None while the link answers; else a sentence naming the hop and the silence.
    """

    def __init__(self, transport, interval_s: float, count: int, label: str):
        self.transport, self.interval_s, self.count, self.label = transport, float(interval_s), max(1, count), label
        self.dead_reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hyperpod-lab-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.transport.is_active():
                return
            window = self.interval_s * self.count
            if not probe(self.transport, window) and not self._stop.is_set() and self.transport.is_active():
                self.dead_reason = (f"{self.label} answered none of {self.count} keepalive(s) in {window:g} s "
                                    f"(ServerAliveInterval {self.interval_s:g} s, ServerAliveCountMax {self.count}): "
                                    f"the link is dead")
                self.transport.close()
                return

    def stop(self) -> None:
        self._stop.set()


@dataclass
class OpenRoute:
    """A connected route: ``client`` is the login node's; ``parts`` are the jump clients and proxy
    processes under it, closed (innermost first) by :meth:`close`; ``monitor`` watches the link
    (None when ``ServerAliveInterval`` is 0)."""

    route: Route
    client: object
    parts: list = field(default_factory=list)
    monitor: KeepaliveMonitor | None = None
    opened_at: float = field(default_factory=time.monotonic)

    @property
    def transport(self):
        return self.client.get_transport()

    @property
    def active(self) -> bool:
        """Whether the login node's transport is open (False once the monitor found it dead)."""
        t = self.transport
        return bool(t is not None and t.is_active())

    @property
    def dead_reason(self) -> str | None:
        return self.monitor.dead_reason if self.monitor is not None else None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        for part in [self.client, *reversed(self.parts)]:
            try:
                part.close()
            except Exception:  # closing what is already gone
                pass


def open_route(route: Route, profile_name: str) -> OpenRoute:
    """Connect every hop of ``route`` in turn, verifying each host key.

    Raises:
        HostKeyError: a hop's host key is unknown or differs (the message names the hop).
        ClusterUnreachable: a hop did not answer, refused the key, its proxy command failed or
            is missing (the AWS CLI / Session Manager plugin for SSM), or a jump host refused
            the tunnel to the next hop.
    """
    import paramiko

    parts: list = []
    client = None
    try:
        for i, hop in enumerate(route.hops):
            sock, proxy = None, None
            if i > 0:
                prev = route.hops[i - 1]
                try:
                    sock = client.get_transport().open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=hop.connect_timeout_s)
                except paramiko.ChannelException as e:
                    raise ClusterUnreachable(f"{prev.label} refused a tunnel to {hop.where} for {hop.label} of "
                                             f"cluster '{profile_name}': {e.text or e}; does the jump host allow "
                                             f"forwarding there (AllowTcpForwarding, PermitOpen)?") from None
                except (paramiko.SSHException, socket.timeout, EOFError, OSError) as e:
                    raise ClusterUnreachable(f"{prev.label} could not open a tunnel to {hop.where} for {hop.label} "
                                             f"of cluster '{profile_name}': {e or type(e).__name__}") from None
            elif hop.proxy_argv:
                if hop.proxy_argv[0] == "aws":
                    _check_ssm_tools(hop)
                proxy = sock = ProxyProcess(hop.proxy_argv, hop.proxy_display or " ".join(hop.proxy_argv))
                parts.append(proxy)
            client = _connect_hop(hop, sock, profile_name, proxy)
            if i < len(route.hops) - 1:
                parts.append(client)
    except BaseException:
        for part in reversed(parts):
            try:
                part.close()
            except Exception:
                pass
        raise
    target = route.target
    monitor = (KeepaliveMonitor(client.get_transport(), target.keepalive_s, target.keepalive_count, target.label)
               if target.keepalive_s else None)
    return OpenRoute(route=route, client=client, parts=parts, monitor=monitor)


def describe(route: Route) -> str:
    """One line per hop, for ``--verbose`` output and messages."""
    return " -> ".join(f"{h.user}@{h.where}" + (f" [{h.proxy_display}]" if h.proxy_display else "")
                       for h in route.hops)


__all__ = ["Hop", "Route", "OpenRoute", "ProxyProcess", "KeepaliveMonitor", "resolve_route", "open_route",
           "probe", "ssm_proxy_argv", "ssh_config_path", "describe"]
