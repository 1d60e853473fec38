"""Restart storms: a job that keeps restarting without getting anywhere stops retrying.

A job *storms* when its restarts no longer help: a script that raises at start, a node whose
every start dies, a bug that fails the same step after every restore. Left alone, torchrun
restarts it ``max_retries`` times, the supervisor relaunches it on spares, Slurm requeues it and
HyperPod's auto-resume re-runs it, each time for nothing. The policy here (``resiliency.
storm_restarts`` = K, default 3) stops that:

* **no progress**: K restarts in a row each ended in a failure before the job completed a step
  beyond the highest step it had completed before that restart (its *high-water mark*, read
  from the ``step`` events of the ``rank-*`` writers); or
* **the same fault**: the same fault (same rank, same node, same reason: the exception's last
  line, the signal or the exit code, with addresses and long numbers blanked) ended K restarts
  in a row with no *durable* progress in between: no new checkpoint committed
  (``checkpoint.saved`` of any tier at a step beyond the newest one before) and, in a
  checkpointless job (whose state lives in the surviving replicas, not in checkpoints), no step
  beyond the high-water mark either. A fault that comes back only after the job saved new
  progress (a rank killed once an hour) is not a storm: each restart gets further.

Counting (:class:`StormPolicy`): the first failure of a job is not a restart; the K-th restart
that fails without progress (or with the fault of the run before it and no new checkpoint)
trips the storm, so a job whose every start fails runs K + 1 times, K restarts, and stops.

Then (:meth:`StormGuard.failure`, once per job: the first writer to create
``<job_dir>/storm.json`` with ``O_EXCL``):

* ``job.failed`` {reason, restarts, fault, requeue: false, criterion, storm_restarts,
  exit_code} is emitted by the writer that saw it (a node's launch agent, or the Slurm
  supervisor);
* the launch agent stops restarting its workers (``_remaining_restarts = 0``: torchrun stops
  them and returns the failure) and exits with :data:`STORM_EXIT`; every other agent of the job
  stops at its next failure (it finds ``storm.json``);
* the Slurm supervisor relaunches nothing, requeues nothing, sets ``scontrol update
  JobId=$SLURM_JOB_ID Requeue=0`` (scontrol(1): "Requeue=<0|1> Stipulates whether a job should
  be requeued after a node failure: 0 for no, 1 for yes") and exits with :data:`STORM_EXIT`;
* any later start of the job (a requeue by hand or by ``RequeueExit``, HyperPod auto-resume
  re-running the step, a Kubernetes restart of the pod) finds ``storm.json`` and exits at once
  with :data:`STORM_EXIT`, starting no worker. Delete ``<job_dir>/storm.json`` to let the job
  run again (``scontrol requeue`` after a fix).

Exit status :data:`STORM_EXIT` (3) is used for nothing else: not by Python (1: an uncaught
exception, 2: a usage error), torchrun (1), bash (126, 127, 128 + N for a signal) or our
supervisor (1). Below 128 it is a *permanent* failure for the Kubeflow training operator's
``restartPolicy: ExitCode`` (``IsRetryableExitCode``: exit code >= 128 is retryable,
pkg/util/train/train_util.go). Slurm requeues a job by its exit status only when the cluster
lists it in ``RequeueExit``/``RequeueExitHold`` (slurm.conf; empty by default). See
docs/restart-storms.md.

Progress is read with :class:`hyperpod_lab.events.EventReader`: its byte cursor reads only what
the event files gained since the last look, and it looks only when a run failed, so the cost is
bounded by the events written between two failures (rank 0 writes at most one ``step`` event a
second). Standard library only; no torch.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.events import RANK_WRITER_PREFIX, EventKind, EventReader, EventWriter
from hyperpod_lab.jobdir import ENV_SPEC, RECOVERY_CHECKPOINTLESS, JobPaths
from hyperpod_lab.node.failures import failure_reason, root_cause_key

STORM_EXIT = 3
"""Exit status of a job stopped by a restart storm (see the module doc)."""

DEFAULT_STORM_RESTARTS = 3
"""K when the job's spec cannot be read (``resiliency.storm_restarts``' default)."""


_STEP = EventKind.STEP.value
_SAVED = EventKind.CHECKPOINT_SAVED.value
_VARIABLE = re.compile(r"0x[0-9a-fA-F]+|\d{4,}(?:\.\d+)?")  # addresses, pids, ports, timestamps


def normalize_reason(reason: Any) -> str:
    """A fault's reason with what differs between two occurrences of one fault blanked:
    hexadecimal addresses and numbers of four digits or more (pids, ports, times) become ``#``."""
    return _VARIABLE.sub("#", " ".join(str(reason or "").split()))[:300]


@dataclass(frozen=True)
class Fault:
    """What ended a run: ``rank`` (an int, a list of ranks or None), ``node`` and ``reason``
    (the exception's last line, ``worker killed by SIGKILL``, ``node down``...)."""

    rank: Any
    node: str | None
    reason: str

    def key(self) -> str:
        """Two faults are "the same" when their keys are equal: rank, node, normalized reason."""
        return json.dumps([self.rank, self.node, normalize_reason(self.reason)], sort_keys=True, default=str)

    def describe(self) -> str:
        who = []
        if self.rank is not None and self.rank != []:
            who.append(f"rank {self.rank}")
        if self.node:
            who.append(f"on {self.node}")
        return (" ".join(who) + ": " if who else "") + str(self.reason)


class StormPolicy:
    """The counting of :mod:`hyperpod_lab.node.storm` (module doc), no I/O.

    Args:
        k: ``resiliency.storm_restarts`` (at least 1).
        saved: a :meth:`to_dict` result to continue from.
    """

    def __init__(self, k: int, saved: dict | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"storm_restarts must be a whole number >= 1, got {k!r}")
        d = saved or {}
        self.k = k
        self.restarts = int(d.get("restarts", 0))      # restarts granted so far
        self.no_progress = int(d.get("no_progress", 0))  # restarts in a row that failed without progress
        self.same = int(d.get("same", 0))              # restarts in a row that failed with the previous fault
        self.last_key: str | None = d.get("last_key")
        self.last_fault: str | None = d.get("last_fault")

    def to_dict(self) -> dict:
        return {"restarts": self.restarts, "no_progress": self.no_progress, "same": self.same,
                "last_key": self.last_key, "last_fault": self.last_fault}

    def on_failure(self, *, progressed: bool, checkpointed: bool, fault: Fault | None) -> dict | None:
        """A run ended in a failure; decide before restarting it.

        Args:
            progressed: the run completed a step beyond the job's high-water mark at its start.
            checkpointed: the run made durable progress: committed a checkpoint of a step beyond
                the newest before it (or, checkpointless, completed a step beyond the high-water mark).
            fault: what ended it (None: unknown; it never matches another).

        Returns:
            None: restart (``restarts`` counts it). Else the storm: ``{"criterion": "no
            progress" | "same fault", "reason", "restarts", "fault"}``.
        """
        was_restart = self.restarts > 0
        if was_restart:
            self.no_progress = 0 if progressed else self.no_progress + 1
        key = fault.key() if fault is not None else None
        if was_restart and key is not None and key == self.last_key and not checkpointed:
            self.same += 1
        else:
            self.same = 0
        self.last_key = key
        self.last_fault = fault.describe() if fault is not None else None
        if self.no_progress >= self.k:
            return {"criterion": "no progress", "restarts": self.restarts, "fault": self.last_fault,
                    "reason": f"restart storm: {self.no_progress} restarts in a row made no step progress"
                              + (f" (last fault: {self.last_fault})" if self.last_fault else "")}
        if self.same >= self.k:
            return {"criterion": "same fault", "restarts": self.restarts, "fault": self.last_fault,
                    "reason": f"restart storm: the same fault ended {self.same} restarts in a row with no new "
                              f"checkpoint: {self.last_fault}"}
        self.restarts += 1
        return None


class ProgressProbe:
    """The job's high-water marks from its events: the highest completed ``step`` and the
    highest checkpointed step (``checkpoint.saved``) of the ``rank-*`` writers.

    Reads with an :class:`~hyperpod_lab.events.EventReader` cursor (only new bytes each call),
    which starts at the end of every event file that exists when the probe is made: a run is
    compared with what happened since its writer started (the agent: from its first run on; the
    supervisor keeps the marks of earlier runs in its state file), so a long job's history is
    never read again (one listing of the events directory instead).
    """

    def __init__(self, job_dir: str):
        self.reader = EventReader(job_dir)
        try:
            self.reader.cursor = {n: size for n, size in self.reader.files.list_files(self.reader.dir).items()
                                  if n.endswith(".jsonl")}
        except OSError:
            pass  # no events directory yet: read from the beginning once it exists
        self.step: int = -1
        self.checkpoint: int = -1

    def poll(self) -> "ProgressProbe":
        try:
            events = self.reader.poll()
        except OSError:
            return self
        for ev in events:
            if not ev.writer.startswith(RANK_WRITER_PREFIX):
                continue
            s = ev.data.get("step")
            if not isinstance(s, int) or isinstance(s, bool):
                continue
            if ev.kind == _STEP:
                self.step = max(self.step, s)
            elif ev.kind == _SAVED:
                self.checkpoint = max(self.checkpoint, s)
        return self


def marker_path(job_dir: str) -> str:
    """``<job_dir>/storm.json`` (:attr:`JobPaths.storm`): the storm's record, created once (``O_EXCL``);
    its presence stops every later start."""
    return JobPaths(job_dir).storm


def declared(job_dir: str) -> dict | None:
    """The job's storm record (``storm.json``), or None when no storm was declared."""
    try:
        with open(marker_path(job_dir)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"reason": "restart storm (storm.json unreadable)"}
    return data if isinstance(data, dict) else {"reason": "restart storm"}


def declare(job_dir: str, writer: EventWriter, data: dict) -> bool:
    """Record the storm (``storm.json``, ``O_EXCL``) and emit ``job.failed``; False when another
    writer declared it first (then nothing is emitted: one ``job.failed`` per job)."""
    record = {**data, "requeue": False, "exit_code": STORM_EXIT, "writer": writer.writer, "time": time.time()}
    try:
        fd = os.open(marker_path(job_dir), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    try:
        writer.emit(EventKind.JOB_FAILED, reason=data["reason"], restarts=data["restarts"], fault=data.get("fault"),
                    requeue=False, criterion=data.get("criterion"), storm_restarts=data.get("storm_restarts"),
                    exit_code=STORM_EXIT)
    except OSError:
        pass  # storm.json stands: the job still stops
    return True


def _resiliency_from_env() -> dict:
    path = os.environ.get(ENV_SPEC)
    if not path:
        return {}
    try:
        with open(path) as f:
            res = json.load(f).get("resiliency") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return res if isinstance(res, dict) else {}


def storm_restarts_from_env(default: int = DEFAULT_STORM_RESTARTS) -> int:
    """K from the job's spec (``$HYPERPOD_LAB_SPEC``, ``resiliency.storm_restarts``), else ``default``."""
    k = _resiliency_from_env().get("storm_restarts", default)
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else default


def checkpointless_from_env() -> bool:
    """Whether the job's spec says ``resiliency.recovery: checkpointless`` (its steps are durable
    in the surviving replicas)."""
    return _resiliency_from_env().get("recovery") == RECOVERY_CHECKPOINTLESS


class StormGuard:
    """One writer's storm policy over the job's progress: a node's launch agent (in memory) or
    the Slurm supervisor (``state_path``: its counts survive a requeue).

    Args:
        job_dir: the job's directory.
        writer: the writer that emits ``job.failed`` (the agent's or the supervisor's).
        k: ``resiliency.storm_restarts``.
        state_path: where to keep the counts between runs, or None.
        steps_are_durable: a checkpointless job: steps beyond the high-water mark are durable
            progress (kept by the surviving replicas) as much as a new checkpoint is.
    """

    def __init__(self, job_dir: str, writer: EventWriter, k: int, state_path: str | None = None,
                 steps_are_durable: bool = False):
        self.job_dir, self.writer, self.state_path = job_dir, writer, state_path
        self.steps_are_durable = steps_are_durable
        saved = self._load()
        self.policy = StormPolicy(k, saved.get("policy"))
        self.probe = ProgressProbe(job_dir).poll()
        # the high-water marks when the current run started (a requeued supervisor: when it requeued)
        self.step_at_start = int(saved.get("step_at_start", self.probe.step))
        self.checkpoint_at_start = int(saved.get("checkpoint_at_start", self.probe.checkpoint))
        self.declared: dict | None = None

    def _load(self) -> dict:
        if not self.state_path:
            return {}
        try:
            with open(self.state_path) as f:
                d = json.load(f)
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        if not self.state_path:
            return
        try:
            write_json_atomic(self.state_path, {"policy": self.policy.to_dict(), "step_at_start": self.step_at_start,
                                                "checkpoint_at_start": self.checkpoint_at_start}, fsync=False)
        except OSError:
            pass

    def started(self) -> None:
        """A run starts now (the first, or a relaunch): progress is counted from here."""
        self.probe.poll()
        self.step_at_start, self.checkpoint_at_start = self.probe.step, self.probe.checkpoint
        self._save()

    def failure(self, fault: Fault | None) -> dict | None:
        """A run failed: None to restart it, else the storm's record (``job.failed`` emitted
        here unless another writer declared the storm first; then that one's record)."""
        found = declared(self.job_dir)
        if found is not None:
            self.declared = found
            return found
        self.probe.poll()
        progressed = self.probe.step > self.step_at_start
        checkpointed = self.probe.checkpoint > self.checkpoint_at_start or (self.steps_are_durable and progressed)
        verdict = self.policy.on_failure(progressed=progressed, checkpointed=checkpointed, fault=fault)
        if verdict is None:
            self.started()  # the restart follows at once
            return None
        verdict["storm_restarts"] = self.policy.k
        declare(self.job_dir, self.writer, verdict)
        verdict = declared(self.job_dir) or verdict  # the record: ours, or a writer's that was first
        self._save()
        self.declared = verdict
        return verdict


def agent_fault(result: Any, node: str) -> Fault | None:
    """The root cause of a torchrun ``RunResult`` as a :class:`Fault` (the launch agent's choice
    of root cause: a signal other than SIGTERM, else the oldest recorded error, else the lowest
    rank), or None when it names no failure."""
    failures = getattr(result, "failures", None) or {}
    if not failures:
        return Fault(None, node, f"worker group {getattr(getattr(result, 'state', None), 'name', 'failed').lower()}")
    rank, failure = min(failures.items(), key=lambda kv: root_cause_key(kv[0], kv[1]))
    sig = failure.signal_name() if failure.exitcode < 0 else None
    return Fault(rank, node, failure_reason(failure, sig))


def refuse_if_declared(job_dir: str | None) -> None:
    """Exit with :data:`STORM_EXIT` when the job's storm was declared (a later start of a stopped job)."""
    if not job_dir:
        return
    found = declared(job_dir)
    if found is not None:
        print(f"hyperpod-lab: not starting: {found.get('reason', 'restart storm')} "
              f"(exit {STORM_EXIT}; delete {marker_path(job_dir)} to run the job again)", flush=True)
        raise SystemExit(STORM_EXIT)
