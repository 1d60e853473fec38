"""The scheduler interface every backend (slurm, local, later eks) implements.

A backend renders its submission from a JobSpec (a pure function), submits it, polls the
state of many jobs in one batched call, cancels, fetches logs and injects faults. Staging
the job directory on shared storage is common to all and lives here.
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hyperpod_lab.errors import HyperPodLabError, JobStateError, SpecError
from hyperpod_lab.events import Event
from hyperpod_lab.jobdir import (  # noqa: F401  (JOBS_SUBDIR: re-exported)
    CHECKPOINT_KEY_BYTES,
    DEFAULT_FAULT_KIND,
    JOBS_SUBDIR,
    FaultKind,
    FaultRequest,
    JobPaths,
    claim_groups,
    fault_kind,
    slow_factor,
    user_jobs_root,
)
from hyperpod_lab.private_dir import job_tree_parts
from hyperpod_lab.schedulers.remote import Remote, StagedFile, Staging
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord, JobStatus

DEFAULT_LOG_TAIL = 256 * 1024  # bytes of a log returned when no range is asked for (the tail)
LOG_PAGE_BYTES = 4 * 1024 * 1024  # bytes per read when a whole log is read (``Scheduler.logs``)

@dataclass
class LogChunk:
    """A byte range of a log.

    Attributes:
        text: the bytes as text (UTF-8, undecodable bytes replaced).
        offset: byte offset of the first byte in the log.
        end: byte offset one past the last byte (``offset + len(bytes)``).
        size: bytes of the whole log when read, or None where the backend cannot know it.
        raw: the bytes themselves where the backend read bytes (None otherwise).
    """

    text: str
    offset: int
    end: int
    size: int | None
    raw: bytes | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "offset": self.offset, "end": self.end, "size": self.size}


def log_span(size: int, offset: int | None, length: int | None) -> tuple[int, int]:
    """``(start, length)`` of a range of a ``size``-byte log: ``offset`` None is the tail of
    ``length`` bytes (default :data:`DEFAULT_LOG_TAIL`); an offset past the end gives 0 bytes."""
    length = DEFAULT_LOG_TAIL if length is None else max(0, int(length))
    if offset is None:
        start = max(0, size - length)
    else:
        start = min(max(0, int(offset)), size)
    return start, max(0, min(length, size - start))


def read_log_range(files, path: str, offset: int | None, length: int | None) -> LogChunk:
    """A range of the file ``path`` through ``files`` (a Remote or FileAccess): its size from the
    directory listing (regular files only), then one bounded read. Raises FileNotFoundError;
    OSError when it is not a regular file."""
    folder, name = posixpath.split(path)
    listing = files.list_files(folder)
    if name not in listing:
        if name in files.listdir(folder):
            raise OSError(f"{path} is not a regular file")
        raise FileNotFoundError(path)
    start, n = log_span(listing[name], offset, length)
    data = files.read_from(path, start, n) if n else b""
    return LogChunk(data.decode(errors="replace"), start, start + len(data), max(listing[name], start + len(data)),
                    raw=data)


class QueueUnsupported(HyperPodLabError):
    """The cluster's backend has no queue view (:meth:`Scheduler.queue_snapshot`): only Slurm
    clusters list every user's jobs and the nodes by state; the server answers it as a labelled,
    empty panel (``"supported": false``)."""


class Scheduler(ABC):
    """One cluster's backend. Construct through :func:`hyperpod_lab.schedulers.for_profile`."""

    def __init__(self, profile: ClusterProfile, remote: Remote):
        self.profile, self.remote = profile, remote

    # ---- common ------------------------------------------------------------------
    def job_dir(self, job_id: str) -> str:
        """The directory of a new job on shared storage, as this backend reaches it:
        ``<shared_root>/hyperpod-lab/<user>/jobs/<job id>`` (``<user>``: the cluster login name,
        ``Remote.user_name``; :meth:`hyperpod_lab.jobdir.JobPaths.for_user_job`). A job keeps the
        directory its record holds (``JobRecord.job_dir``): jobs submitted before this layout
        stay in ``<shared_root>/hyperpod-lab/jobs/<job id>``."""
        return JobPaths.for_user_job(self.profile.shared_root, self.remote.user_name(), job_id).folder

    def job_tree(self, folder: str) -> tuple | None:
        """``Staging.tree`` of a job directory ``folder``: when it lies in the user's job tree
        (:meth:`job_dir`), ``(shared root, ((name, mode), ...))``, which staging makes and checks
        before ``folder`` (no link, root's or the user's, not writable by others unless sticky;
        :func:`hyperpod_lab.envexec.ensure_tree`); else None (EKS and the old shared layout)."""
        root = self.profile.shared_root
        user = self.remote.user_name()
        if root and posixpath.dirname(folder) == user_jobs_root(root, user):
            return (root, job_tree_parts(user))
        return None

    def paths(self, job_id: str) -> JobPaths:
        """The layout of :meth:`job_dir` (see :class:`hyperpod_lab.jobdir.JobPaths`)."""
        return JobPaths(self.job_dir(job_id))

    def staged_script(self, spec: JobSpec, job_id: str) -> str:
        return self.paths(job_id).script(spec.script)

    def staging(self, spec: JobSpec, job_id: str, script_bytes: bytes) -> Staging:
        """What staging the job writes (nothing is written here): the job directory, its
        :data:`JobPaths.SUBDIRS` (0700: private to the user), the script, ``spec.json`` and the
        checkpoint key (0600), and the folders above the directory to check first (:meth:`job_tree`).
        A backend may add files (Slurm: the batch script)."""
        paths = self.paths(job_id)
        rel = lambda path: posixpath.relpath(path, paths.folder)  # noqa: E731
        # the job's own key for authenticating its checkpoints: checkpoint files are only loaded
        # when their HMAC verifies, so write access to storage is not code execution at restore
        return Staging(paths.folder, tuple(JobPaths.SUBDIRS), [
            StagedFile(rel(paths.script(spec.script)), script_bytes, 0o600),
            StagedFile(rel(paths.spec), spec.to_json().encode(), 0o600),
            StagedFile(rel(paths.checkpoint_key), secrets.token_bytes(CHECKPOINT_KEY_BYTES), 0o600)],
            tree=self.job_tree(paths.folder))

    def stage(self, spec: JobSpec, job_id: str, script_bytes: bytes) -> str:
        """Create the job directory (after its tree, :meth:`job_tree`) and write :meth:`staging`'s
        files there (``Remote.stage``: one call per directory and file). Returns the job directory.

        Raises:
            UntrustedDirError: a folder above the job directory is not safe to create it in.
        """
        plan = self.staging(spec, job_id, script_bytes)
        self.remote.stage(plan)
        return plan.folder

    def submit_with_event(self, spec: JobSpec, job_id: str, script_bytes: bytes, secrets: dict[str, str] | None,
                          event: Event) -> tuple[str, bool]:
        """:meth:`submit`, and append ``event`` (the client's ``submitted``, without
        ``native_id``) with ``data.native_id`` set, where the backend can do so in the same round
        trip (Slurm over SSH: the one command that stages and runs sbatch). Returns
        ``(native id, whether the event was appended)``; this default appends nothing."""
        return self.submit(spec, job_id, script_bytes, secrets=secrets), False

    def discard(self, job_id: str) -> None:
        """Remove what :meth:`stage` and :meth:`submit` left of a job whose submission failed
        (its directory is its own: the job id is fresh): on this machine when it mounts the
        shared storage (``Remote.local_path``), else with ``rm -rf`` on the cluster. Best effort:
        errors are swallowed, the submission's own error is the one the user sees."""
        try:
            local = self.remote.local_path(self.job_dir(job_id))
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)
            else:
                self.remote.run(["rm", "-rf", "--", self.job_dir(job_id)], check=False)
        except Exception:
            pass

    #: the form of this backend's native ids (:meth:`native_id`); a backend narrows it (Slurm: a
    #: job id, digits; local: a pid). This default refuses what a command could take for an option
    #: (a leading ``-``), blanks, control characters and anything over 253 characters.
    NATIVE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,252}")
    NATIVE_ID_FORM = "letters, digits and ._/:- (not starting with '-')"

    def native_id(self, value, source: str) -> str:
        """``value`` (a native id read from a job file or a job record) if it has this backend's
        form (:data:`NATIVE_ID`), else JobStateError. Every native id read back is checked
        before it reaches a command line (``scancel``, ``squeue -j``, a signal): a job file
        holding ``--me`` would otherwise make ``scancel`` cancel all of the user's jobs.

        Args:
            value: the id as read (a str; surrounding blanks are stripped).
            source: where it was read, named in the error (a file path, "the job record of X").

        Raises:
            JobStateError: not a str, or not of the form :data:`NATIVE_ID_FORM`.
        """
        text = value.strip() if isinstance(value, str) else None
        if text is None or not self.NATIVE_ID.fullmatch(text):
            raise JobStateError(f"{source} holds {str(value)[:100]!r}, which is not a {self.profile.orchestrator} "
                                f"job id ({self.NATIVE_ID_FORM}); hyperpod-lab never wrote it, so it is not used. "
                                f"Check who changed it; remove it to let hyperpod-lab look the job up again")
        return text

    def find_native_id(self, rec: JobRecord) -> str | None:
        """The scheduler's id of a job whose submitter died before recording it: the id the job
        wrote into ``JobPaths.native_id`` when it started (checked with :meth:`native_id`);
        backends may also ask the scheduler. None when not (yet) known.

        Raises:
            JobStateError: the file holds something that is not a native id of this backend.
        """
        path = JobPaths(rec.job_dir).native_id
        try:
            text = self.remote.read_from(path, 0, 4096).decode(errors="replace").strip()
        except FileNotFoundError:
            return None
        return self.native_id(text, path) if text else None

    def health(self) -> dict:
        """The cluster's nodes as the scheduler sees them.

        Returns:
            ``{"state": "up" | "unknown", "error": str | None, "nodes": [{"name", "state", "cpus",
            "partitions"}]}``; this default (a backend that does not read node health) is
            ``"unknown"`` with no nodes.

        Raises:
            ClusterUnreachable, HostKeyError, RemoteCommandError: the backend could not ask
            (the client reports these as ``"unreachable"``).
        """
        return {"state": "unknown", "error": f"node health is not read from {self.profile.orchestrator} clusters yet",
                "nodes": []}

    def queue_snapshot(self) -> dict:
        """The cluster's queue around the jobs: every user's pending and running jobs, the nodes
        by state and the partitions (the Lab's "Cluster queue" panel, ``docs/queue.md``).

        Returns:
            ``{"jobs": [...], "nodes": [...], "partitions": [...], "user": str | None}``, the
            shapes of :func:`hyperpod_lab.schedulers.slurm.parse_queue` and
            :func:`~hyperpod_lab.schedulers.slurm.parse_nodes`; ``user``: the login user.

        Raises:
            QueueUnsupported: this default: the backend has no queue view (only Slurm has one).
            ClusterUnreachable, HostKeyError, RemoteCommandError: the backend could not ask.
        """
        raise QueueUnsupported(f"the queue view is Slurm-only: cluster '{self.profile.name}' is "
                               f"{self.profile.orchestrator}")

    def rank_info(self, rec: JobRecord, rank: int) -> dict:
        """The ``ranks/rank-R.json`` the runtime wrote. Raises JobStateError if absent."""
        try:
            return json.loads(self.remote.read_from(JobPaths(rec.job_dir).rank_file(rank)))
        except FileNotFoundError:
            world = self._known_ranks(rec)
            raise JobStateError(f"rank {rank} of job {rec.job_id} has not started (known ranks: "
                                f"{world or 'none yet'}); wait for the 'started' event") from None

    def _known_ranks(self, rec: JobRecord) -> list[int]:
        ranks = (JobPaths.rank_of(n) for n in self.remote.listdir(JobPaths(rec.job_dir).ranks))
        return sorted(r for r in ranks if r is not None)

    def rank_log(self, rec: JobRecord, rank: int, offset: int | None = None, length: int | None = None) -> LogChunk:
        """A byte range of rank ``rank``'s log file (the ``log_file`` of its rank info), as
        :meth:`log_range`. Raises HyperPodLabError for a log file outside the job directory or
        behind a symbolic link."""
        info = self.rank_info(rec, rank)
        log_file = info.get("log_file")
        if not log_file:
            raise HyperPodLabError(f"rank {rank} of job {rec.job_id} has no log file recorded")
        if not isinstance(log_file, str) or not posixpath.normpath(log_file).startswith(rec.job_dir.rstrip("/") + "/"):
            raise HyperPodLabError(f"rank {rank} of job {rec.job_id} names a log file outside the job directory "
                                   f"({str(log_file)[:200]!r}); refusing to read it")
        try:
            return read_log_range(self.remote, posixpath.normpath(log_file), offset, length)
        except FileNotFoundError:
            return LogChunk("", 0, 0, 0)
        except OSError as e:  # a symbolic link (never followed) or not a file
            raise HyperPodLabError(f"rank {rank} of job {rec.job_id}: its log file {log_file} is not a regular "
                                   f"file ({e.strerror or e}); refusing to read it") from None

    # ---- per backend -------------------------------------------------------------
    @abstractmethod
    def render(self, spec: JobSpec, job_id: str) -> str:
        """The submission as text (sbatch script, command line); what --dry-run prints."""

    @abstractmethod
    def submit(self, spec: JobSpec, job_id: str, script_bytes: bytes, secrets: dict[str, str] | None = None) -> str:
        """Stage and submit; return the scheduler's native job id. ``secrets`` (``spec.secret_env``'s
        values) reach the job's environment without being written to its files or logs."""

    @abstractmethod
    def poll(self, records: list[JobRecord]) -> dict[str, tuple[JobStatus, int | None, str | None]]:
        """State of many jobs in one batched query: ``{job_id: (status, exit_code, reason)}``."""

    @abstractmethod
    def cancel(self, rec: JobRecord) -> None:
        """Stop the job."""

    def logs(self, rec: JobRecord, rank: int | None = None, offset: int | None = None,
             length: int | None = None) -> str:
        """The job's output (the whole job, or one rank's) as text: the whole log when neither
        ``offset`` nor ``length`` is given (read in pages of :data:`LOG_PAGE_BYTES`, so no single
        read is unbounded), else the range :meth:`log_range` describes."""
        if offset is not None or length is not None:
            return self.log_range(rec, rank, offset, length).text
        parts, pos = [], 0
        while True:
            chunk = self.log_range(rec, rank, pos, LOG_PAGE_BYTES)
            parts.append(chunk.raw if chunk.raw is not None else chunk.text.encode())
            if chunk.end <= pos or chunk.size is None or chunk.end >= chunk.size:
                break
            pos = chunk.end
        return b"".join(parts).decode(errors="replace")

    @abstractmethod
    def log_range(self, rec: JobRecord, rank: int | None = None, offset: int | None = None,
                  length: int | None = None) -> LogChunk:
        """A byte range of the job's output (the whole job's, or one rank's).

        Args:
            rec: the job.
            rank: a rank, or None for the whole job's log.
            offset: first byte (0-based); None: the last ``length`` bytes (the tail).
            length: most bytes to return (default :data:`DEFAULT_LOG_TAIL`).

        Returns:
            A :class:`LogChunk` (text, offset, end, size of the whole log).
        """

    def joins(self, rec: JobRecord) -> list[dict]:
        """The allocations :meth:`scale` added to the job (``<job_dir>/joins.json``), oldest first:
        ``[{"native_id", "offset", "nodes"}]``."""
        try:
            return json.loads(self.remote.read_from(JobPaths(rec.job_dir).joins))
        except FileNotFoundError:
            return []

    def scale(self, rec: JobRecord, add_nodes: int, secrets: dict[str, str] | None = None) -> dict:
        """Add ``add_nodes`` nodes to a running checkpointless job (elastic scale-up): they join as
        replica groups numbered after every earlier group, spares' replacement groups included
        (:func:`~hyperpod_lab.jobdir.claim_groups`). Returns ``{"native_id", "offset",
        "nodes"}``, also recorded in ``<job_dir>/joins.json`` (cancelled with the job).

        Raises:
            JobStateError: the backend cannot add nodes.
            SpecError, RemoteCommandError: from the backend's :meth:`_start_join`.
        """
        spec = JobSpec.from_dict(rec.spec)
        joins = self.joins(rec)
        paths = JobPaths(rec.job_dir)
        self.remote.makedirs(paths.replicas)
        # numbers a spare of the job took meanwhile are skipped (claim_groups)
        offset = claim_groups(self.remote.create_new, paths, spec.nodes + sum(j["nodes"] for j in joins), add_nodes)
        native = self._start_join(rec, spec, offset, add_nodes, len(joins) + 1, secrets or {})
        join = {"native_id": native, "offset": offset, "nodes": add_nodes}
        self.remote.write_bytes(paths.joins, json.dumps(joins + [join]).encode())
        return join

    def _start_join(self, rec: JobRecord, spec: JobSpec, offset: int, add_nodes: int, index: int,
                    secrets: dict[str, str]) -> str:
        """Start the ``index``-th joining allocation (replica groups ``offset`` ...) with the job's
        ``secrets`` in its environment; return its native id. Backends that can add nodes
        override this."""
        raise JobStateError(f"the {type(self).__name__} backend cannot add nodes to a running job")

    def inject_fault(self, rec: JobRecord, rank: int, kind: str = DEFAULT_FAULT_KIND, factor: float | None = None) -> dict:
        """Inject a fault of ``kind`` (:data:`~hyperpod_lab.jobdir.FAULT_KINDS`) into rank ``rank`` of a
        running job, to rehearse recovery.

        * ``kill``: SIGKILL the rank's process (:meth:`_kill_rank`); returns its rank info
          (``node``, ``pid``, ...).
        * ``node``: fail the rank's node as the scheduler sees it (:meth:`_fail_node`); returns
          ``{"node", "how"}`` (``how``: what was done, e.g. the scontrol command).
        * ``exception``: write ``faults/rank-R.json`` (:meth:`_request_exception`); the rank raises
          ``InjectedFault`` at its next step (within ~0.5 s of steps), then the normal crash path
          reports ``fault.detected`` and recovers. Returns ``{"path", "nonce", "message"}`` plus
          the rank's ``node``/``pid`` when it has started.
        * ``hang``: stop the rank's process (:meth:`_stop_rank`: SIGSTOP where the backend can
          signal it, else a request the rank obeys by stopping itself at its next step); nothing
          else happens until the launch agent's hang watchdog declares it hung
          (``fault.detected`` {reason: "hang"}) and kills it. Returns its rank info and ``how``.
        * ``slow``: write a request (:meth:`_request_slow`) after which every step of the rank
          takes ``factor`` times its measured duration (the runtime sleeps ``(factor - 1)`` x the
          step's own compute time; ``factor`` 1 ends it); lasts until the rank's process ends.
          Returns as ``exception`` plus ``factor``.

        Every answer also holds ``kind`` and ``rank``.

        Args:
            factor: ``slow`` only: from 1 to :data:`~hyperpod_lab.jobdir.MAX_SLOW_FACTOR` (default
                :data:`~hyperpod_lab.jobdir.DEFAULT_SLOW_FACTOR`).

        Raises:
            SpecError: ``kind`` is not one of :data:`~hyperpod_lab.jobdir.FAULT_KINDS`; ``factor`` is out of
                range or given with another kind; (exception, slow) ``rank`` is outside the job's world.
            JobStateError: the rank has not started or is not running (kill, node, hang), the
                backend cannot do ``kind`` (e.g. ``node`` on the local backend).
            NotAllowed: (node) the scheduler refused: failing a node needs operator rights.
            RemoteCommandError, ClusterUnreachable: the cluster could not be asked.
        """
        kind = fault_kind(kind)
        factor = slow_factor(kind, factor)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise SpecError("rank", f"must be a rank >= 0, got {rank!r}")
        if kind == FaultKind.EXCEPTION:
            info = self._request_exception(rec, rank)
        elif kind == FaultKind.SLOW:
            info = self._request_slow(rec, rank, factor)
        elif kind == FaultKind.HANG:
            info = self._stop_rank(rec, rank)
        elif kind == FaultKind.NODE:
            info = self._fail_node(rec, rank)
        else:
            info = self._kill_rank(rec, rank)
        return {**info, "kind": kind, "rank": rank}

    @abstractmethod
    def _kill_rank(self, rec: JobRecord, rank: int) -> dict:
        """SIGKILL rank ``rank``'s process; return its rank info. Raises JobStateError when it
        has not started, is not running or is not the job's."""

    def _fail_node(self, rec: JobRecord, rank: int) -> dict:
        """Fail rank ``rank``'s node as the scheduler sees it; return ``{"node", "how"}``.
        Backends with nodes override this; here: JobStateError."""
        raise JobStateError(f"the {type(self).__name__} backend cannot fail a node; use --kind kill or exception")

    def _stop_rank(self, rec: JobRecord, rank: int) -> dict:
        """``inject-fault --kind hang``: here (backends that cannot signal the rank's process) a
        request ``{kind: "hang"}`` the rank obeys at its next step by stopping itself with
        SIGSTOP; backends that can signal it override this with a SIGSTOP from outside. Returns
        as :meth:`_request_exception` plus ``how``.

        Raises:
            SpecError: ``rank`` is outside :meth:`world_size_bound`.
        """
        info = self._write_request(rec, rank, FaultKind.HANG, f"hyperpod-lab inject-fault: rank {rank} of job "
                                                      f"{rec.job_id} stops (SIGSTOP to itself)")
        return {**info, "how": "the rank stops itself (SIGSTOP) at its next step"}

    def world_size_bound(self, rec: JobRecord) -> int:
        """The most ranks the job can have: (nodes, or the elastic maximum when larger, plus the
        nodes :meth:`scale` added) x procs_per_node."""
        spec = rec.spec or {}
        procs = int(spec.get("procs_per_node") or 1)
        nodes = max(int(spec.get("nodes") or 1), int((spec.get("elastic") or {}).get("max_nodes") or 0))
        return (nodes + sum(int(j.get("nodes") or 0) for j in self.joins(rec))) * procs

    def _request_exception(self, rec: JobRecord, rank: int) -> dict:
        """Write the request ``faults/rank-R.json`` ({kind: "exception", message, time (epoch s),
        nonce}; 0600, written atomically) through this backend's file access: rank ``rank``'s
        runtime (``JobContext.step``) finds it within ~0.5 s of its steps, deletes it and raises
        ``InjectedFault(message)``. A rank that has not started yet raises at its first step.

        Raises:
            SpecError: ``rank`` is outside :meth:`world_size_bound`.
        """
        return self._write_request(rec, rank, FaultKind.EXCEPTION,
                                   f"hyperpod-lab inject-fault: exception injected into rank {rank} of job {rec.job_id}")

    def _request_slow(self, rec: JobRecord, rank: int, factor: float) -> dict:
        """Write the request ``{kind: "slow", factor, ...}`` (as :meth:`_request_exception`):
        from its next step on, rank ``rank``'s runtime sleeps ``(factor - 1)`` x each step's own
        measured compute time inside ``JobContext.step``. Returns the request's info plus ``factor``.

        Raises:
            SpecError: ``rank`` is outside :meth:`world_size_bound`.
        """
        info = self._write_request(rec, rank, FaultKind.SLOW, f"hyperpod-lab inject-fault: rank {rank} of job {rec.job_id} "
                                                      f"runs {factor:g}x slower", factor=factor)
        return {**info, "factor": factor}

    def _write_request(self, rec: JobRecord, rank: int, kind: FaultKind, message: str,
                       factor: float | None = None) -> dict:
        """Write the fault request ``faults/rank-R.json`` (a :class:`~hyperpod_lab.jobdir.FaultRequest`:
        {kind, message, time (epoch s), nonce[, factor]}; 0600, written atomically) that rank ``rank``'s runtime reads at its steps (one
        look per 0.5 s at most). Returns ``{"path", "nonce", "message"}`` plus the rank's
        ``node``/``pid`` when it has started.

        Raises:
            SpecError: ``rank`` is outside :meth:`world_size_bound`.
        """
        world = self.world_size_bound(rec)
        if rank >= world:
            raise SpecError("rank", f"job {rec.job_id} has ranks 0..{world - 1}; got {rank}")
        paths = JobPaths(rec.job_dir)
        req = FaultRequest(kind=FaultKind(kind).value, message=message, time=time.time(),
                           nonce=secrets.token_hex(8), factor=factor)
        self.remote.makedirs(paths.faults)
        path = paths.fault_request(rank)
        self.remote.write_bytes(path, req.to_json().encode(), mode=0o600)
        info = {"path": path, "nonce": req.nonce, "message": message}
        try:
            ri = self.rank_info(rec, rank)
            info.update(node=ri.get("node"), pid=ri.get("pid"))
        except (JobStateError, ValueError):  # not started yet (or its file is half written): it acts at its first step
            pass
        return info
