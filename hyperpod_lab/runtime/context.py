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
``HYPERPOD_LAB_HEARTBEAT_DIR``       set by the launch agent: the node-local directory where this
                                     rank beats its heartbeat for the agent's hang watchdog
                                     (:mod:`hyperpod_lab.node.watchdog`); unset: no heartbeat
==================================== ==========================================================

The job's checkpoint key (``<job_dir>/checkpoint.key``, written by the submitter) authenticates
every checkpoint (:mod:`hyperpod_lab.runtime.checkpoint.auth`); without one, rank 0 creates it at
:func:`init`.

Outside torchrun (``python train.py``, a notebook) the job has one member: rank 0 of a world
of 1, with a real single-member process group so code may call collectives unconditionally.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import math
import os
import signal
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

from hyperpod_lab.atomicfile import write_json_atomic
from hyperpod_lab.events import Event, EventKind, EventSchemaError, EventWriter, incident_events, rank_writer
from hyperpod_lab.jobdir import (
    ENV_CHECKPOINT_TIMEOUT,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_HEARTBEAT_DIR,
    ENV_HOT_SPARE,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_REPLICA_GROUP,
    ENV_SPEC,
    ENV_STEP_INTERVAL,
    FaultKind,
    FaultRequest,
    JobPaths,
    job_finished,
    node_name,
    safe_name,
)
from hyperpod_lab.node.watchdog import FAULTHANDLER_SIGNAL, HeartbeatWriter, heartbeat_file
from hyperpod_lab.private_dir import ensure_private_dir
from hyperpod_lab.procs import process_start
from hyperpod_lab.runtime import mlflow_tracking
from hyperpod_lab.runtime.checkpoint.auth import create_key, load_or_create_key, read_key
from hyperpod_lab.runtime.tensorboard import TensorBoardLog, log_dir
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
            :mod:`hyperpod_lab.runtime.checkpointless.ft`), this process's data-parallel replica group; the
            process group, ``rank`` and ``world_size`` then span that replica group only.
            None otherwise.
        global_rank: ``replica_group * local_world_size + rank`` in checkpointless mode, else
            ``rank``; names this process's event file (``rank-<global_rank>``) and rank file.
        is_leader: whether this process writes the job-level events (``step``, ``finished``):
            rank 0, or in checkpointless mode the first rank of the first participating replica
            (updated every step by :class:`~hyperpod_lab.runtime.checkpointless.ft.Checkpointless`).
        heartbeat: this rank's :class:`~hyperpod_lab.node.watchdog.HeartbeatWriter` when the
            launch agent watches it (``$HYPERPOD_LAB_HEARTBEAT_DIR``), else None.
        last_step_timing: ``{step, step_s, compute_s, wait_s, slowed_s}`` of the last :meth:`step`
            (seconds; see :meth:`step`), or None before the first.
        slow_factor: 1.0, or the factor ``inject-fault --kind slow`` set.
        tensorboard: this rank's :class:`~hyperpod_lab.runtime.tensorboard.TensorBoardLog` when
            the spec's ``tensorboard`` has it write (rank 0, or every rank), else None.
        mlflow: global rank 0's :class:`~hyperpod_lab.runtime.mlflow_tracking.MlflowTracking`
            when the spec's ``tracking`` is ``"mlflow"`` (fed every event this rank emits), else None.
    """

    def __init__(self, *, rank: int, world_size: int, local_rank: int, local_world_size: int,
                 group_rank: int, nodes: int, node: str, job_id: str, job_dir: str, spec: JobSpec | None,
                 restart_count: int, is_restart: bool, owns_default_group: bool,
                 cpu_group: "dist.ProcessGroup | None", step_interval_s: float,
                 replica_group: int | None = None, checkpoint_key: bytes | None = None,
                 heartbeat: HeartbeatWriter | None = None):
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
        self.writer = EventWriter(job_dir, rank_writer(self.global_rank), job_id, raise_errors=False)  # never into training
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
        self.fault_check_in_step = True  # False: Checkpointless.recoverable() looks for injected faults instead
        self._fault_check_at = 0.0  # monotonic time of the next look for an injected fault (0: the first step looks)
        # step timing (monotonic s): end of the previous step, waiting measured since, sections
        self.heartbeat = heartbeat
        self._t_prev = time.monotonic()
        self._wait_acc = 0.0
        self._sections: list[tuple[str, bool, float | None]] = []
        self._wait_depth = 0
        self._ddp_ready = 0.0  # watch_ddp: when the newest gradient bucket was ready / reduced
        self._ddp_done = 0.0
        self.slow_factor = 1.0
        self.last_step_timing: dict[str, Any] | None = None
        self.tensorboard: TensorBoardLog | None = None  # set by init() from the spec
        self.mlflow: mlflow_tracking.MlflowTracking | None = None  # set by init() from the spec

    @property
    def checkpoint_key(self) -> bytes:
        """The job's checkpoint key (HMAC-SHA256 key of every checkpoint, see
        :mod:`hyperpod_lab.runtime.checkpoint.auth`): read by :func:`init`; for a context built directly
        (one process, no group) read from ``paths.checkpoint_key`` on first use, created if missing.

        Raises:
            hyperpod_lab.runtime.checkpoint.auth.KeyFileError: the key file is not ours, not 0600, a link,
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
                :class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`, an
                :class:`~hyperpod_lab.runtime.checkpoint.s3.S3Tier`, a
                :class:`~hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer`).
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
            ev = self.writer.emit(kind, **clean)
        if self.tensorboard is not None:
            if ev.kind == EventKind.CHECKPOINT_SAVED.value:  # a marker, and the step metrics so far reach the file
                self.tensorboard.marker(f"checkpoint/{clean.get('tier')}", clean.get("step"), clean.get("step"),
                                        flush=True)
            elif ev.kind == EventKind.RECOVERY_COMPLETED.value:
                self.tensorboard.marker("recovery/downtime_s", clean.get("downtime_s"),
                                        self._steps_done - 1 if self._steps_done else None)
        if self.mlflow is not None:  # queued for its own thread
            self.mlflow.event(ev, self._steps_done - 1 if self._steps_done else None)
        return ev

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
        the first detection of this incident (``hyperpod_lab.fold.facts``: the open incident's
        earliest ``fault.detected``; several agents report one incident) to now, the first
        completed step after the recovery; null when no ``fault.detected`` opened the incident.
        Other ranks only count. No collectives.

        First it calls :meth:`check_injected_fault` (at most one file look per
        :data:`FAULT_CHECK_INTERVAL_S`; not when :attr:`fault_check_in_step` is False: a
        checkpointless loop's ``ft.recoverable()`` block looks instead). Then it times the step: ``step_s`` is the wall time since
        the previous call returned (since :func:`init` for the first), ``wait_s`` the part of it
        spent waiting (sections opened with ``wait=True`` such as :meth:`waiting`, the
        checkpointless quorum and all-reduce, the gradient all-reduce wait :meth:`watch_ddp`
        measures, :meth:`note_wait`), ``compute_s = step_s - wait_s``. With ``inject-fault --kind
        slow --factor F`` in force it first sleeps ``(F - 1) x`` the step's own compute time
        (counted as compute). The timings go to :attr:`last_step_timing` and, under the launch
        agent, to this rank's heartbeat (one store into node-local shared memory; see
        :mod:`hyperpod_lab.node.watchdog`), which is what the hang watchdog and straggler
        detection read.

        Args:
            step: 0-based index of the step just completed.
            loss: its loss (a float or a one-element tensor).
            **metrics: extra JSON-serialisable numbers (e.g. ``lr=3e-4``, ``tokens_per_s=...``).

        Raises:
            InjectedFault: ``hyperpod-lab inject-fault --kind exception`` asked this rank to fail.
        """
        if self.fault_check_in_step:
            self.check_injected_fault()
        self._beat_step(int(step))
        if self.tensorboard is not None:  # every step (SummaryWriter queues it for its own thread)
            self.tensorboard.step(int(step), loss, self.last_step_timing["step_s"], metrics)
        self._steps_done = max(self._steps_done, int(step) + 1)
        now = time.monotonic()
        if self.local_rank == 0 and (self._last_print is None or now - self._last_print >= self.step_interval_s):
            # a heartbeat line per node (pod): what log-based hang detection watches (the HyperPod
            # operator's logMonitoringConfiguration, see schedulers/eks/manifest.py); one write,
            # so it never splits another line of this process's stdout
            sys.stdout.write(f"hyperpod-lab: rank {self.global_rank} step {int(step)} loss {_json_safe(loss)}\n")
            sys.stdout.flush()
            self._last_print = now
        try:
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
        finally:
            self._t_prev = time.monotonic()  # the next step's time starts when this call returns

    def _beat_step(self, step: int) -> None:
        """Time the step just completed (and slow it down when asked to), then beat."""
        now = time.monotonic()
        period = max(0.0, now - self._t_prev)
        wait = self._wait_acc
        if self._ddp_ready > self._t_prev and self._ddp_done > self._ddp_ready:
            wait += self._ddp_done - self._ddp_ready
        self._wait_acc = 0.0
        wait = min(wait, period)
        slowed = 0.0
        if self.slow_factor > 1.0 and period - wait > 0:
            slowed = (self.slow_factor - 1.0) * (period - wait)
            time.sleep(slowed)
            now = time.monotonic()
            period = now - self._t_prev
        compute = period - wait
        self.last_step_timing = {"step": step, "step_s": period, "compute_s": compute, "wait_s": wait,
                                 "slowed_s": slowed}
        if self.heartbeat is not None:
            try:
                self.heartbeat.step(step, period, compute, wait, self.slow_factor, now=now)
            except (ValueError, OSError):  # closed mapping: the heartbeat is gone, training is not
                self.heartbeat = None

    # ---- progress: sections, waiting, DDP ------------------------------------------------
    @contextlib.contextmanager
    def section(self, name: str, *, wait: bool = False, timeout_s: float | None = None):
        """``with ctx.section("forward"):``: name what this rank is doing, for the hang watchdog.

        Entering and leaving a section are progress (a heartbeat); a hang report names the
        section the rank was stuck in (``fault.detected`` ``section``). Sections nest (the
        innermost is reported). Costs one store into the heartbeat (none without an agent).

        Args:
            name: a short name (at most 48 bytes are kept), e.g. ``"forward"``, ``"eval"``.
            wait: the rank waits for others in here (a collective, a barrier): the time counts
                as ``wait_s`` of the step (straggler detection), and the watchdog gives a rank
                waiting here twice the hang timeout (the peer it waits for is the likely hung one).
            timeout_s: this section's own hang timeout (s), instead of the job's T: for work
                longer than T between steps (an evaluation, a long synchronous save).

        Raises:
            ValueError: an empty name, or ``timeout_s`` not > 0.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("a section needs a name, e.g. ctx.section('forward')")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        t0 = time.monotonic()
        self._sections.append((name, bool(wait), timeout_s))
        if wait:
            self._wait_depth += 1
        self._beat_section(t0)
        try:
            yield self
        finally:
            t1 = time.monotonic()
            self._sections.pop()
            if wait:
                self._wait_depth -= 1
                if self._wait_depth == 0:  # nested waits count once
                    self._wait_acc += t1 - t0
            self._beat_section(t1)

    def waiting(self, name: str = "collective", timeout_s: float | None = None):
        """``with ctx.waiting("allreduce"):``: a :meth:`section` with ``wait=True``."""
        return self.section(name, wait=True, timeout_s=timeout_s)

    def note_wait(self, seconds: float) -> None:
        """Add ``seconds`` this rank spent waiting for others (measured by the caller) to the
        current step's ``wait_s``. Negative values count as 0."""
        self._wait_acc += max(0.0, float(seconds))

    def watch_ddp(self, model: Any) -> Any:
        """Measure how long this rank waits for the others in DDP's gradient all-reduce.

        Registers a communication hook on ``model`` (a ``DistributedDataParallel``) that does
        what DDP's default does (divide by the group size, all-reduce each gradient bucket) and
        notes when the newest bucket was ready (this rank's backward done) and when its reduced
        gradients arrived (every rank's done): their difference is the step's ``wait_s``. A slow
        rank is ready last and waits least; the others wait for it. Call it before the first
        backward (DDP allows one hook). Returns ``model``.

        Raises:
            RuntimeError: a hook is already registered (DDP's own error).
        """
        group = getattr(model, "process_group", None) or dist.group.WORLD
        size = dist.get_world_size(group)
        ctx = self

        def hook(_state, bucket):
            ctx._ddp_ready = time.monotonic()
            buf = bucket.buffer()
            buf.div_(size)
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

            def done(f):
                ctx._ddp_done = max(ctx._ddp_done, time.monotonic())
                return f.value()[0]

            return fut.then(done)

        model.register_comm_hook(None, hook)
        return model

    def _beat_section(self, now: float) -> None:
        if self.heartbeat is None:
            return
        name, wait, timeout = self._sections[-1] if self._sections else (None, False, None)
        try:
            self.heartbeat.section(name, wait=wait or self._wait_depth > 0, timeout_s=timeout, now=now)
        except (ValueError, OSError):
            self.heartbeat = None

    def check_injected_fault(self) -> None:
        """Act on ``hyperpod-lab inject-fault`` requests for this rank (``--kind exception``,
        ``slow``, ``hang``).

        Cheap enough for every step: it looks (one ``open`` of ``paths.fault_request(global_rank)``,
        never following a link) only when :data:`FAULT_CHECK_INTERVAL_S` seconds (monotonic) have
        passed since the last look; otherwise it costs one clock read. A request found is deleted
        before it is acted on, so the restarted worker does not act again. :meth:`step` and
        ``Checkpointless.begin_step`` call it; a custom loop may too. By the request's ``kind``:

        * ``exception`` (or none): raise :class:`InjectedFault`;
        * ``slow``: from the next :meth:`step` on, sleep ``(factor - 1) x`` each step's own
          compute time (:attr:`slow_factor`; ``factor`` 1 ends it; capped at
          :data:`~hyperpod_lab.jobdir.MAX_SLOW_FACTOR`); lasts until this process ends;
        * ``hang``: stop this process (SIGSTOP to itself; the backends that cannot signal the
          process, EKS, ask for it this way) until the launch agent's watchdog kills it.

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
        req = FaultRequest.obeyed(raw)  # never refused: a malformed request is an exception
        if req.kind == FaultKind.SLOW:
            self.slow_factor = req.factor
            sys.stdout.write(f"hyperpod-lab: rank {self.global_rank} runs {self.slow_factor:g}x slower "
                             f"(inject-fault --kind slow, nonce {req.nonce})\n")
            sys.stdout.flush()
            return
        if req.kind == FaultKind.HANG:
            sys.stdout.write(f"hyperpod-lab: rank {self.global_rank} stops itself (inject-fault --kind hang, "
                             f"nonce {req.nonce})\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        message = " ".join((req.message or "hyperpod-lab inject-fault").split())[:1000]  # one line
        raise InjectedFault(f"{message} (node {self.node}, nonce {req.nonce})")

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
        then the process groups are destroyed. Idempotent. It runs in the section ``"finish"``,
        whose hang timeout is the checkpoint group's collective timeout plus a minute (the final
        commits may take longer than a step; the barrier gives up by itself after that timeout).

        Args:
            **data: extra fields for the ``finished`` event (e.g. ``final_loss=0.12``).

        Raises:
            RuntimeError: a pending checkpoint failed, or a peer died before the barrier.
        """
        if self._closed:
            return
        try:
            with self.section("finish", timeout_s=env_seconds(ENV_CHECKPOINT_TIMEOUT, DEFAULT_CHECKPOINT_TIMEOUT_S) + 60):
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
        if self.tensorboard is not None:  # flushes the event file
            self.tensorboard.close()
        if self.heartbeat is not None:
            self.heartbeat.close()
            self.heartbeat = None
        if dist.is_available() and dist.is_initialized():
            try:
                if self._owns_default_group:
                    dist.destroy_process_group()
                elif self.cpu_group is not None:
                    dist.destroy_process_group(self.cpu_group)
            except Exception:  # teardown after a peer's death must not mask the real error
                pass
        if self.mlflow is not None:  # sends what is queued (bounded), after the groups: peers do not wait on it
            self.mlflow.close()

    def __enter__(self) -> "JobContext":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.finish()
            return False
        _record_exception(exc)
        if self.mlflow is not None:
            self.mlflow.failed(exc)
        self._teardown()
        return False

    def __repr__(self) -> str:
        return (f"JobContext(job_id={self.job_id!r}, rank={self.rank}, world_size={self.world_size}, "
                f"node={self.node!r}, device={self.device}, restart_count={self.restart_count})")


def _record_exception(exc: BaseException) -> None:
    """Write the exception to ``$TORCHELASTIC_ERROR_FILE`` (what ``@record`` does), if set,
    atomically: torch's ErrorHandler writes into a temporary file beside it, renamed over it
    once whole, so the agent never reads a half-written file (a worker stopped by the agent's
    SIGTERM while writing it left an empty one, and the agent died parsing it)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        os.environ["TORCHELASTIC_ERROR_FILE"] = tmp
        try:
            ErrorHandler().record_exception(exc)
        finally:
            os.environ["TORCHELASTIC_ERROR_FILE"] = path
        os.replace(tmp, path)
    except Exception:
        try:
            os.remove(tmp)
        except OSError:
            pass


def _incident_start_time(job_dir: str) -> float | None:
    """Epoch seconds at which the current incident was first detected, for
    ``recovery.completed.downtime_s``: the detection time of the open incident of the job facts
    fold (``hyperpod_lab.fold.facts``: the earliest ``fault.detected`` since the last incident closed;
    several agents may report the same incident), or None when no fault is open.

    Folds only :func:`hyperpod_lab.events.incident_events` (the writers that are not ranks, and
    the newest 256 KiB of rank 0's file), never every rank's file: this runs in the recovery.
    """
    from hyperpod_lab.fold.facts import fold

    return fold(incident_events(job_dir)).incident_detected_at


def _start_heartbeat(env, global_rank: int, local_rank: int) -> HeartbeatWriter | None:
    """This rank's heartbeat in ``$HYPERPOD_LAB_HEARTBEAT_DIR`` (set by the launch agent, whose
    watchdog reads it), with :mod:`faulthandler` on
    :data:`~hyperpod_lab.node.watchdog.FAULTHANDLER_SIGNAL` writing every thread's stack to
    stdout (the rank's log: the watchdog's fallback when py-spy is missing). None (and a
    warning on stderr when the directory is unusable) without an agent: training never fails
    for its watchdog."""
    directory = env.get(ENV_HEARTBEAT_DIR)
    if not directory:
        return None
    try:
        faulthandler.register(FAULTHANDLER_SIGNAL, file=sys.stdout, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError, OSError):  # no fileno (a notebook's stdout)
        pass
    try:
        return HeartbeatWriter(heartbeat_file(directory, local_rank), global_rank, local_rank)
    except OSError as e:
        print(f"hyperpod-lab: no heartbeat for the hang watchdog ({directory}: {e})", file=sys.stderr)
        return None


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
        hyperpod_lab.private_dir.PrivateDirError: a temporary job directory (or
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


SPARE_POLL_S = 0.02
"""Seconds between a waiting hot spare's looks for its assignment (one ``open`` each)."""


def _await_spare_assignment(env, paths: JobPaths) -> None:
    """A hot spare's process (``$HYPERPOD_LAB_HOT_SPARE`` set; Slurm: the supervisor starts one
    per spare node of a checkpointless job) waits here, with the interpreter up, torch and the
    script's imports loaded and whatever the script does before ``hp.init()`` done, until the
    supervisor assigns its node a replica group (``spares/<node>.json``, every
    :data:`SPARE_POLL_S`); then it joins as that group (``$HYPERPOD_LAB_REPLICA_GROUP``). No
    heartbeat yet, so the hang watchdog does not count the wait. Exits 0 when the job finished,
    3 (``STORM_EXIT``) when a restart storm stopped it, while waiting.
    """
    if not env.get(ENV_HOT_SPARE):
        return
    from hyperpod_lab.node.storm import STORM_EXIT, declared

    node = safe_name(node_name())
    path = paths.spare_assignment(node)
    print(f"hyperpod-lab: hot spare on {node}: waiting for a replica group", flush=True)
    next_look = 0.0
    while True:
        try:
            with open(path) as f:
                group = int(json.load(f)["group"])
            break
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            pass  # not yet (or being written: written atomically, so only a torn read of nothing)
        now = time.monotonic()
        if now >= next_look:
            next_look = now + 1.0
            if job_finished(paths.folder):
                print("hyperpod-lab: hot spare: the job finished", flush=True)
                raise SystemExit(0)
            if declared(paths.folder) is not None:
                raise SystemExit(STORM_EXIT)
        time.sleep(SPARE_POLL_S)
    env[ENV_REPLICA_GROUP] = str(group)
    del env[ENV_HOT_SPARE]
    print(f"hyperpod-lab: hot spare on {node} joins as replica group {group}", flush=True)


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
        hyperpod_lab.private_dir.PrivateDirError: the default (temporary) job directory
            is not a private directory of ours.
        hyperpod_lab.runtime.checkpoint.auth.KeyFileError: the job's checkpoint key file is unusable.
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
    _await_spare_assignment(env, paths)  # a hot spare: started, imported, script run up to here

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
    started_before = global_rank == 0 and _has_event(job_dir, rank_writer(0), EventKind.STARTED.value)
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
                     replica_group=replica_group, checkpoint_key=checkpoint_key,
                     heartbeat=_start_heartbeat(env, global_rank, local_rank))
    tb_dir = log_dir(job_dir, spec.tensorboard, global_rank) if spec is not None else None
    if tb_dir is not None:  # TensorBoardMissing (pip install tensorboard) here, before training starts
        ctx.tensorboard = TensorBoardLog(tb_dir, purge_first=ctx.is_restart)
    ctx.mlflow = mlflow_tracking.start(spec, job_dir, job_id, global_rank, ctx.is_restart)
    if global_rank == 0 and not ctx.is_restart:
        script = spec.script if spec is not None else (sys.argv[0] if sys.argv and sys.argv[0] else "<interactive>")
        ctx.emit(EventKind.STARTED, world_size=world_size, nodes=nodes, script=script, restart_count=restart_count)
    return ctx
