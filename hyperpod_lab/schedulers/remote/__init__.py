"""The one seam through which hyperpod-lab runs commands and touches files on a cluster.

Every command is an argv list. Over SSH it is joined with :func:`quote_argv` (``shlex.quote``
on each word), so nothing a user types is ever interpreted by the remote shell; locally it is
run with ``subprocess`` and no shell at all. Files go over SFTP on the same connection.

Connections are reused: :func:`connect` keeps one open ``SSHRemote`` per cluster profile.
Host keys are verified against the profile's known_hosts file with paramiko's RejectPolicy;
an unknown or changed key is an error, never silently accepted.

Laid out by where the commands run: :mod:`.base` (the interface and :func:`quote_argv`),
:mod:`.local`, :mod:`.ssh`, :mod:`.mounted`, :mod:`.route` (how SSH reaches the login node);
this module keeps the connection cache (:func:`connect`, :func:`close_all`).
"""

from __future__ import annotations

import threading

from hyperpod_lab.schedulers.remote.base import CommandOutcomeUnknown, CommandResult, Remote, StagedFile, Staging, quote_argv
from hyperpod_lab.schedulers.remote.local import LocalRemote
from hyperpod_lab.schedulers.remote.mounted import MountedRemote, MountMap, detect_local_mount, mount_candidates, with_local_mount
from hyperpod_lab.schedulers.remote.ssh import RECONNECT_DELAYS_S, SSHRemote, answered_within
from hyperpod_lab.submit.clusters import ClusterProfile

__all__ = ["CommandOutcomeUnknown", "CommandResult", "Remote", "StagedFile", "Staging", "quote_argv", "LocalRemote",
           "MountedRemote", "MountMap", "detect_local_mount", "mount_candidates", "with_local_mount", "RECONNECT_DELAYS_S", "SSHRemote",
           "answered_within", "connect", "close_all"]

_CONNECTIONS: dict[str, Remote] = {}
_KEY_LOCKS: dict[str, threading.Lock] = {}
_CONN_LOCK = threading.Lock()  # guards the two dicts only, never held while connecting


def connect(profile: ClusterProfile) -> Remote:
    """The Remote of a profile: one reused SSH connection per slurm cluster (reopened in place
    if it was dropped), or LocalRemote. With the profile's ``local_mount`` (a path, and the
    cluster directory it shows: ``local_mount_cluster_path``; or ``"auto"`` and the probe found
    one), a :class:`MountedRemote` over that connection: files on this machine, commands over SSH.

    Connecting to one cluster never waits for another's connect (a lock per profile).

    Raises:
        ClusterUnreachable, HostKeyError, ConfigError: as :class:`SSHRemote`; ConfigError also
            as :func:`with_local_mount` (the mount does not show the user's job tree).
    """
    if profile.orchestrator == "local":
        return LocalRemote()
    key = (f"{profile.name}|{profile.host}|{profile.port}|{profile.user}|{profile.ssh_config}|"
           f"{profile.ssm_target}|{profile.key_file}|{profile.known_hosts}|{profile.connect_timeout_s}|"
           f"{getattr(profile, 'op_timeout_s', None)}|{profile.shared_root}|{getattr(profile, 'local_mount', None)}|"
           f"{getattr(profile, 'local_mount_cluster_path', None)}")
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
