"""The core every surface uses (CLI, magics, widgets, later the server): submit a JobSpec,
track job records, stream events, cancel, fetch logs, inject faults.

Backends only render, submit and parse (``hyperpod_lab.schedulers``); the job lifecycle lives
here. Status is refreshed by one batched query per cluster, never one per job.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Callable, Iterator

from hyperpod_lab.errors import ClusterUnreachable, HostKeyError, HyperPodLabError, JobStateError, RemoteCommandError, SpecError
from hyperpod_lab.events import CLIENT_WRITER, Event, EventKind, EventReader, EventWriter
from hyperpod_lab.jobdir import DEFAULT_FAULT_KIND, JobPaths, fault_kind, slow_factor
from hyperpod_lab.schedulers import Scheduler, for_profile
from hyperpod_lab.schedulers.remote import CommandOutcomeUnknown
from hyperpod_lab.spec import RECOVERY_CHECKPOINTLESS, JobSpec, SplitQuorumWarning, secret_values
from hyperpod_lab.submit.clusters import ClusterProfile, get_profile
from hyperpod_lab.submit.jobs import JobRecord, JobStatus, JobStore, new_job_id

SUBMITTING = "submitting"  # the reason of a record whose scheduler id is not known yet


class Client:
    """hyperpod-lab's job lifecycle.

    Args:
        store: where job records live (default: ``JobStore()`` in the user's data directory).
    """

    def __init__(self, store: JobStore | None = None):
        self.store = store or JobStore()
        self._schedulers: dict[str, Scheduler] = {}
        #: compare the cluster interpreter's hyperpod-lab with ours before a submission
        #: (:mod:`hyperpod_lab.submit.envparity`): None = on for Slurm clusters, off elsewhere; True / False
        self.env_check: bool | None = None

    # ---- clusters ----------------------------------------------------------------
    def scheduler(self, cluster: str) -> Scheduler:
        """The backend of a cluster (connection reused). Raises UnknownCluster,
        ClusterUnreachable, HostKeyError."""
        sched = self._schedulers.get(cluster)
        if sched is None or getattr(sched.remote, "alive", True) is False:
            sched = for_profile(get_profile(cluster))
            self._schedulers[cluster] = sched
        return sched

    def _env_check_on(self, profile: ClusterProfile, override: bool | None = None) -> bool:
        on = override if override is not None else self.env_check
        return profile.orchestrator == "slurm" if on is None else bool(on) and profile.orchestrator != "eks"

    def cluster_health(self, cluster: str) -> dict:
        """A cluster's reachability and nodes, as its backend reads them (:meth:`Scheduler.health`;
        Slurm: one ``sinfo -N`` over the remote seam).

        Returns:
            ``{"state": "up" | "unreachable" | "unknown", "error": str | None, "nodes": [{"name",
            "state", "cpus", "partitions"}]}`` ("unknown": a backend that does not read node health,
            EKS). An unreachable login node or refused host key is reported in ``error``, not
            raised. Raises UnknownCluster, ConfigError.
        """
        try:
            return self.scheduler(cluster).health()
        except (ClusterUnreachable, HostKeyError, RemoteCommandError) as e:
            self._schedulers.pop(cluster, None)
            return {"state": "unreachable", "error": str(e), "nodes": []}

    # ---- submit ------------------------------------------------------------------
    def prepare(self, spec: JobSpec) -> tuple[JobSpec, ClusterProfile, bytes]:
        """Validate ``spec`` against its cluster and read the script. Raises SpecError,
        UnknownCluster. Nothing is contacted or written."""
        spec.validate()
        risk = spec.split_quorum_risk()
        if risk:  # a warning, not an error: going on with fewer than half the groups may be wanted
            warnings.warn(risk, SplitQuorumWarning, stacklevel=3)
        profile = get_profile(spec.cluster)
        if spec.container_image and profile.orchestrator != "slurm":  # pyxis/enroot: Slurm only
            raise SpecError("container_image", f"runs a Slurm job's step in a container (pyxis); cluster "
                                               f"'{profile.name}' is {profile.orchestrator}: submit without it"
                                               + (" (the cluster profile's 'image' names the pods' image)"
                                                  if profile.orchestrator == "eks" else ""))
        path = os.path.expanduser(spec.script)
        if not os.path.isfile(path):
            raise SpecError("script", f"{spec.script} does not exist or is not a file; give the path of "
                                      f"your training script (relative to {os.getcwd()})")
        with open(path, "rb") as f:
            return spec, profile, f.read()

    def render(self, spec: JobSpec) -> str:
        """The submission ``submit`` would make (sbatch script / command line); submits nothing."""
        spec, _, _ = self.prepare(spec)
        return self.scheduler(spec.cluster).render(spec, new_job_id(spec.name))

    def submit(self, spec: JobSpec, env_check: bool | None = None) -> JobRecord:
        """Stage the script and spec on the cluster's shared storage, submit, record the job
        and write its ``submitted`` event. On Slurm over SSH that is one command on the login
        node (staging, sbatch and the event: ``SlurmScheduler.submit_with_event``).

        Raises:
            SpecError, UnknownCluster: bad input, e.g. a ``secret_env`` name not set in this
                process's environment (nothing contacted).
            DuplicateJob: the fresh job id is taken (nothing staged).
            ClusterUnreachable, HostKeyError: the login node cannot be reached safely.
            RemoteCommandError: the scheduler refused the job (its staged files are removed).
            CommandOutcomeUnknown: the connection was lost (or the command went silent) after
                the submission went out, and the job was not found at once: sbatch may still have
                queued it, so its record is kept ("submitting") with its directory, and the next
                status refresh finds it (``Scheduler.find_native_id``) if it was queued.
            EnvironmentMismatch: the cluster interpreter's hyperpod-lab is missing, broken or
                incompatible (``env_check``: None = checked on Slurm clusters, one probe exec
                cached per cluster and interpreter, :mod:`hyperpod_lab.submit.envparity`; False skips
                it); nothing staged, no record.
        """
        spec, profile, script = self.prepare(spec)
        secrets = secret_values(spec.secret_env)  # before anything is contacted: a missing one is bad input
        sched = self.scheduler(spec.cluster)
        if self._env_check_on(profile, env_check):
            from hyperpod_lab.submit import envparity
            envparity.check_submission(profile, remote=sched.remote)
        job_id = new_job_id(spec.name)
        # the record first (refusing a taken id before anything is staged), so that a client
        # killed between the scheduler's submit and the record's update leaves a record that
        # :meth:`refresh` completes (Scheduler.find_native_id) instead of a job nobody tracks
        rec = JobRecord(job_id=job_id, name=spec.name, cluster=spec.cluster, orchestrator=profile.orchestrator,
                        native_id="", job_dir=sched.job_dir(job_id), spec=spec.to_dict(), reason=SUBMITTING)
        self.store.add(rec)
        # the 'submitted' event, without native_id: the backend may append it (with the id) in
        # the same round trip as the submission; else it is appended below
        event = Event(kind=EventKind.SUBMITTED.value, job_id=job_id, time=time.time(), writer=CLIENT_WRITER, seq=0,
                      data={"cluster": spec.cluster, "name": spec.name, "nodes": spec.nodes,
                            "procs_per_node": spec.procs_per_node, "world_size": spec.world_size})
        try:
            native_id, written = sched.submit_with_event(spec, job_id, script, secrets, event)
        except BaseException as e:
            if not _may_have_run(e):
                sched.discard(job_id)  # leave nothing half-done: the directory and record are ours alone
                self.store.remove(job_id)
                raise
            # sbatch may have queued the job: deleting its directory would break it. Keep both,
            # look for it once now; otherwise refresh adopts it later (or it stays 'submitting')
            native_id, written = self._find_submitted(sched, rec), False
            if native_id is None:
                raise CommandOutcomeUnknown(
                    f"{e} Job {job_id} was kept (status 'submitting') with its staged directory: sbatch may "
                    f"have queued it, and the next status refresh finds it if so ('hyperpod-lab status "
                    f"{job_id}').") from None
            written = self._has_submitted_event(sched, rec)
        rec.native_id, rec.spec, rec.reason = native_id, spec.to_dict(), None
        self.store.put(rec)
        if not written:
            self._append_event(sched, rec, EventKind.SUBMITTED, **dict(event.data, native_id=native_id))
        return rec

    @staticmethod
    def _find_submitted(sched: Scheduler, rec: JobRecord) -> str | None:
        """The scheduler id of a job whose submission's outcome is unknown, if it is found now."""
        try:
            return sched.find_native_id(rec)
        except (HyperPodLabError, OSError, EOFError):
            return None

    @staticmethod
    def _has_submitted_event(sched: Scheduler, rec: JobRecord) -> bool:
        try:
            return any(e.kind == EventKind.SUBMITTED.value for e in EventReader(rec.job_dir, sched.remote).poll())
        except (HyperPodLabError, OSError, EOFError):
            return False

    def _append_event(self, sched: Scheduler, rec: JobRecord, kind: EventKind, **data) -> Event:
        """One event of the ``client`` writer, through the backend's file access (SFTP or local)."""
        return EventWriter(rec.job_dir, CLIENT_WRITER, rec.job_id, files=sched.remote).emit(kind, **data)

    # ---- records and state -------------------------------------------------------
    def get(self, job_id: str) -> JobRecord:
        return self.store.get(job_id)

    def jobs(self, refresh: bool = True) -> list[JobRecord]:
        recs = self.store.list()
        if refresh:
            self.refresh([r for r in recs if not r.state.is_terminal()])
        return self.store.list()

    def refresh(self, records: list[JobRecord]) -> list[JobRecord]:
        """Update the state of ``records`` with one batched poll per cluster. A job that ended
        without the runtime's ``finished`` event gets one from the client (status, exit code)."""
        by_cluster: dict[str, list[JobRecord]] = {}
        for r in records:
            if not r.state.is_terminal():
                by_cluster.setdefault(r.cluster, []).append(r)
        for cluster, recs in by_cluster.items():
            sched = self.scheduler(cluster)
            recs = [r for r in recs if r.native_id or self._adopt_native_id(sched, r)]
            states = sched.poll(recs) if recs else {}
            for rec in recs:
                st, code, reason = states.get(rec.job_id, (JobStatus.UNKNOWN, None, None))
                if st == JobStatus.UNKNOWN and rec.state != JobStatus.PENDING:
                    continue  # keep the last known state through a scheduler hiccup
                was_terminal = rec.state.is_terminal()
                self.store.update_status(rec, st, code, reason)
                if st.is_terminal() and not was_terminal:
                    self._finish_if_silent(sched, rec, st, code, reason)
        return records

    def _adopt_native_id(self, sched: Scheduler, rec: JobRecord) -> bool:
        """A record left without a scheduler id (its client died mid-submit): look the id up
        through the backend and store it. False while it cannot be found (still submitting)."""
        native_id = sched.find_native_id(rec)
        if not native_id:
            return False
        rec.native_id, rec.reason = native_id, None
        self.store.put(rec)
        return True

    def _finish_if_silent(self, sched, rec, st, code, reason):
        kinds = {e.kind for e in EventReader(rec.job_dir, sched.remote).poll()}
        if EventKind.FINISHED.value not in kinds and sched.remote.create_new(JobPaths(rec.job_dir).client_finished):
            self._append_event(sched, rec, EventKind.FINISHED, status=st.value, exit_code=code, reason=reason)

    def status(self, job_id: str) -> JobRecord:
        rec = self.get(job_id)
        self.refresh([rec])
        return rec

    def wait(self, job_id: str, timeout_s: float = 600.0, interval_s: float = 1.0) -> JobRecord:
        """Block until the job is terminal. Raises TimeoutError after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        delay = min(0.25, interval_s)
        while True:
            rec = self.status(job_id)
            if rec.state.is_terminal():
                return rec
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {rec.status} after {timeout_s} s")
            time.sleep(delay)
            delay = min(delay * 2, interval_s)

    # ---- events, logs, control ---------------------------------------------------
    def event_reader(self, job_id: str, cursor: dict[str, int] | None = None) -> EventReader:
        rec = self.get(job_id)
        return EventReader(rec.job_dir, self.scheduler(rec.cluster).remote, cursor)

    def follow(self, job_id: str, interval_s: float = 0.5, timeout_s: float | None = None,
               on_event: Callable[[Event], None] | None = None) -> Iterator[Event]:
        """Yield the job's events (from the first) until ``finished``; also stops when the job is
        terminal and no more events come (checked every ~5 s)."""
        reader = self.event_reader(job_id)
        last_check = [time.monotonic()]

        def ended() -> bool:
            if time.monotonic() - last_check[0] < 5:
                return False
            last_check[0] = time.monotonic()
            return self.status(job_id).state.is_terminal()

        for ev in reader.follow(interval_s=interval_s, timeout_s=timeout_s, stop=ended):
            if on_event:
                on_event(ev)
            yield ev
        for ev in reader.poll():  # a client-written 'finished' lands after the stop check
            if on_event:
                on_event(ev)
            yield ev

    def logs(self, job_id: str, rank: int | None = None) -> str:
        rec = self.get(job_id)
        return self.scheduler(rec.cluster).logs(rec, rank)

    def cancel(self, job_id: str) -> JobRecord:
        """Stop the job. Raises JobStateError while its submission has not reached the scheduler."""
        rec = self.status(job_id)
        if not rec.native_id:
            raise JobStateError(f"job {job_id} is still being submitted (no scheduler id yet); cancel it again "
                                "in a few seconds")
        if not rec.state.is_terminal():
            self.scheduler(rec.cluster).cancel(rec)
        return rec

    def scale(self, job_id: str, add_nodes: int) -> dict:
        """Add ``add_nodes`` nodes to a running checkpointless job; they join as new data-parallel
        replica groups and heal from a live peer. Raises SpecError (add_nodes < 1, job not
        checkpointless), JobStateError (job not running, or the backend cannot)."""
        if isinstance(add_nodes, bool) or not isinstance(add_nodes, int) or add_nodes < 1:
            raise SpecError("add_nodes", f"must be a whole number >= 1, got {add_nodes!r}")
        rec = self.status(job_id)
        if rec.state != JobStatus.RUNNING:
            raise JobStateError(f"job {job_id} is {rec.status}; nodes can only join a running job")
        if (rec.spec.get("resiliency") or {}).get("recovery") != RECOVERY_CHECKPOINTLESS:
            raise SpecError("resiliency.recovery", f"job {job_id} was not submitted with --recovery checkpointless; "
                                                   "only such a job takes new nodes while it runs")
        secrets = secret_values(list(rec.spec.get("secret_env") or []))  # the joining nodes need them too
        return self.scheduler(rec.cluster).scale(rec, add_nodes, secrets=secrets)

    def inject_fault(self, job_id: str, rank: int, kind: str = DEFAULT_FAULT_KIND, factor: float | None = None) -> dict:
        """Inject a fault into rank ``rank`` of a running job, to rehearse recovery.

        Args:
            job_id: the job.
            rank: the global rank (0-based).
            kind: ``"kill"`` (SIGKILL the rank's process), ``"node"`` (fail the rank's node as
                the scheduler sees it: Slurm sets it DOWN, which needs operator rights; EKS
                deletes the rank's pod; the local backend has none), ``"exception"`` (the rank
                raises ``InjectedFault`` inside its next training step, within ~0.5 s of steps),
                ``"hang"`` (the rank's process is stopped with SIGSTOP, for the launch agent's
                hang watchdog to catch; EKS: the rank stops itself at its next step) or
                ``"slow"`` (the rank's steps take ``factor`` times longer, for straggler
                detection); see :meth:`hyperpod_lab.schedulers.base.Scheduler.inject_fault`.
            factor: ``slow`` only: the slowdown, 1 (normal speed again) to 100, default 2.

        Returns:
            ``{"kind", "rank", ...}``: kill: the rank's info (``node``, ``pid``, ...); node:
            ``node`` and ``how`` (what was done); exception: ``path`` (the request file),
            ``nonce``, ``message`` and, once the rank started, ``node`` and ``pid``; hang: the
            rank's info and ``how``; slow: as exception plus ``factor``.

        Raises:
            SpecError: ``kind`` is not one of kill, node, exception, hang, slow; ``factor`` out of
                range or given with another kind; the rank is outside the job.
            JobStateError: the job or the rank is not running; the backend cannot do ``kind``.
            NotAllowed: the scheduler refused (failing a Slurm node needs an operator).
        """
        kind = fault_kind(kind)
        factor = slow_factor(kind, factor)
        rec = self.status(job_id)
        if rec.state != JobStatus.RUNNING:
            raise JobStateError(f"job {job_id} is {rec.status}; faults can only be injected into a running job")
        return self.scheduler(rec.cluster).inject_fault(rec, rank, kind, factor)


def _may_have_run(e: BaseException) -> bool:
    """Whether a failed submission may still have queued the job: the connection was lost after
    the command went out, or the command went silent past its timeout (it may still run)."""
    return isinstance(e, CommandOutcomeUnknown) or (isinstance(e, RemoteCommandError) and e.exit_status == -1)


def summarize(events: list[Event], wall_s: float | None = None) -> dict:
    """Summary of a job from its events, through the one job facts fold (:mod:`hyperpod_lab.fold.facts`).

    Args:
        events: the job's events (any order).
        wall_s: wall seconds to report instead of first event to last.

    Returns:
        ``{"steps", "first_loss", "last_loss", "checkpoints", "restores", "faults" (failure
        incidents: several agents reporting one loss count once), "fault_events" (raw
        ``fault.detected`` events), "recoveries" (incidents recovered), "recovery_downtime_s"
        (seconds per recovery: first detection to the first completed step after it),
        "status", "final_loss", "wall_s"}`` (seconds, rounded to 0.01; None without events).
    """
    from hyperpod_lab.fold.facts import fold

    f = fold(events)
    out = {"steps": f.steps, "first_loss": f.first_loss, "last_loss": f.last_loss,
           "checkpoints": f.checkpoints, "restores": f.restores, "faults": f.faults,
           "fault_events": f.fault_events, "recoveries": f.recoveries, "recovery_downtime_s": f.downtimes_s,
           "status": f.status, "final_loss": f.final_loss}
    if wall_s is None and f.first_time is not None:
        wall_s = f.wall_s
    out["wall_s"] = round(wall_s, 2) if wall_s is not None else None
    return out

