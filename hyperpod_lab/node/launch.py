"""``python -m hyperpod_lab.node.launch``: torchrun, plus fault and recovery events.

Usage is exactly torchrun's (same parser, same behaviour, same exit codes)::

    python -m hyperpod_lab.node.launch --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT --rdzv-id JOB --max-restarts 3 train.py --lr 3e-4

When ``$HYPERPOD_LAB_JOB_DIR`` is set, this node's elastic agent also appends events to
``<job_dir>/events/agent-<node>.jsonl`` (node = ``$SLURMD_NODENAME`` or the host name,
sanitised; if another live agent on the same node already writes that file, ``-2``, ``-3``...
is appended, decided with an ``flock`` on ``<job_dir>/agents/<name>.lock``):

* ``fault.detected`` {rank, local_rank, node, exitcode, signal, reason, pid, root_cause} for each
  local worker that failed (``signal`` is e.g. ``"SIGKILL"`` for a worker killed by a signal,
  else null; ``reason`` is the last line of the worker's recorded exception when it recorded one
  (``hp.init()``'s context manager and torch's ``@record`` do), else a description of the exit;
  ``root_cause`` is false for local siblings the agent itself SIGTERMed because of the failure);
* ``recovery.started`` {restart_count, reason, node} whenever the agent restarts its workers:
  ``reason`` is ``"local worker failed"`` (a restart counted against ``--max-restarts``) or
  ``"peer re-rendezvous"`` (another node re-joined the rendezvous; torchrun does not count it).
* ``fault.detected`` {reason: "hang", ...} and ``straggler.detected`` from its hang watchdog and
  straggler detection over its local workers (:mod:`hyperpod_lab.node.watchdog`,
  :mod:`hyperpod_lab.node.straggler`): it makes a private node-local heartbeat directory
  (``/dev/shm/hyperpod-lab-hb-<uid>/<job>-<pid>``, removed at exit) and passes it to the workers
  as ``$HYPERPOD_LAB_HEARTBEAT_DIR``; every monitor interval it reads their heartbeats; a worker
  without progress for the hang timeout (the spec's ``resiliency.hang_timeout_s``, else derived
  from the job's step times; from its first beat, a start-up budget until then, see
  :mod:`hyperpod_lab.node.watchdog`) gets its stacks dumped, the hang reported and a SIGKILL, after
  which torchrun restarts it at once as any failed worker (its failure report then says ``reason: "killed by
  the hang watchdog ..."``, ``root_cause: false``); a worker whose steps are consistently slower
  than the other ranks' is reported (``resiliency.on_straggler``). Before torchrun stops its
  workers (SIGTERM, then SIGKILL after 30 s), a stopped (SIGSTOP) worker, which cannot act on
  SIGTERM, is reported as hung and SIGKILLed at once (``Watchdog.stop_group``).
* ``job.failed`` when its restarts storm (K restarts without progress, or one fault repeating:
  :mod:`hyperpod_lab.node.storm`): it restarts no more and exits with status 3 (``STORM_EXIT``)
  instead of torchrun's 1; a job whose storm was declared exits 3 at once when started again.

Without ``$HYPERPOD_LAB_JOB_DIR`` it is plain torchrun, with one deliberate difference that holds
in both cases: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` defaults to ``1`` (set it to ``0`` to get
torch's default back). With torch's default (workers bootstrap their process group on the
rendezvous agent's long-lived TCPStore) every worker restart fails in torch 2.13: the restarted
workers read the previous attempt's keys (gloo: ``connectFullMesh failed ... Connection
refused``, then a hang; NCCL: a stale unique id), pytorch/pytorch#135712. Measured here with
plain ``torchrun --standalone --max-restarts 1`` and one failing worker: fails with ``0``,
recovers with ``1``.

Verified invocation (two agents started concurrently on one host, one worker each, gloo; a
worker SIGKILLed after the first checkpoint; both agents restart their workers, which resume
from the newest complete checkpoint; tests/runtime/test_runtime.py runs it without ``--rdzv-conf``)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 HYPERPOD_LAB_JOB_ID=J HYPERPOD_LAB_JOB_DIR=/shared/jobs/J \
    python -m hyperpod_lab.node.launch --nnodes 2 --nproc-per-node 1 \
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --rdzv-id J --max-restarts 3 \
        --monitor-interval 0.1 --rdzv-conf join_timeout=120 \
        --log-dir /shared/jobs/J/logs --tee 3 train.py ...

With a fixed ``--nnodes`` the rendezvous completes as soon as all nodes joined
(``last_call_timeout`` only matters for ``MIN:MAX``); ``join_timeout`` bounds how long a surviving
agent waits for a lost node before it exits non-zero (torch's default is 600 s). When several
agents on one host are given the same loopback endpoint, the first to bind hosts the c10d store
and the others fall back to clients (torch retries with ``is_master=False``); if the hosting
agent dies, the rendezvous is gone and the job must be restarted from outside (Slurm).

If ``$HYPERPOD_LAB_JOB_ID`` is unset, the launcher sets it (to ``--rdzv-id``, or
``adhoc-<time>`` for ``--standalone``) so that the agent's and the workers' events agree.

How it hooks into torch (2.13), and why this hook: the restart logic lives in
``SimpleElasticAgent._invoke_run`` (torch/distributed/elastic/agent/server/api.py): every
``monitor_interval`` it calls ``_monitor_workers``; on FAILED/UNHEALTHY with restarts left, and on
HEALTHY with nodes waiting at the rendezvous, it calls ``_restart_workers`` (stop, re-rendezvous,
start). Overriding those two methods in a ``LocalElasticAgent`` subclass observes exactly the two
transitions we report, without copying any control flow. The subclass must then be the agent
torchrun builds: ``torch.distributed.launcher.api.launch_agent`` constructs
``LocalElasticAgent(...)`` by its module-global name, so we rebind that one name before calling
``torch.distributed.run.run``. The alternatives were worse: re-implementing ``launch_agent``
(~150 lines: rendezvous parameters, health-check server, metrics, torchelastic events, error
propagation) would copy code that changes between torch releases, and wrapping
``_invoke_run`` would re-implement the restart loop. If a future torch stops building the agent
through that name, :func:`install` notices (it checks ``launch_agent``'s code names), warns,
and the launcher degrades to plain torchrun instead of failing the job.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import time
from typing import Any, Callable

import torch.distributed.elastic.rendezvous.api as _rdzv_api
import torch.distributed.launcher.api as _launcher_api
import torch.distributed.run as _torchrun
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

from hyperpod_lab.events import EventKind, EventWriter, agent_writer
from hyperpod_lab.jobdir import (
    ENV_HEARTBEAT_DIR,
    ENV_HOT_SPARE,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_REPLICA_GROUP,
    ENV_REPLICA_GROUP_OFFSET,
    ENV_SPEC,
    SLURM_REPLICA_GROUP,
    JobPaths,
    node_name,
    safe_name,
)
from hyperpod_lab.node import storm
from hyperpod_lab.node.failures import failure_reason, root_cause_key
from hyperpod_lab.node.straggler import StragglerDetector
from hyperpod_lab.node.watchdog import Watchdog, Worker, default_heartbeat_root
from hyperpod_lab.private_dir import ensure_private_dir

log = logging.getLogger(__name__)

_FAILED_STATES = {WorkerState.FAILED, WorkerState.UNHEALTHY}


class AgentEvents:
    """The event side of one node's agent: a claimed writer name and the two emitters.

    Args:
        job_dir: the job's directory on shared storage.
        job_id: job id stamped on events.
        node: this node's name (unsanitised; it is reported as is).
    """

    def __init__(self, job_dir: str, job_id: str, node: str | None = None):
        self.node = node or node_name()
        self.job_dir, self.job_id = job_dir, job_id
        self._lock_fd: int | None = None
        self.writer = EventWriter(job_dir, self._claim_name(agent_writer(safe_name(self.node))), job_id)
        # pid -> why the hang watchdog killed it (None: it did not); set by install_watchdog
        self.killed_reason: Callable[[int | None], str | None] = lambda pid: None

    def _claim_name(self, base: str) -> str:
        """``base``, or ``base-2``, ``base-3``... if a live agent on this file system holds it."""
        paths = JobPaths(self.job_dir)
        os.makedirs(paths.agents, exist_ok=True)
        for i in range(1, 65):
            name = base if i == 1 else f"{base}-{i}"
            fd = os.open(paths.agent_lock(name), os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue
                return f"{base}-{os.getpid()}"  # no flock on this file system: a name no one else has
            self._lock_fd = fd  # held (open) for the agent's lifetime; the kernel releases it on death
            return name
        return f"{base}-{os.getpid()}"

    def worker_failed(self, worker_group: WorkerGroup, result: RunResult) -> None:
        """Emit ``fault.detected`` for each failed local worker in ``result`` (keyed by global rank).

        The root cause comes first and carries ``root_cause: true``: a worker killed by a signal
        other than SIGTERM (OOM killer, ``inject-fault``), else the worker whose recorded error is
        oldest (error-file mtime), else the lowest rank; SIGTERMed workers come last (the agent
        SIGTERMs a failed worker's local siblings, which then show up as failures too). A worker
        the hang watchdog killed is reported with ``reason: "killed by the hang watchdog ..."``
        and no worker of that failure is a root cause: the watchdog's ``fault.detected``
        {reason: "hang"} was.

        The SIGTERMed siblings are not an event each: the first event (the root cause's) names
        them in ``stopped_ranks`` (global ranks, ascending), so a rank failing on a node of 8
        ranks is one event, not 8 (issue 27: 2,048 events when every node's ranks stop). The fold
        (:mod:`hyperpod_lab.fold.aggregate`) and log triage still show each stopped rank, as a
        consequence (``root_cause: false``). A worker that ended otherwise (another signal, an
        exit code, the watchdog) keeps its own event.
        """
        if not result.failures:
            self._emit(EventKind.FAULT_DETECTED, rank=None, local_rank=None, node=self.node, exitcode=None,
                       signal=None, reason=f"worker group {result.state.name.lower()}", pid=None, root_cause=True)
            return
        items = sorted(result.failures.items(), key=lambda kv: root_cause_key(kv[0], kv[1]))
        group = os.environ.get(ENV_REPLICA_GROUP) or self._spare_group()  # checkpointless: per replica group
        extra = {} if not group else {"replica_group": int(group)}
        hung = {f.pid: self.killed_reason(f.pid) for _, f in items}
        reports: list[dict[str, Any]] = []
        stopped: list[int] = []  # the local siblings torchrun SIGTERMed because the first failed
        for i, (global_rank, failure) in enumerate(items):
            sig = failure.signal_name() if failure.exitcode < 0 else None
            if group:
                global_rank = int(group) * worker_group.spec.local_world_size + global_rank
            if i > 0 and sig == "SIGTERM" and not hung[failure.pid]:
                stopped.append(global_rank)
                continue
            reports.append(dict(rank=global_rank, local_rank=failure.local_rank, node=self.node,
                                exitcode=failure.exitcode, signal=sig,
                                reason=hung[failure.pid] or failure_reason(failure, sig), pid=failure.pid,
                                root_cause=i == 0 and not any(hung.values()), **extra))
        if stopped:  # one event for the node's stop, not one a rank (8 a node: issue 27)
            reports[0]["stopped_ranks"] = sorted(stopped)
        for data in reports:
            self._emit(EventKind.FAULT_DETECTED, **data)

    def _spare_group(self) -> str | None:
        """A hot spare's agent (its workers got their group from the supervisor's assignment
        file, ``runtime.context``): that group, or None."""
        if not os.environ.get(ENV_HOT_SPARE):
            return None
        try:
            with open(JobPaths(self.job_dir).spare_assignment(safe_name(self.node))) as f:
                return str(int(json.load(f)["group"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def restarting(self, restart_count: int, reason: str) -> None:
        """Emit ``recovery.started`` {level: "process"}: the node's worker processes restart (the
        ladder's second rung, after in-process: ``hyperpod_lab.runtime.checkpointless.inprocess``)."""
        self._emit(EventKind.RECOVERY_STARTED, restart_count=restart_count, reason=reason, node=self.node,
                   level="process")

    def _emit(self, kind: EventKind, **data: Any) -> None:
        try:
            self.writer.emit(kind, **data)
        except OSError as e:  # the job's storage hiccuped: never take the agent down for an event
            log.warning("hyperpod-lab: could not write %s event: %s", kind.value, e)


_EVENTS: AgentEvents | None = None
_WATCHDOG: Watchdog | None = None  # hangs and stragglers: node/watchdog.py, node/straggler.py
_STORM: storm.StormGuard | None = None  # restart storms: node/storm.py


def _drop_torn_error_files(pcontext) -> bool:
    """Remove the workers' error files (``$TORCHELASTIC_ERROR_FILE``) that are not whole JSON;
    True if one was. torchrun's agent parses each failed worker's file when it reaps it and
    died of a ``JSONDecodeError`` (the job's node lost, not restarted) on one left empty by a
    worker that its SIGTERM stopped while it wrote its exception (seen with 8 ranks a node:
    rank 9 SIGKILLed, the others' collectives failed, each wrote its error as the agent stopped
    them). Without the file the failure is read from the exit code, as for a SIGKILL."""
    dropped = False
    for path in (getattr(pcontext, "error_files", None) or {}).values():
        if not path or path == os.devnull or not os.path.isfile(path):
            continue
        try:
            with open(path) as f:
                json.load(f)
        except ValueError:
            try:
                os.remove(path)
                dropped = True
            except OSError:
                pass
        except OSError:
            pass
    return dropped


class EventingElasticAgent(LocalElasticAgent):
    """torchrun's ``LocalElasticAgent`` that reports worker failures and restarts as events.

    Behaviour is unchanged: both overrides call the base implementation. The events go to the
    module's :class:`AgentEvents` (set by :func:`install`); without it this is a plain agent.
    """

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        if _WATCHDOG is not None and _a_worker_failed(self._pcontext):
            # torchrun's poll below SIGTERMs the other local workers and waits up to 30 s: a
            # stopped one cannot act on SIGTERM, so the watchdog reports and SIGKILLs it first
            _stop_stopped_workers()
        try:
            result = super()._monitor_workers(worker_group)
        except ValueError as e:  # json.JSONDecodeError: a torn error file (below)
            if not _drop_torn_error_files(self._pcontext):
                raise
            log.warning("hyperpod-lab: a worker's error file was torn (%s); it was removed and the failure is "
                        "read from the exit code", e)
            result = super()._monitor_workers(worker_group)
        if _EVENTS is not None and result.state in _FAILED_STATES:
            _EVENTS.worker_failed(worker_group, result)
            if _STORM is not None and _STORM.failure(storm.agent_fault(result, _EVENTS.node)) is not None:
                self._remaining_restarts = 0  # a restart storm: torchrun stops the workers and fails
        if _WATCHDOG is not None and result.state == WorkerState.HEALTHY:
            try:
                killed = _WATCHDOG.check()  # a hung worker is killed (and gone) here
            except Exception as e:  # the watchdog must never take the agent (and the job) down
                log.warning("hyperpod-lab: hang watchdog check failed: %s", e)
                killed = []
            if killed:  # report the death and restart now, not one monitor interval later
                deadline = time.monotonic() + 2.0
                while not _a_worker_failed(self._pcontext) and time.monotonic() < deadline:
                    time.sleep(0.01)  # its threads still exiting: torch's poll cannot reap it yet
                return self._monitor_workers(worker_group)
        return result

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        # every stop of the workers by the agent (a restart, the end, the agent's own signal) comes
        # here (a local worker's failure stops the others in the process context's poll, handled in
        # _monitor_workers): torchrun sends death_sig and waits up to `timeout` s; a stopped worker
        # cannot act on it, so the watchdog reports and SIGKILLs it first (Watchdog.stop_group)
        if _WATCHDOG is not None:
            _stop_stopped_workers()
        super()._shutdown(death_sig, timeout)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        pids = super()._start_workers(worker_group)
        if _WATCHDOG is not None:
            logs = getattr(self._pcontext, "stdouts", None) or {}
            _WATCHDOG.workers_started(
                Worker(local_rank=w.local_rank, global_rank=w.global_rank, pid=int(pids[w.local_rank]),
                       log_file=logs.get(w.local_rank) or None)
                for w in worker_group.workers if w.local_rank in pids)
        return pids

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        if _EVENTS is not None:
            # _invoke_run set worker_group.state to the monitor result before calling us, and it
            # already decremented _remaining_restarts for a failure: this is the count the new
            # workers get as TORCHELASTIC_RESTART_COUNT.
            reason = "local worker failed" if worker_group.state in _FAILED_STATES else "peer re-rendezvous"
            max_restarts = worker_group.spec.max_restarts
            restart_count = max_restarts - getattr(self, "_remaining_restarts", max_restarts)
            _EVENTS.restarting(restart_count, reason)
        super()._restart_workers(worker_group)


def _a_worker_failed(pcontext: Any) -> bool:
    """Whether a local worker of torchrun's process context exited non-zero (its next poll then
    stops the others)."""
    for handler in (getattr(pcontext, "subprocess_handlers", None) or {}).values():
        code = handler.proc.poll()
        if code is not None and code != 0:
            return True
    return False


def _stop_stopped_workers() -> None:
    try:
        _WATCHDOG.stop_group()
    except Exception as e:  # never take the agent down
        log.warning("hyperpod-lab: hang watchdog could not stop a stopped worker: %s", e)


def install(job_dir: str, job_id: str) -> bool:
    """Make torchrun build :class:`EventingElasticAgent` and route its events to ``job_dir``.

    Returns:
        True when installed; False (with a warning on stderr) when this torch's ``launch_agent``
        no longer constructs ``LocalElasticAgent`` by name, in which case torchrun runs unchanged.

    Raises:
        OSError: ``job_dir`` cannot be created or written.
    """
    global _EVENTS, _STORM
    if "LocalElasticAgent" not in _launcher_api.launch_agent.__code__.co_names:
        print("hyperpod-lab: this torch's launch_agent does not build LocalElasticAgent by name; "
              "running plain torchrun without fault/recovery events", file=sys.stderr)
        return False
    _EVENTS = AgentEvents(job_dir, job_id)
    _STORM = storm.StormGuard(job_dir, _EVENTS.writer, storm.storm_restarts_from_env(),
                              steps_are_durable=storm.checkpointless_from_env())
    _launcher_api.LocalElasticAgent = EventingElasticAgent
    install_watchdog(job_dir, _EVENTS)
    return True


def _spec_resiliency(job_dir: str) -> tuple[float | None, str, float | None]:
    """``(hang_timeout_s, on_straggler, startup_timeout_s)`` of the job's spec
    (``$HYPERPOD_LAB_SPEC``, else ``<job_dir>/spec.json``); the defaults ``(None, "report", None)``
    without a readable spec."""
    from hyperpod_lab.errors import SpecError
    from hyperpod_lab.spec import JobSpec

    path = os.environ.get(ENV_SPEC) or JobPaths(job_dir, join=os.path.join).spec
    try:
        with open(path) as f:
            res = JobSpec.from_json(f.read()).resiliency
        return res.hang_timeout_s, res.on_straggler, res.startup_timeout_s
    except (OSError, SpecError):
        return None, "report", None


def install_watchdog(job_dir: str, events: AgentEvents) -> Watchdog | None:
    """Set up this agent's hang watchdog and straggler detection (see the module doc): a private
    heartbeat directory under :func:`~hyperpod_lab.node.watchdog.default_heartbeat_root`
    (removed when the agent exits), ``$HYPERPOD_LAB_HEARTBEAT_DIR`` for the workers, and the
    watchdog the agent's monitor loop runs, configured from the job's spec. Returns it, or None
    (a warning on stderr) when the directory cannot be made: the job then runs without it."""
    global _WATCHDOG
    hang_timeout_s, on_straggler, startup_timeout_s = _spec_resiliency(job_dir)
    top = os.path.join(default_heartbeat_root(), f"hyperpod-lab-hb-{os.getuid()}")
    path = os.path.join(top, f"{safe_name(events.job_id, 80)}-{os.getpid()}")
    try:
        ensure_private_dir(path, top=top)
    except (OSError, ValueError) as e:
        print(f"hyperpod-lab: no hang watchdog: heartbeat directory {path}: {e}", file=sys.stderr)
        return None
    atexit.register(shutil.rmtree, path, True)
    os.environ[ENV_HEARTBEAT_DIR] = path  # the workers inherit the agent's environment

    def emit(kind: str, **data: Any) -> None:
        events._emit(EventKind(kind), **data)

    stragglers = StragglerDetector(job_dir, events.writer.writer, events.node, emit, action=on_straggler)
    _WATCHDOG = Watchdog(path, events.node, emit, hang_timeout_s=hang_timeout_s, startup_timeout_s=startup_timeout_s,
                         stragglers=stragglers)
    events.killed_reason = _WATCHDOG.killed_reason
    return _WATCHDOG


#: workers' MASTER_PORT band: below the Slurm backend's rendezvous ports (29500-32699,
#: schedulers/slurm.py) and below Linux's default ephemeral range (32768-60999)
MASTER_PORT_BAND = (20000, 29499)


def free_master_port(band: tuple[int, int] = MASTER_PORT_BAND) -> int:
    """A TCP port in ``band`` (inclusive) that nothing listens on now, for the workers' process
    group store (``MASTER_PORT``; rank 0 binds it when it starts, seconds later).

    torch's own choice (``torch.distributed.elastic.utils.distributed.get_free_port``, used by
    ``RendezvousStoreInfo.build`` when the rendezvous store is not shared, as here) binds port 0,
    so the kernel hands out a port from the ephemeral range, which any outgoing connection on
    the node may take before rank 0 binds it: rank 0 then fails with EADDRINUSE (seen on a
    loaded 2-core machine, port 33351). A port below that range is only ever taken by a
    deliberate listener, and the probe skips those.

    Raises:
        OSError: no port in ``band`` could be bound (errno EADDRINUSE).
    """
    lo, hi = band
    span = hi - lo + 1
    start = random.SystemRandom().randrange(span)
    for i in range(span):
        port = lo + (start + i) % span
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise OSError(errno.EADDRINUSE, f"no free TCP port in {lo}-{hi} for the workers' MASTER_PORT")


@record
def main(argv: list[str] | None = None) -> None:
    """Parse torchrun's arguments and run it, with events when ``$HYPERPOD_LAB_JOB_DIR`` is set.

    Args:
        argv: torchrun arguments (default ``sys.argv[1:]``).

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: the workers failed
            after the allowed restarts (torchrun's behaviour: exit status 1 and a summary).
    """
    args = _torchrun.parse_args(argv if argv is not None else sys.argv[1:])
    # torch 2.13's default (workers share the rendezvous agent's TCPStore) breaks every worker
    # restart: the store outlives the attempt and the restarted workers' process-group bootstrap
    # reads the previous attempt's keys (gloo: "connectFullMesh failed ... Connection refused";
    # NCCL: stale unique id), see pytorch/pytorch#135712. Restarts are this launcher's purpose.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    _rdzv_api.get_free_port = free_master_port  # MASTER_PORT outside the ephemeral range, see there
    if os.environ.get(ENV_REPLICA_GROUP) == SLURM_REPLICA_GROUP:  # checkpointless: one replica group per node
        os.environ[ENV_REPLICA_GROUP] = str(int(os.environ.get("SLURM_NODEID", "0"))
                                            + int(os.environ.get(ENV_REPLICA_GROUP_OFFSET, "0") or 0))
    job_dir = os.environ.get(ENV_JOB_DIR)
    storm.refuse_if_declared(job_dir)  # a stopped job started again (requeue, auto-resume): exit 3 at once
    if job_dir:
        job_id = os.environ.get(ENV_JOB_ID)
        if not job_id:  # one id for the agent's events and the workers' (they inherit os.environ)
            job_id = args.rdzv_id if (args.rdzv_id and args.rdzv_id != "none" and not args.standalone) \
                else "adhoc-" + time.strftime("%Y%m%d-%H%M%S")
            os.environ[ENV_JOB_ID] = job_id
        install(job_dir, job_id)
    try:
        _torchrun.run(args)
    except ChildFailedError as e:
        if _STORM is None or _STORM.declared is None:
            raise
        print(e.format_msg(), file=sys.stderr)  # torchrun's failure summary, then the storm's status
        print(f"hyperpod-lab: {_STORM.declared.get('reason')}; exit {storm.STORM_EXIT}", file=sys.stderr)
        raise SystemExit(storm.STORM_EXIT) from None


if __name__ == "__main__":
    main()
