"""The torchft Lighthouse of a checkpointless job: start it, publish its address, find it.

One Lighthouse per job forms the quorum of live data-parallel replica groups before every
step (see :mod:`hyperpod_lab.runtime.checkpointless.ft`). ``python -m hyperpod_lab.node.lighthouse
--job-dir DIR --min-replicas N`` runs torchft's ``torchft_lighthouse`` on a free port and writes
``<job_dir>/lighthouse.json`` ``{"address": "http://HOST:PORT", "pid", "node", "time",
"heartbeat_ms", "heartbeat_interval_ms", ...}`` so that
every replica group — including ones that join later from another allocation — can find it
through the shared file system.

Timeouts (milliseconds), all passed to ``torchft_lighthouse``: ``--heartbeat-ms``: a replica
group whose Manager has not heartbeated for this long is dropped from the next quorum. It is what
a survivor of a killed replica group waits for before its new quorum forms (torchft 0.2.0's
Lighthouse drops a group on nothing else: it has no call to report a failed one, and with two
groups its split-brain rule keeps the survivor waiting while the dead group still looks alive).
Default (:func:`default_heartbeat_ms`): 100 ms when the Lighthouse listens on loopback (every
group on this host: no packet loss), 300 ms on a cluster network (a lost heartbeat packet may be
retransmitted only after TCP's minimum retransmission timeout, 200 ms on Linux: a shorter timeout
would drop a live group). The groups' Managers heartbeat every ``heartbeat_ms / 5``
(:func:`heartbeat_interval_ms`, published in ``lighthouse.json``; from torchft's Rust thread, not
the GIL-bound training loop). ``--quorum-tick-ms`` (default 10): how often the Lighthouse
re-checks a pending quorum (torchft's default 100 ms would add up to 100 ms after a dead group's
heartbeat expires). ``--join-timeout-ms`` (default 5000): how long a quorum waits for a
heartbeating (alive, maybe slow) group to ask for it — a slow group is waited for, not dropped.
Measurements: docs/checkpointless.md, "Timeout hierarchy".
A crashed ``torchft_lighthouse`` is restarted on the same port (``--max-restarts``, default 10):
see :func:`supervise`.

It listens on the address it publishes (``--host``, resolved to an IP: the cluster interface,
``127.0.0.1`` for the local backend), never on every interface. torchft's Lighthouse has no
authentication; see docs/checkpointless.md, "Security".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.jobdir import ENV_LIGHTHOUSE_HOST, JobPaths, node_name

LOOPBACK_HEARTBEAT_MS = 100  # heartbeat timeout when every group is on this host
NETWORK_HEARTBEAT_MS = 300   # across nodes: > Linux's 200 ms minimum TCP retransmission timeout
DEFAULT_JOIN_TIMEOUT_MS = 5000
DEFAULT_QUORUM_TICK_MS = 10
MIN_HEARTBEAT_INTERVAL_MS = 10
DEFAULT_MAX_RESTARTS = 10  # restarts of a crashed Lighthouse, on the same port
START_TIMEOUT_S = 60.0
"""How long :func:`start` waits for ``torchft_lighthouse`` to accept connections. The entry point
imports torch (``from torchft._torchft import lighthouse_main`` runs ``torchft/__init__``): 7 s on
this 2-core host under load, and 10 s (the old limit) was exceeded when the batch script started
it beside the pre-flight health checks of 17 nodes importing torch on the same host
(tests/runtime/test_scale16_slurm.py). The groups wait up to 60 s for its address
(``read_address``), counted from their own start, which comes after those checks."""


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` (an IPv4 or IPv6 address) is a loopback address."""
    import ipaddress

    try:
        return ipaddress.ip_address(ip.strip("[]")).is_loopback
    except ValueError:
        return False


def default_heartbeat_ms(ip: str) -> int:
    """The Lighthouse's heartbeat timeout for a Lighthouse listening on ``ip``:
    :data:`LOOPBACK_HEARTBEAT_MS` on loopback, else :data:`NETWORK_HEARTBEAT_MS`."""
    return LOOPBACK_HEARTBEAT_MS if is_loopback(ip) else NETWORK_HEARTBEAT_MS


def heartbeat_interval_ms(heartbeat_ms: int) -> int:
    """How often each group's Manager heartbeats for a Lighthouse with this timeout: five beats
    per timeout (at least :data:`MIN_HEARTBEAT_INTERVAL_MS`), so a group is dropped only after
    about four beats in a row were late or lost."""
    return max(MIN_HEARTBEAT_INTERVAL_MS, int(heartbeat_ms) // 5)


def read_info(job_dir: str) -> dict:
    """The job's published ``lighthouse.json`` (address, timeouts), or ``{}`` when there is none
    or it is unreadable."""
    try:
        with open(JobPaths(job_dir, join=os.path.join).lighthouse) as f:
            info = json.load(f)
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def lighthouse_binary() -> str:
    """Path of ``torchft_lighthouse`` (installed with torchft). Raises FileNotFoundError."""
    here = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    found = here if os.path.exists(here) else shutil.which("torchft_lighthouse")
    if not found:
        raise FileNotFoundError("torchft_lighthouse not found: pip install 'torchft==0.2.0' "
                                "(hyperpod-lab depends on it)")
    return found


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_address(host: str) -> str:
    """The IP address to listen on for ``host`` (a name is resolved: the interface the cluster
    reaches this node by). Raises OSError when it does not resolve."""
    if ":" in host:
        return host
    return socket.gethostbyname(host)


def _hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def read_address(job_dir: str, timeout_s: float = 60.0) -> str:
    """The Lighthouse address of the job, waiting up to ``timeout_s`` seconds for it.

    Raises:
        TimeoutError: no ``lighthouse.json`` appeared in time (the lighthouse did not start).
    """
    path = JobPaths(job_dir, join=os.path.join).lighthouse
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path) as f:
                return json.load(f)["address"]
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no lighthouse address in {path} after {timeout_s} s: was the job's "
                                   "lighthouse started (python -m hyperpod_lab.node.lighthouse)?") from None
            time.sleep(0.1)


def start(job_dir: str, min_replicas: int, *, host: str | None = None, heartbeat_ms: int | None = None,
          join_timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS, quorum_tick_ms: int = DEFAULT_QUORUM_TICK_MS,
          log=None, port: int | None = None) -> subprocess.Popen:
    """Start the Lighthouse as a child process and publish its address; returns the process.

    Args:
        job_dir: the job's directory on shared storage.
        min_replicas: replica groups a quorum needs (the job's ``elastic.min_nodes``).
        host: address the replica groups reach this host by (default: this host's address,
            ``$HYPERPOD_LAB_LIGHTHOUSE_HOST`` overrides); the Lighthouse listens on it only.
        port: TCP port to listen on (default: a free one); a restart reuses the published one.
        heartbeat_ms: the heartbeat timeout (default: :func:`default_heartbeat_ms` of the address).
        quorum_tick_ms: how often a pending quorum is re-checked.

    Raises:
        FileNotFoundError: torchft is not installed.
        ValueError: ``min_replicas`` < 1, or a timeout out of range.
        RuntimeError: ``torchft_lighthouse`` exited, or did not accept connections within
            :data:`START_TIMEOUT_S` seconds.
    """
    if min_replicas < 1:
        raise ValueError(f"min_replicas must be >= 1, got {min_replicas}")
    if (heartbeat_ms is not None and heartbeat_ms < 1) or quorum_tick_ms < 1 or join_timeout_ms < 0:
        raise ValueError(f"heartbeat_ms and quorum_tick_ms must be >= 1 and join_timeout_ms >= 0, got "
                         f"{heartbeat_ms}, {quorum_tick_ms}, {join_timeout_ms}")
    host = host or os.environ.get(ENV_LIGHTHOUSE_HOST) or socket.gethostbyname(socket.gethostname())
    ip = bind_address(host)
    port = port or _free_port(ip)
    heartbeat_ms = int(heartbeat_ms or default_heartbeat_ms(ip))
    argv = [lighthouse_binary(), "--min_replicas", str(min_replicas), "--bind", _hostport(ip, port),
            "--heartbeat_timeout_ms", str(heartbeat_ms), "--join_timeout_ms", str(join_timeout_ms),
            "--quorum_tick_ms", str(quorum_tick_ms)]
    proc = subprocess.Popen(argv, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while True:  # published only once it accepts connections
        try:
            socket.create_connection((ip, port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"torchft_lighthouse exited with {proc.returncode} before listening on port {port}")
            if time.monotonic() - t0 > START_TIMEOUT_S:
                proc.kill()
                raise RuntimeError(f"torchft_lighthouse did not accept connections on port {port} within "
                                   f"{START_TIMEOUT_S:.0f} s (START_TIMEOUT_S); is this host overloaded?")
            time.sleep(0.05)
    write_json_atomic(JobPaths(job_dir, join=os.path.join).lighthouse, {
        "address": f"http://{host}:{port}", "pid": proc.pid, "node": node_name(), "time": time.time(),
        "min_replicas": min_replicas, "heartbeat_ms": heartbeat_ms,
        "heartbeat_interval_ms": heartbeat_interval_ms(heartbeat_ms), "quorum_tick_ms": quorum_tick_ms,
        "join_timeout_ms": join_timeout_ms})
    return proc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hyperpod_lab.node.lighthouse", description=__doc__.split("\n")[0])
    p.add_argument("--job-dir", required=True)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--host")
    p.add_argument("--heartbeat-ms", type=int, default=None,
                   help=f"heartbeat timeout (default {LOOPBACK_HEARTBEAT_MS} on loopback, else {NETWORK_HEARTBEAT_MS})")
    p.add_argument("--join-timeout-ms", type=int, default=DEFAULT_JOIN_TIMEOUT_MS)
    p.add_argument("--quorum-tick-ms", type=int, default=DEFAULT_QUORUM_TICK_MS)
    p.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS,
                   help="restarts of a crashed torchft_lighthouse, on the same port")
    p.add_argument("--port", type=int, default=None,
                   help="TCP port to listen on (default: a free one); EKS: the port its Service forwards to")
    p.add_argument("--until-finished", action="store_true",
                   help="exit 0 once the job has a 'finished' event (EKS: the Lighthouse pod then completes)")
    a = p.parse_args(argv)
    return supervise(a.job_dir, a.min_replicas, host=a.host, heartbeat_ms=a.heartbeat_ms,
                     join_timeout_ms=a.join_timeout_ms, quorum_tick_ms=a.quorum_tick_ms, max_restarts=a.max_restarts,
                     port=a.port, until_finished=a.until_finished)


def supervise(job_dir: str, min_replicas: int, *, host: str | None = None, heartbeat_ms: int | None = None,
              join_timeout_ms: int = DEFAULT_JOIN_TIMEOUT_MS, quorum_tick_ms: int = DEFAULT_QUORUM_TICK_MS,
              max_restarts: int = DEFAULT_MAX_RESTARTS, port: int | None = None,
              until_finished: bool = False) -> int:
    """Run the job's Lighthouse until SIGTERM; restart it on the same port if it crashes.

    ``port``: listen there (default: a free port). ``until_finished``: also stop (status 0) once
    the job has a ``finished`` event plus :data:`FINISHED_GRACE_S`, for a Lighthouse that runs as
    its own pod (EKS), which must complete for the job to.

    The replica groups keep the published address, so a restarted Lighthouse is found again:
    measured here, a Lighthouse SIGKILLed mid-run and back 3 s later cost one quorum timeout
    (``$HYPERPOD_LAB_FT_QUORUM_TIMEOUT_S``, default 60 s): the groups' workers time out, torchrun
    restarts them, they heal and training goes on; without the restart the job fails. Losing the
    Lighthouse's node is not covered (see docs/checkpointless.md).

    Returns:
        the Lighthouse's exit status: 0 after SIGTERM, else that of its last crash once
        ``max_restarts`` restarts are spent.
    """
    state = {"stopping": False}
    host = host or os.environ.get(ENV_LIGHTHOUSE_HOST) or socket.gethostbyname(socket.gethostname())
    port = port or _free_port(bind_address(host))  # kept for every restart: the published address stays valid
    proc = start(job_dir, min_replicas, host=host, heartbeat_ms=heartbeat_ms, join_timeout_ms=join_timeout_ms,
                 quorum_tick_ms=quorum_tick_ms, log=sys.stdout, port=port)

    def on_term(*_):
        state["stopping"] = True
        proc.terminate()

    signal.signal(signal.SIGTERM, on_term)
    restarts = 0
    finished = _FinishedWatch(job_dir) if until_finished else None
    while True:
        try:
            rc = proc.wait(timeout=1.0 if finished else None)
        except subprocess.TimeoutExpired:
            if finished.seen():
                print("hyperpod-lab: the job finished; stopping its Lighthouse", flush=True)
                on_term()
            continue
        if state["stopping"]:
            return 0
        if restarts >= max_restarts:
            print(f"hyperpod-lab: torchft_lighthouse exited with {rc}; {max_restarts} restarts spent, giving up",
                  flush=True)
            return rc or 1
        restarts += 1
        print(f"hyperpod-lab: torchft_lighthouse exited with {rc}; restarting it on port {port} "
              f"({restarts}/{max_restarts})", flush=True)
        time.sleep(0.5)
        proc = start(job_dir, min_replicas, host=host, heartbeat_ms=heartbeat_ms, join_timeout_ms=join_timeout_ms,
                     quorum_tick_ms=quorum_tick_ms, log=sys.stdout, port=port)
        if state["stopping"]:  # SIGTERM arrived while it was being restarted
            proc.terminate()


FINISHED_GRACE_S = 5.0
"""With ``--until-finished``: how long the Lighthouse stays after the job's ``finished`` event
(the other replica groups' last quorum and exit), seconds."""


class _FinishedWatch:
    """Whether the job in ``job_dir`` has had a ``finished`` event for :data:`FINISHED_GRACE_S`
    (an incremental reader: each look reads only what was appended since)."""

    def __init__(self, job_dir: str):
        from hyperpod_lab.events import EventKind, EventReader

        self._reader, self._kind, self._at = EventReader(job_dir), EventKind.FINISHED.value, None

    def seen(self) -> bool:
        if self._at is None and any(e.kind == self._kind for e in self._reader.poll()):
            self._at = time.monotonic()
        return self._at is not None and time.monotonic() - self._at >= FINISHED_GRACE_S


if __name__ == "__main__":
    sys.exit(main())
