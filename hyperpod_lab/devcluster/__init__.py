"""The local dev cluster: real Slurm on this host, reached over SSH like a HyperPod login node.

``up()`` runs ``devcluster.sh up`` (as root) which starts munge, a private MariaDB + slurmdbd
(so ``sacct`` works), slurmctld, three slurmd "nodes" ``n1``, ``n2``, ``n3`` (``nodes``) in partition ``dev``, each in its own
mount namespace (a test gives one node its own mounts with ``nsenter``, see :func:`node_pid`),
an sshd on ``127.0.0.1:<ssh_port>`` with key-only root login, and a bastion: a second sshd on
``127.0.0.1:<bastion_port>`` (its own host key, the same client key, forwarding only to the login
node's port) for jump-host tests (:func:`bastion`). It then writes the cluster profile ``local-slurm`` (see :mod:`hyperpod_lab.submit.clusters`) pointing at that sshd, its
generated client key and known_hosts, and the shared directory ``<base>/fsx``.

Everything lives under ``base_dir`` (``$HYPERPOD_LAB_DEV_DIR`` or ``/var/tmp/hyperpod-lab-dev``).
Slurm's state and the accounting database are both kept there, across ``down``/``up``: wipe
the whole directory (after ``down``) or nothing, else JobIDs restart at 1 and collide in sacct.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from typing import Any

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.jobdir import ENV_DEV_BASTION_PORT, ENV_DEV_CPUS, ENV_DEV_DIR, ENV_DEV_NODES, ENV_DEV_SSH_PORT
from hyperpod_lab.submit.clusters import ClusterDefaults, ClusterProfile, save_profile

PROFILE_NAME = "local-slurm"
DEFAULT_BASE_DIR = "/var/tmp/hyperpod-lab-dev"
DEFAULT_SSH_PORT = 2222
DEFAULT_BASTION_PORT = 2223
PARTITION = "dev"
DEFAULT_NODES = 3  # a 2-node job (the profile's default size) plus a spare
MAX_CPUS = 64  # CPUs a node may declare (more than the host has: config_overrides)
MAX_NODES = 32  # slurmd ports 6818, 6820..6850; each slurmd takes ~10 MB and one mount namespace
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "devcluster.sh")

_NOT_ROOT = "dev-cluster needs root to install and start Slurm; run it with sudo"
_READY_STATES = {"idle", "mixed", "allocated", "completing"}

__all__ = ["up", "down", "status", "bastion", "base_dir", "node_pid", "PROFILE_NAME", "SCRIPT"]


def base_dir(base: str | None = None) -> str:
    """The dev cluster's directory: ``base``, else ``$HYPERPOD_LAB_DEV_DIR``, else the default."""
    return os.path.abspath(os.path.expanduser(base or os.environ.get(ENV_DEV_DIR) or DEFAULT_BASE_DIR))


def _ssh_port(port: int | None) -> int:
    if port is None:
        env = os.environ.get(ENV_DEV_SSH_PORT)
        try:
            port = int(env) if env else DEFAULT_SSH_PORT
        except ValueError:
            raise HyperPodLabError(f"{ENV_DEV_SSH_PORT} must be a port number, got {env!r}") from None
    if not isinstance(port, int) or not 0 < port < 65536:
        raise HyperPodLabError(f"ssh_port must be 1-65535, got {port!r}")
    return port


def bastion_port() -> int:
    """The bastion's port: ``$HYPERPOD_LAB_DEV_BASTION_PORT`` or 2223."""
    env = os.environ.get(ENV_DEV_BASTION_PORT)
    try:
        port = int(env) if env else DEFAULT_BASTION_PORT
    except ValueError:
        raise HyperPodLabError(f"{ENV_DEV_BASTION_PORT} must be a port number, got {env!r}") from None
    if not 0 < port < 65536:
        raise HyperPodLabError(f"{ENV_DEV_BASTION_PORT} must be 1-65535, got {port}")
    return port


def bastion(base: str | None = None) -> dict[str, Any]:
    """The dev cluster's jump host (started by :func:`up`; nothing is started here).

    Returns ``{"host": "127.0.0.1", "port": int, "user": "root", "key_file": str,
    "known_hosts": str}``: ``known_hosts`` holds the bastion's host key only (the login node's is
    in the profile's known_hosts); the key is the profile's client key. The bastion forwards
    only to the login node's port and runs no commands (``ForceCommand /bin/true``).
    """
    b = base_dir(base)
    return {"host": "127.0.0.1", "port": bastion_port(), "user": "root",
            "key_file": os.path.join(b, "ssh", "id_ed25519"),
            "known_hosts": os.path.join(b, "ssh", "bastion_known_hosts")}


def _env(base: str, ssh_port: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_DEV_DIR] = base
    if ssh_port is not None:
        env[ENV_DEV_SSH_PORT] = str(ssh_port)
    env.setdefault("LC_ALL", "C")
    return env


def _run_script(action: str, env: dict[str, str], quiet: bool, check: bool = True) -> tuple[int, str]:
    """Run ``bash devcluster.sh ACTION``; stream its lines unless quiet; return (rc, output)."""
    if not os.path.isfile(SCRIPT):
        raise HyperPodLabError(f"{SCRIPT} is missing; reinstall hyperpod-lab")
    tail: collections.deque[str] = collections.deque(maxlen=40)
    lines: list[str] = []
    try:
        proc = subprocess.Popen(["bash", SCRIPT, action], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, env=env, errors="replace")
    except OSError as e:
        raise HyperPodLabError(f"cannot run {SCRIPT} with bash: {e}") from None
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            lines.append(line)
            if not quiet:
                sys.stdout.write(line)
                sys.stdout.flush()
    rc = proc.wait()
    if check and rc != 0:
        if rc == 3:
            raise HyperPodLabError(_NOT_ROOT)
        joined = "\n".join(tail)
        raise HyperPodLabError(f"dev-cluster {action} failed (exit {rc}); last output:\n{joined}")
    return rc, "".join(lines)


def profile_for(base: str | None = None, ssh_port: int | None = None,
                python: str | None = None) -> ClusterProfile:
    """The ``local-slurm`` profile describing the dev cluster in ``base`` (nothing is started)."""
    b = base_dir(base)
    return ClusterProfile(
        name=PROFILE_NAME,
        orchestrator="slurm",
        host="127.0.0.1",
        port=_ssh_port(ssh_port),
        user="root",
        key_file=os.path.join(b, "ssh", "id_ed25519"),
        known_hosts=os.path.join(b, "ssh", "known_hosts"),
        shared_root=os.path.join(b, "fsx"),
        python=python or sys.executable,
        defaults=ClusterDefaults(partition=PARTITION, nodes=2, procs_per_node=1),
    )


def up(base_dir: str | None = None, ssh_port: int | None = None, python: str | None = None,
       quiet: bool = False, nodes: int = DEFAULT_NODES, cpus: int | None = None) -> ClusterProfile:
    """Start the dev cluster (idempotent; a quick no-op when it is already up).

    Installs missing apt packages, starts the daemons (only those not running: a running daemon
    whose config is unchanged is left alone, and the bastion is started beside the others),
    waits until every node is idle and both sshds accept our key, then writes the ``local-slurm`` profile and returns it.

    Args:
        base_dir: the cluster's directory (default ``$HYPERPOD_LAB_DEV_DIR`` or
            ``/var/tmp/hyperpod-lab-dev``).
        ssh_port: sshd port on 127.0.0.1 (default ``$HYPERPOD_LAB_DEV_SSH_PORT`` or 2222).
        python: interpreter the jobs run (default: this one, ``sys.executable``).
        quiet: don't echo the script's progress lines.
        nodes: slurmd nodes ``n1``..``n<nodes>``, 2 to ``MAX_NODES`` = 32 (default 3; a change
            restarts every Slurm daemon, so running jobs are lost).
        cpus: CPUs each node declares, 1 to ``MAX_CPUS`` = 64 (default None: this host's,
            ``nproc``). More than the host has lets Slurm place that many processes a node
            (``--cpus-per-task``), sharing the host's cores: the production shape's 8 ranks a
            node on a 2-core machine. A change restarts the Slurm daemons, as ``nodes`` does.

    Raises:
        HyperPodLabError: not root, or the script failed (the message holds its last lines).
    """
    base = _base(base_dir)
    port = _ssh_port(ssh_port)
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise HyperPodLabError(_NOT_ROOT)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= MAX_NODES:
        raise HyperPodLabError(f"nodes must be 2 to {MAX_NODES}, got {nodes!r}")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or not 1 <= cpus <= MAX_CPUS):
        raise HyperPodLabError(f"cpus must be 1 to {MAX_CPUS} (CPUs each node declares), got {cpus!r}")
    env = _env(base, port)
    env[ENV_DEV_NODES] = str(nodes)
    if cpus is not None:  # else the script's default (or $HYPERPOD_LAB_DEV_CPUS)
        env[ENV_DEV_CPUS] = str(cpus)
    _run_script("up", env, quiet)
    profile = profile_for(base, port, python)
    for path in (profile.key_file, profile.known_hosts, bastion(base)["known_hosts"]):
        if not os.path.isfile(path):  # type: ignore[arg-type]
            raise HyperPodLabError(f"dev-cluster up finished but {path} is missing; see {base}/log")
    save_profile(profile)
    return profile


def down(base_dir: str | None = None, quiet: bool = False) -> None:
    """Stop the daemons ``up`` started (running jobs are cancelled); keep all state and keys."""
    base = _base(base_dir)
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise HyperPodLabError("dev-cluster needs root to stop Slurm; run it with sudo")
    _run_script("down", _env(base), quiet)


_ROW = re.compile(r"^(\S+)\s+(\S+)\s*(.*)$")


def status(base_dir: str | None = None) -> dict[str, Any]:
    """State of the dev cluster (nothing is changed; root is not needed).

    Returns ``{"ok": bool, "base_dir": str, "daemons": {name: {"state", "pid", "detail"}},
    "nodes": {"n1": "idle", ...}, "sinfo": str, "output": str}``. Daemon names: ``munged``,
    ``mariadb``, ``slurmdbd``, ``slurmctld``, ``slurmd@n1`` ... ``slurmd@n<N>``, ``sshd``, ``bastion``; states
    ``running`` | ``stopped`` | ``failing``. ``ok`` is true when every daemon runs, both sshds
    accept our key and every node is usable (idle, mixed, allocated or completing).
    """
    base = _base(base_dir)
    rc, out = _run_script("status", _env(base), quiet=True, check=False)
    daemons: dict[str, dict[str, Any]] = {}
    nodes: dict[str, str] = {}
    head, _, sinfo = out.partition("--- sinfo ---\n")
    for line in head.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        name, state, detail = m.group(1), m.group(2), m.group(3).strip()
        if name.startswith("node:"):
            nodes[name[len("node:"):]] = state
        else:
            pid = re.search(r"\bpid (\d+)", detail)
            daemons[name] = {"state": state, "pid": int(pid.group(1)) if pid else None, "detail": detail}
    ok = (rc == 0 and bool(daemons) and all(d["state"] == "running" for d in daemons.values())
          and bool(nodes) and all(state in _READY_STATES for state in nodes.values()))
    return {"ok": ok, "base_dir": base, "daemons": daemons, "nodes": nodes,
            "sinfo": sinfo.strip(), "output": out}


def node_pid(node: str, base: str | None = None) -> int:
    """Pid of the slurmd of ``node`` (e.g. ``"n2"``): ``nsenter --mount --target PID`` enters
    that node's own mount namespace. Raises HyperPodLabError when it does not run."""
    if not re.fullmatch(r"n[1-9][0-9]?", node) or int(node[1:]) > MAX_NODES:
        raise HyperPodLabError(f"no dev-cluster node {node!r}; the nodes are n1..n{MAX_NODES}")
    path = os.path.join(base_dir(base), "run", f"slurmd-{node}.pid")
    try:
        with open(path) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        raise HyperPodLabError(f"slurmd of {node} is not running ({path}); run 'hyperpod-lab dev-cluster up'") from None
    return pid


def _base(base: str | None) -> str:
    return base_dir(base)
