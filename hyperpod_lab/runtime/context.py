"""``hp.init()`` and :class:`JobContext`: who this process is in the job, and its events.

``init()`` reads the environment torchrun gives each worker (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_RESTART_COUNT``,
``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_ERROR_FILE``) and hyperpod-lab's own:

==================================== ==========================================================
``HYPERPOD_LAB_JOB_ID``              job id stamped on events (default: torchrun's run id, or
                                     ``adhoc-<YYYYmmdd-HHMMSS>`` outside torchrun)
``HYPERPOD_LAB_JOB_DIR``             the job directory on shared storage (default: a fresh
                                     temporary directory; under torchrun one per run id)
``HYPERPOD_LAB_SPEC``                path of the job's ``spec.json`` (default:
                                     ``<job_dir>/spec.json`` when it exists, else no spec)
``HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S`` collective timeout of the default process group, seconds
                                     (default 60, not torch's 30 minutes: a dead peer must
                                     surface as an error quickly so the agent can restart)
``HYPERPOD_LAB_CHECKPOINT_TIMEOUT_S`` collective timeout of the checkpoint (CPU/gloo) group,
                                     seconds (default 600: one rank may write longer than others)
``HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` minimum seconds between two ``step`` events (default 1.0)
==================================== ==========================================================

The job's checkpoint key (``<job_dir>/checkpoint.key``, written by the submitter) authenticates
every checkpoint (:mod:`hyperpod_lab.runtime.auth`); without one, rank 0 creates it at
:func:`init`.

Outside torchrun (``python train.py``, a notebook) the job has one member: rank 0 of a world
of 1, with a real single-member process group so code may call collectives unconditionally.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from hyperpod_lab.events import Event, EventKind, EventReader, EventSchemaError, EventWriter
from hyperpod_lab.jobdir import (
    ENV_CHECKPOINT_TIMEOUT,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_REPLICA_GROUP,
    ENV_SPEC,
    ENV_STEP_INTERVAL,
    JobPaths,
)
from hyperpod_lab.procs import process_start
from hyperpod_lab.runtime.auth import create_key, load_or_create_key, read_key
from hyperpod_lab.runtime.private_dir import ensure_private_dir
from hyperpod_lab.spec import JobSpec

if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    class Closable(Protocol):
        """What :meth:`JobContext.register_checkpointer` takes."""

        def wait(self) -> Any: ...

        def close(self) -> Any: ...

DEFAULT_COLLECTIVE_TIMEOUT_S = 60.0
DEFAULT_CHECKPOINT_TIMEOUT_S = 600.0
DEFAULT_STEP_INTERVAL_S = 1.0


def node_name() -> str:
    """This machine's name in the job: ``$SLURMD_NODENAME``, else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def safe_name(text: str, limit: int = 60) -> str:
    """``text`` reduced to the characters an event writer name allows (``[A-Za-z0-9_.-]``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit] or "unknown"


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so readers see the old file or the whole new one.

    Writes ``<path>.tmp-<pid>``, fsyncs it, then ``os.replace``-s it over ``path``.

    Raises:
        OSError: the directory is missing or not writable.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def env_seconds(name: str, default: float) -> float:
    """Seconds from environment variable ``name`` (``default`` when unset or blank).

    Raises:
        ValueError: not a number, or not > 0.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"${name} must be > 0 seconds, got {raw!r}")
    return value


def _json_safe(value: Any) -> Any:
    """Event data must be strict JSON: non-finite floats (NaN loss) become None; 0-d tensors
    become Python numbers."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _has_event(job_dir: str, writer: str, kind: str) -> bool:
    """Whether ``<job_dir>/events/<writer>.jsonl`` holds an event of ``kind``."""
    path = JobPaths(job_dir, join=os.path.join).event_file(writer)
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    if Event.from_json(line).kind == kind:
                        return True
                except EventSchemaError:
                    continue
    except FileNotFoundError:
        return False
    return False


FAULT_CHECK_INTERVAL_S = 0.5
"""Seconds between two looks for this rank's fault request (``JobPaths.fault_request``) by
:meth:`JobContext.check_injected_fault`: one ``open`` attempt at most per interval, none between."""


class InjectedFault(RuntimeError):
    """Raised inside a training step by ``hyperpod-lab inject-fault --kind exception``: the rank
    found its request ``<job_dir>/faults/rank-R.json`` (see :meth:`JobContext.check_injected_fault`).
    It crashes the worker like any exception (``fault.detected`` names it, torchrun restarts)."""


class JobContext:
    """This process's place in the job: rank, device, job directory, spec and event writer.

    Build it with :func:`init`, not directly. Usable as a context manager: leaving the block
    normally calls :meth:`finish`; leaving it with an exception records the exception in
    torchrun's error file (so the agent's ``fault.detected`` carries its message), emits nothing,
    and tears the process groups down without a barrier.

    Attributes:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of ranks in the job (this incarnation).
        local_rank: rank on this node; local_world_size: ranks on this node.
        group_rank: this node's (agent's) rank among the nodes; nodes: number of nodes.
        node: ``$SLURMD_NODENAME`` or the host name.
        device: ``cuda:<local_rank>`` when CUDA is available, else ``cpu``.
        job_id, job_dir: the job's id and directory on shared storage.
        paths: the job directory's layout (:class:`~hyperpod_lab.jobdir.JobPaths` of ``job_dir``).
        spec: the job's :class:`~hyperpod_lab.spec.JobSpec`, or None.
        restart_count: how many times torchrun restarted the workers, the maximum over all ranks
            (an agent restarted only because a peer re-rendezvoused reports a lower count).
        is_restart: True when this is not the job's first start: restart_count > 0, or rank 0's
            event file already holds a ``started`` event (e.g. a Slurm requeue/auto-resume).
        cpu_group: a gloo process group over all ranks, for checkpointing from a background thread
            (never used by the training loop, so its collectives cannot interleave with DDP's).
        replica_group: in checkpointless mode (``$HYPERPOD_LAB_REPLICA_GROUP`` set; see
            :mod:`hyperpod_lab.runtime.ft`), this process's data-parallel replica group; the
            process group, ``rank`` and ``world_size`` then span that replica group only.
            None otherwise.
        global_rank: ``replica_group * local_world_size + rank`` in checkpointless mode, else
            ``rank``; names this process's event file (``rank-<global_rank>``) and rank file.
        is_leader: whether this process writes the job-level events (``step``, ``finished``):
            rank 0, or in checkpointless mode the first rank of the first participating replica
            (updated every step by :class:`~hyperpod_lab.runtime.ft.Checkpointless`).
    """

    def __init__(self, *, rank: int, world_size: int, local_rank: int, local_world_size: int,
                 group_rank: int, nodes: int, node: str, job_id: str, job_dir: str, spec: JobSpec | None,
                 restart_count: int, is_restart: bool, owns_default_group: bool,
                 cpu_group: "dist.ProcessGroup | None", step_interval_s: float,
                 replica_group: int | None = None, checkpoint_key: bytes | None = None):
        self.rank, self.world_size = rank, world_size
        self.replica_group = replica_group
        self.global_rank = rank if replica_group is None else replica_group * local_world_size + rank
        self.is_leader = self.global_rank == 0
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.group_rank, self.nodes, self.node = group_rank, nodes, node
        self.device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        self.job_id, self.job_dir, self.spec = job_id, job_dir, spec
        self.paths = JobPaths(job_dir, join=os.path.join)
        self.restart_count, self.is_restart = restart_count, is_restart
        self.cpu_group = cpu_group
        self.step_interval_s = step_interval_s
        self.writer = EventWriter(job_dir, f"rank-{self.global_rank}", job_id)
        self._emit_lock = threading.Lock()
        self._owns_default_group = owns_default_group
        self._checkpointers: list["Closable"] = []  # see register_checkpointer
        self._restored: dict[str, Any] | None = None  # see note_restored
        self._steps_done = 0
        self._stepped = False
        self._last_emit: tuple[float, int] | None = None  # (monotonic time, step) of last step event
        self._last_print: float | None = None  # monotonic time of the last stdout step line
        self._closed = False
        self._checkpoint_key = checkpoint_key
        self._fault_check_at = 0.0  # monotonic time of the next look for an injected fault (0: the first step looks)

    @property
    def checkpoint_key(self) -> bytes:
        """The job's checkpoint key (HMAC-SHA256 key of every checkpoint, see
        :mod:`hyperpod_lab.runtime.auth`): read by :func:`init`; for a context built directly
        (one process, no group) read from ``paths.checkpoint_key`` on first use, created if missing.

        Raises:
            hyperpod_lab.runtime.auth.KeyFileError: the key file is not ours, not 0600, a link,
                or of the wrong size.
            OSError: it cannot be created.
        """
        if self._checkpoint_key is None:
            self._checkpoint_key = load_or_create_key(self.paths.checkpoint_key)
        return self._checkpoint_key

    # ---- registration by the checkpoint tiers ---------------------------------------------
    def register_checkpointer(self, checkpointer: "Closable", *, before: "Closable | None" = None) -> None:
        """Have :meth:`finish` wait for ``checkpointer`` and the teardown close it.

        :meth:`finish` calls every registered object's ``wait()`` in registration order, then
        (also on an exception) its ``close()``. Registering an object again moves it to the end.

        Args:
            checkpointer: an object with ``wait()`` and ``close()`` (a
                :class:`~hyperpod_lab.runtime.checkpoint.Checkpointer`, an
                :class:`~hyperpod_lab.runtime.s3tier.S3Tier`, a
                :class:`~hyperpod_lab.runtime.tiered.TieredCheckpointer`).
            before: when given and already registered, it is moved behind ``checkpointer``, so
                it is waited for later (e.g. the S3 tier after the checkpointer whose last commit
                may still hand it an upload).
        """
        if checkpointer in self._checkpointers:
            self._checkpointers.remove(checkpointer)
        self._checkpointers.append(checkpointer)
        if before is not None and before in self._checkpointers:
            self._checkpointers.remove(before)
            self._checkpointers.append(before)

    @property
    def checkpointers(self) -> tuple["Closable", ...]:
        """The registered checkpointers, in the order :meth:`finish` waits for them."""
        return tuple(self._checkpointers)

    def note_restored(self, tier: str | None, step: int | None = None) -> None:
        """Record which tier the training state was last restored from, or that none was.

        The first :meth:`step` after a restart reports it in ``recovery.completed``
        (``restored_from``, ``restored_step``).

        Args:
            tier: a tier name from :data:`~hyperpod_lab.jobdir.TIERS` (``"replica"``: a
                checkpointless heal from a live replica group); None: nothing was restored.
            step: the 0-based step the restored state was saved after (None with ``tier=None``).
        """
        self._restored = None if tier is None else {"tier": tier, "step": None if step is None else int(step)}

    @property
    def restored(self) -> dict[str, Any] | None:
        """``{"tier": str, "step": int}`` of the last :meth:`note_restored`, or None (a copy)."""
        return dict(self._restored) if self._restored is not None else None

    # ---- events -------------------------------------------------------------------------
    def emit(self, kind: EventKind | str, **data: Any) -> Event:
        """Append one event to this rank's file ``<job_dir>/events/rank-<R>.jsonl``.

        Thread-safe (the checkpoint thread emits too). Non-finite floats become null.

        Raises:
            ValueError: ``kind`` is not a schema-v1 event kind.
        """
        clean = {k: _json_safe(v) for k, v in data.items()}
        with self._emit_lock:
            return self.writer.emit(kind, **clean)

    def step(self, step: int, loss: float, **metrics: Any) -> None:
        """Report a completed optimizer step (call it on every rank after each step).

        Local rank 0 of each node prints ``hyperpod-lab: rank R step S loss L`` to stdout at most once per
        ``$HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` (the line log-based hang detection watches).
        Rank 0 emits ``step`` {step, loss, steps_per_s, **metrics} at most once per
        ``$HYPERPOD_LAB_STEP_EVENT_INTERVAL_S`` seconds (default 1.0), and always for the first
        step after a (re)start; ``steps_per_s`` is the rate since the previous ``step`` event
        (null on the first). On the first step after a restart rank 0 first emits
        ``recovery.completed`` {restored_step, restart_count, downtime_s, restored_from}:
        ``restored_step`` is the step of the checkpoint ``Checkpointer.restore`` loaded (null if
        none), ``restored_from`` ``"persistent"`` or ``"none"``, ``downtime_s`` the seconds from
        the first detection of this incident (``hyperpod_lab.facts``: the open incident's
        earliest ``fault.detected``; several agents report one incident) to now, the first
        completed step after the recovery; null when no ``fault.detected`` opened the incident.
        Other ranks only count. No collectives.

        First it calls :meth:`check_injected_fault` (at most one file look per
        :data:`FAULT_CHECK_INTERVAL_S`).

        Args:
            step: 0-based index of the step just completed.
            loss: its loss (a float or a one-element tensor).
            **metrics: extra JSON-serialisable numbers (e.g. ``lr=3e-4``, ``tokens_per_s=...``).

        Raises:
            InjectedFault: ``hyperpod-lab inject-fault --kind exception`` asked this rank to fail.
        """
        self.check_injected_fault()
        self._steps_done = max(self._steps_done, int(step) + 1)
        now = time.monotonic()
        if self.local_rank == 0 and (self._last_print is None or now - self._last_print >= self.step_interval_s):
            # a heartbeat line per node (pod): what log-based hang detection watches (the HyperPod
            # operator's logMonitoringConfiguration, see schedulers/k8s_manifest.py); one write,
            # so it never splits another line of this process's stdout
            sys.stdout.write(f"hyperpod-lab: rank {self.global_rank} step {int(step)} loss {_json_safe(loss)}\n")
            sys.stdout.flush()
            self._last_print = now
        if not self.is_leader:
            self._stepped = True
            return
        first = not self._stepped
        self._stepped = True
        if first and self.is_restart and self.replica_group is None:  # checkpointless: ft.py reports
            self._emit_recovery_completed()
        if first or self._last_emit is None or now - self._last_emit[0] >= self.step_interval_s:
            rate = None
            if self._last_emit is not None and now > self._last_emit[0]:
                rate = (int(step) - self._last_emit[1]) / (now - self._last_emit[0])
            self.emit(EventKind.STEP, step=int(step), loss=_json_safe(loss), steps_per_s=rate, **metrics)
            self._last_emit = (now, int(step))

    def check_injected_fault(self) -> None:
        """Raise :class:`InjectedFault` when ``inject-fault --kind exception`` asked this rank to.

        Cheap enough for every step: it looks (one ``open`` of ``paths.fault_request(global_rank)``,
        never following a link) only when :data:`FAULT_CHECK_INTERVAL_S` seconds (monotonic) have
        passed since the last look; otherwise it costs one clock read. A request found is deleted
        before raising, so the restarted worker does not raise again. :meth:`step` and
        ``Checkpointless.begin_step`` call it; a custom loop may too.

        Raises:
            InjectedFault: with the request's ``message``.
        """
        now = time.monotonic()
        if now < self._fault_check_at:
            return
        self._fault_check_at = now + FAULT_CHECK_INTERVAL_S
        path = self.paths.fault_request(self.global_rank)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # none (the usual case), or a link or something else: not a request
            return
        try:
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return
                raw = f.read(64 * 1024)
        except OSError:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            req = json.loads(raw)
        except ValueError:
            req = {}
        if not isinstance(req, dict):
            req = {}
        message = " ".join(str(req.get("message") or "hyperpod-lab inject-fault").split())[:1000]  # one line
        raise InjectedFault(f"{message} (node {self.node}, nonce {req.get('nonce')})")

    def _emit_recovery_completed(self) -> None:
        downtime = None
        t0 = _incident_start_time(self.job_dir)
        if t0 is not None:
            downtime = max(0.0, time.time() - t0)
        restored = self._restored or {}
        self.emit(EventKind.RECOVERY_COMPLETED, restored_step=restored.get("step"),
                  restart_count=self.restart_count, downtime_s=downtime,
                  restored_from=restored.get("tier", "none"))

    # ---- lifecycle ----------------------------------------------------------------------
    def finish(self, **data: Any) -> None:
        """End the job cleanly on this rank (call it on every rank).

        Waits for pending asynchronous checkpoints to commit, then a barrier (so ``finished`` is
        only written once every rank got here), then rank 0 emits ``finished``
        {status: "succeeded", steps, **data} (``steps`` = last step reported to :meth:`step` + 1),
        then the process groups are destroyed. Idempotent.

        Args:
            **data: extra fields for the ``finished`` event (e.g. ``final_loss=0.12``).

        Raises:
            RuntimeError: a pending checkpoint failed, or a peer died before the barrier.
        """
        if self._closed:
            return
        try:
            for ckpt in list(self._checkpointers):
                ckpt.wait()
            if self.cpu_group is not None and self.world_size > 1:
                dist.barrier(group=self.cpu_group)
            if self.is_leader:
                self.emit(EventKind.FINISHED, **{"status": "succeeded", "steps": self._steps_done, **data})
        finally:
            self._teardown()

    def _teardown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ckpt in list(self._checkpointers):
            ckpt.close()
        self._checkpointers.clear()
        if dist.is_available() and dist.is_initialized():
            try:
                if self._owns_default_group:
                    dist.destroy_process_group()
                elif self.cpu_group is not None:
                    dist.destroy_process_group(self.cpu_group)
            except Exception:  # teardown after a peer's death must not mask the real error
                pass

    def __enter__(self) -> "JobContext":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.finish()
            return False
        _record_exception(exc)
        self._teardown()
        return False

    def __repr__(self) -> str:
        return (f"JobContext(job_id={self.job_id!r}, rank={self.rank}, world_size={self.world_size}, "
                f"node={self.node!r}, device={self.device}, restart_count={self.restart_count})")


def _record_exception(exc: BaseException) -> None:
    """Write the exception to ``$TORCHELASTIC_ERROR_FILE`` (what ``@record`` does), if set."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    except Exception:
        pass


def _incident_start_time(job_dir: str) -> float | None:
    """Epoch seconds at which the current incident was first detected, for
    ``recovery.completed.downtime_s``: the detection time of the open incident of the job facts
    fold (``hyperpod_lab.facts``: the earliest ``fault.detected`` since the last incident closed;
    several agents may report the same incident), or None when no fault is open.
    """
    from hyperpod_lab.facts import fold

    return fold(EventReader(job_dir).poll()).incident_detected_at


def _default_job_id(in_torchrun: bool) -> str:
    if os.environ.get(ENV_JOB_ID):
        return os.environ[ENV_JOB_ID]
    if in_torchrun and os.environ.get("TORCHELASTIC_RUN_ID"):
        return os.environ["TORCHELASTIC_RUN_ID"]
    return "adhoc-" + time.strftime("%Y%m%d-%H%M%S")


def _default_job_dir(job_id: str, in_torchrun: bool) -> str:
    """``$HYPERPOD_LAB_JOB_DIR``; else under torchrun ``<tmp>/hyperpod-lab/<job_id>`` (every
    local rank derives the same), else a fresh ``mkdtemp``. The temporary ones are private: made
    0700 with ``os.mkdir`` and verified ours, not a link (a directory another user pre-created
    there is refused).

    Raises:
        hyperpod_lab.runtime.private_dir.PrivateDirError: a temporary job directory (or
            ``<tmp>/hyperpod-lab``) is not a private directory of ours.
    """
    if os.environ.get(ENV_JOB_DIR):
        return os.environ[ENV_JOB_DIR]
    if in_torchrun:  # every local rank must agree on it without talking: derive it from the id
        top = os.path.join(tempfile.gettempdir(), "hyperpod-lab")
        return ensure_private_dir(os.path.join(top, safe_name(job_id, 100)), top=top, env=ENV_JOB_DIR)
    return ensure_private_dir(tempfile.mkdtemp(prefix=f"hyperpod-lab-{safe_name(job_id)}-"), env=ENV_JOB_DIR)


def _load_spec(job_dir: str) -> JobSpec | None:
    path = os.environ.get(ENV_SPEC) or JobPaths(job_dir, join=os.path.join).spec
    if not os.environ.get(ENV_SPEC) and not os.path.exists(path):
        return None
    with open(path) as f:
        return JobSpec.from_json(f.read())


def _replica_group(env) -> int | None:
    """``$HYPERPOD_LAB_REPLICA_GROUP`` as an int in [0, 1024), or None when unset.

    Raises:
        ValueError: set but not such an integer.
    """
    text = env.get(ENV_REPLICA_GROUP)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 1024:
        raise ValueError(f"${ENV_REPLICA_GROUP} must be an integer in [0, 1024), got {text!r}")
    return value


def init() -> JobContext:
    """Join the job: process groups, rank file, event writer and the ``started`` event.

    Call it once per process, on every rank, before building the model. It

    1. reads the torchrun and hyperpod-lab environment (see the module docstring);
    2. initialises the default process group if none exists: backend ``"cpu:gloo,cuda:nccl"``
       when CUDA is available, else ``"gloo"``, collective timeout
       ``$HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S`` (default 60 s); outside torchrun a single-member
       group over an in-memory store; then a gloo ``cpu_group`` for checkpointing;
    3. agrees on ``restart_count`` / ``is_restart`` with one all-reduce;
    4. writes ``<job_dir>/ranks/rank-<R>.json`` atomically: {rank, local_rank, world_size, node,
       host, pid, proc_start (the process's start time, clock ticks since boot, which fault
       injection checks: ``hyperpod_lab.procs``), restart_count, log_file, time}, where ``log_file`` is
       ``dirname($TORCHELASTIC_ERROR_FILE)/stdout.log`` when that variable is set, else null
       (the file exists when the launcher runs with ``--redirects``/``--tee``);
    5. on rank 0, emits ``started`` {world_size, nodes, script, restart_count} on the job's first
       start only.

    Returns:
        The :class:`JobContext` of this process.

    Raises:
        ValueError: a ``HYPERPOD_LAB_*_S`` variable is not a positive number.
        hyperpod_lab.errors.SpecError: the spec file is not a valid JobSpec.
        OSError: the job directory cannot be created or written, or ``$HYPERPOD_LAB_SPEC`` names
            a file that cannot be read.
        hyperpod_lab.runtime.private_dir.PrivateDirError: the default (temporary) job directory
            is not a private directory of ours.
        hyperpod_lab.runtime.auth.KeyFileError: the job's checkpoint key file is unusable.
        torch.distributed.DistStoreError / RuntimeError: the process group could not form
            within the collective timeout (a peer never arrived).
    """
    env = os.environ
    in_torchrun = all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    collective_timeout = env_seconds(ENV_COLLECTIVE_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_S)
    checkpoint_timeout = env_seconds(ENV_CHECKPOINT_TIMEOUT, DEFAULT_CHECKPOINT_TIMEOUT_S)
    step_interval = env_seconds(ENV_STEP_INTERVAL, DEFAULT_STEP_INTERVAL_S)

    job_id = _default_job_id(in_torchrun)
    job_dir = os.path.abspath(_default_job_dir(job_id, in_torchrun))
    paths = JobPaths(job_dir, join=os.path.join)
    os.makedirs(paths.ranks, exist_ok=True)
    spec = _load_spec(job_dir)

    local_rank = int(env.get("LOCAL_RANK", 0)) if in_torchrun else 0
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)

    owns = False
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        timeout = timedelta(seconds=collective_timeout)
        if in_torchrun:
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        owns = True
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", 1)) if in_torchrun else 1
    group_rank = int(env.get("GROUP_RANK", 0)) if in_torchrun else 0
    nodes = int(env.get("GROUP_WORLD_SIZE", 0)) or max(1, world_size // max(1, local_world_size))
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=checkpoint_timeout))

    # the checkpoint key: rank 0 creates it when the submitter did not (O_EXCL); the all-reduce
    # below orders that before every rank reads it
    if rank == 0:
        create_key(paths.checkpoint_key)
    # one all-reduce(MAX): restart count across ranks, and whether rank 0 already started once
    env_restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", 0) or 0) if in_torchrun else 0
    replica_group = _replica_group(env)
    global_rank = rank if replica_group is None else replica_group * local_world_size + rank
    started_before = global_rank == 0 and _has_event(job_dir, "rank-0", EventKind.STARTED.value)
    agreed = torch.tensor([env_restarts, int(started_before)], dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=cpu_group)
    restart_count, started_before = int(agreed[0]), bool(agreed[1])
    checkpoint_key = read_key(paths.checkpoint_key)

    node = node_name()
    err = env.get("TORCHELASTIC_ERROR_FILE")
    write_json_atomic(paths.rank_file(global_rank), {
        "rank": global_rank, "local_rank": local_rank, "world_size": world_size, "node": node,
        "replica_group": replica_group,
        "host": socket.gethostname(), "pid": os.getpid(), "proc_start": process_start(os.getpid()),
        "restart_count": restart_count,
        "log_file": os.path.join(os.path.dirname(err), "stdout.log") if err else None,
        "time": time.time(),
    })

    ctx = JobContext(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
                     group_rank=group_rank, nodes=nodes, node=node, job_id=job_id, job_dir=job_dir, spec=spec,
                     restart_count=restart_count, is_restart=restart_count > 0 or started_before,
                     owns_default_group=owns, cpu_group=cpu_group, step_interval_s=step_interval,
                     replica_group=replica_group, checkpoint_key=checkpoint_key)
    if global_rank == 0 and not ctx.is_restart:
        script = spec.script if spec is not None else (sys.argv[0] if sys.argv and sys.argv[0] else "<interactive>")
        ctx.emit(EventKind.STARTED, world_size=world_size, nodes=nodes, script=script, restart_count=restart_count)
    return ctx
