"""The job contract: what the submit side and the in-job runtime agree on, defined once.

The schedulers (the submit side: Jupyter server, client, CLI, magics) write a job directory,
environment variables and a launcher command line; the in-job runtime (``hyperpod_lab.runtime``)
reads them back. Both import this module and nothing of each other. It imports only the
standard library and :mod:`hyperpod_lab.events` (the event schema, also torch-free), never
torch or Jupyter.

What it holds:

* every ``HYPERPOD_LAB_*`` environment variable name (``ENV_*``): the job's, and the submit
  side's own (``ENV_CLUSTER``, ``ENV_CONFIG``, ``ENV_DATA_DIR``, the dev cluster's ``ENV_DEV_*``);
* :class:`JobPaths`, the one object that knows a job directory's layout (the pattern of
  submitit's ``JobPaths``): the submitter builds it from the cluster's shared root and the job
  id, the runtime from ``$HYPERPOD_LAB_JOB_DIR``;
* the command lines of the launch agent (``python -m hyperpod_lab.node.launch``, torchrun
  plus events), of the local checkpointless driver and of the Lighthouse supervisor;
* :func:`effective_restarts`, the restart count a spec gives the launch agent;
* the checkpoint tier names and the event kinds (:class:`~hyperpod_lab.events.EventKind`).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import socket
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping

from hyperpod_lab.errors import SpecError
from hyperpod_lab.events import EVENTS_DIRNAME, EventKind, last_events_include

__all__ = [
    "ENV_JOB_ID", "ENV_JOB_DIR", "ENV_SPEC", "ENV_SHARED_ROOT", "ENV_REPLICA_GROUP", "ENV_REPLICA_GROUPS",
    "ENV_REPLICA_GROUP_OFFSET", "ENV_COLLECTIVE_TIMEOUT", "ENV_CHECKPOINT_TIMEOUT", "ENV_STEP_INTERVAL",
    "ENV_PEER_TIMEOUT", "ENV_SHM_DIR", "ENV_FT_TIMEOUT", "ENV_FT_QUORUM_TIMEOUT", "ENV_LIGHTHOUSE_HOST",
    "ENV_S3_ENDPOINT", "ENV_HEARTBEAT_DIR", "ENV_HEALTH_MIN_SHM_BYTES", "ENV_HEALTH_MAX_CLOCK_SKEW_S", "ENV_CLUSTER",
    "ENV_CONFIG", "ENV_DATA_DIR", "ENV_DEV_DIR", "ENV_DEV_SSH_PORT", "ENV_DEV_BASTION_PORT", "ENV_DEV_NODES", "ENV_DEV_CPUS", "JOBS_SUBDIR", "JOB_TREE", "USER_JOBS_DIRNAME", "RESERVED_USER_NAMES",
    "user_jobs_root", "JobPaths", "EventKind", "TIER_MEMORY", "TIER_PEER", "TIER_PERSISTENT",
    "TIER_S3", "TIER_REPLICA", "TIERS", "TIER_RANK", "effective_restarts", "job_env", "launcher_argv", "ft_local_argv",
    "lighthouse_argv", "group_env", "SLURM_REPLICA_GROUP", "CHECKPOINT_KEY_BYTES",
    "FaultKind", "FAULT_KINDS", "DEFAULT_FAULT_KIND", "DEFAULT_SLOW_FACTOR", "MIN_SLOW_FACTOR", "MAX_SLOW_FACTOR",
    "fault_kind", "slow_factor", "FaultRequest", "RECOVERY_RESTART", "RECOVERY_CHECKPOINTLESS", "RECOVERY_MODES",
    "CHECKPOINTS_DIRNAME", "REQUEST_FILE_KINDS",
]

# ---- environment variables (written by the schedulers, read by the runtime) ---------------
#: the prefix of every variable below (a local job inherits the submitting process's ones:
#: schedulers/local.py)
ENV_PREFIX = "HYPERPOD_LAB_"
ENV_JOB_ID = "HYPERPOD_LAB_JOB_ID"
"""hyperpod-lab job id, stamped on every event."""
ENV_JOB_DIR = "HYPERPOD_LAB_JOB_DIR"
"""The job directory on shared storage (see :class:`JobPaths`)."""
ENV_SPEC = "HYPERPOD_LAB_SPEC"
"""Path of the job's ``spec.json`` (on EKS: the ConfigMap's copy)."""
ENV_SHARED_ROOT = "HYPERPOD_LAB_SHARED_ROOT"
"""The cluster's shared file system root (job dirs: ``<root>/hyperpod-lab/<user>/jobs/<job id>``, older ones ``<root>/hyperpod-lab/jobs/<job id>``)."""
ENV_REPLICA_GROUP = "HYPERPOD_LAB_REPLICA_GROUP"
"""Checkpointless: this agent's data-parallel replica group number, or ``slurm`` (derive it
from ``$SLURM_NODEID`` plus :data:`ENV_REPLICA_GROUP_OFFSET`)."""
ENV_HOT_SPARE = "HYPERPOD_LAB_HOT_SPARE"
"""Checkpointless: set (to ``1``) for a hot spare's processes. They start, import and run the
script up to ``hp.init()``, which waits there for the supervisor's assignment
(:meth:`JobPaths.spare_assignment`) and then joins as that replica group."""
ENV_HOT_SPARES = "HYPERPOD_LAB_HOT_SPARES"
"""Checkpointless on Slurm: ``0`` turns hot spares off (a spare then starts cold when it replaces a
group: a new srun, interpreter, imports, model build); anything else, or unset, leaves them on."""
ENV_REPLICA_GROUPS = "HYPERPOD_LAB_REPLICA_GROUPS"
"""Checkpointless: how many replica groups the job starts with."""
ENV_REPLICA_GROUP_OFFSET = "HYPERPOD_LAB_REPLICA_GROUP_OFFSET"
"""Checkpointless on Slurm: number of the first replica group of this allocation (0, or the
groups before a joining allocation)."""
ENV_COLLECTIVE_TIMEOUT = "HYPERPOD_LAB_COLLECTIVE_TIMEOUT_S"
"""Collective timeout of the default process group, seconds."""
ENV_CHECKPOINT_TIMEOUT = "HYPERPOD_LAB_CHECKPOINT_TIMEOUT_S"
"""Collective timeout of the checkpoint (CPU/gloo) group, seconds."""
ENV_STEP_INTERVAL = "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S"
"""Minimum seconds between two ``step`` events of a rank."""
ENV_PEER_TIMEOUT = "HYPERPOD_LAB_PEER_TIMEOUT_S"
"""Timeout of each peer replication/restore transfer phase, seconds."""
ENV_SHM_DIR = "HYPERPOD_LAB_SHM_DIR"
"""Root of the memory tier on a node (default ``/dev/shm/hyperpod-lab``)."""
ENV_FT_TIMEOUT = "HYPERPOD_LAB_FT_TIMEOUT_S"
"""Checkpointless: torchft collective timeout, seconds."""
ENV_FT_QUORUM_TIMEOUT = "HYPERPOD_LAB_FT_QUORUM_TIMEOUT_S"
"""Checkpointless: torchft quorum timeout, seconds."""
ENV_LIGHTHOUSE_HOST = "HYPERPOD_LAB_LIGHTHOUSE_HOST"
"""Checkpointless: the address the Lighthouse binds and publishes."""
ENV_S3_ENDPOINT = "HYPERPOD_LAB_S3_ENDPOINT_URL"
"""S3 tier: endpoint URL (an S3-compatible server), else AWS's default."""
ENV_HEARTBEAT_DIR = "HYPERPOD_LAB_HEARTBEAT_DIR"
"""Set by the launch agent for its workers: the node-local (``/dev/shm``) private directory where
each rank beats its heartbeat (``local-<L>.hb``) for the agent's hang watchdog
(``hyperpod_lab.node.watchdog``); unset: no heartbeat."""
ENV_HEALTH_MIN_SHM_BYTES = "HYPERPOD_LAB_HEALTH_MIN_SHM_BYTES"
"""Pre-flight health check: floor of the measured shared-memory budget, bytes (``hyperpod_lab.node.health``)."""
ENV_HEALTH_MAX_CLOCK_SKEW_S = "HYPERPOD_LAB_HEALTH_MAX_CLOCK_SKEW_S"
"""Pre-flight health check: largest clock skew against the shared storage allowed, seconds."""

# ---- variables of the submit side (the user's shell, the Jupyter server; never the job) -----
ENV_CLUSTER = "HYPERPOD_LAB_CLUSTER"
"""The CLI's default ``--cluster`` (else ``local``)."""
ENV_CONFIG = "HYPERPOD_LAB_CONFIG"
"""Path of the cluster profiles file (else ``$XDG_CONFIG_HOME/hyperpod-lab/clusters.toml``)."""
ENV_DATA_DIR = "HYPERPOD_LAB_DATA_DIR"
"""This user's hyperpod-lab state: job records, local jobs (else ``$XDG_DATA_HOME/hyperpod-lab``)."""
ENV_DEV_DIR = "HYPERPOD_LAB_DEV_DIR"
"""The local dev Slurm cluster's directory (``hyperpod_lab.devcluster``; ``devcluster.sh`` reads it too)."""
ENV_DEV_SSH_PORT = "HYPERPOD_LAB_DEV_SSH_PORT"
"""The dev cluster's login-node sshd port on 127.0.0.1 (default 2222)."""
ENV_DEV_BASTION_PORT = "HYPERPOD_LAB_DEV_BASTION_PORT"
"""The dev cluster's bastion (jump host) port (default 2223)."""
ENV_DEV_NODES = "HYPERPOD_LAB_DEV_NODES"
"""How many compute nodes ``devcluster.sh up`` starts."""
ENV_DEV_CPUS = "HYPERPOD_LAB_DEV_CPUS"
"""How many CPUs each node of ``devcluster.sh up`` declares (default: the host's)."""

CHECKPOINT_KEY_BYTES = 32
"""Size of :attr:`JobPaths.checkpoint_key`, bytes."""

SLURM_REPLICA_GROUP = "slurm"
"""Value of :data:`ENV_REPLICA_GROUP` that means "one group per Slurm node"."""

JOBS_SUBDIR = "hyperpod-lab/jobs"
"""Where job directories lived below a cluster's shared root before the per-user layout (all
users' jobs in one folder); still the layout of EKS jobs and of every job recorded before it:
a job record keeps its ``job_dir``, so those jobs keep working. New Slurm and local jobs go to
:func:`user_jobs_root`."""

JOB_TREE = "hyperpod-lab"
"""The folder below a cluster's shared root that holds each user's job tree."""
USER_JOBS_DIRNAME = "jobs"
"""The folder of a user's job directories in the user's own folder (:func:`user_jobs_root`)."""
RESERVED_USER_NAMES = ("jobs", "envs")
"""Names below :data:`JOB_TREE` that are no user's folder: ``jobs`` (:data:`JOBS_SUBDIR`), ``envs``
(shared environment requirements, ``submit/envparity.py``)."""


def user_jobs_root(shared_root: str, user: str) -> str:
    """``<shared_root>/hyperpod-lab/<user>/jobs``: where ``user``'s job directories live (POSIX
    path). ``hyperpod-lab/`` is shared (root's or the first user's), ``<user>/`` and ``jobs/`` are
    the user's own, 0700; :func:`hyperpod_lab.private_dir.ensure_job_tree` creates and checks them."""
    return posixpath.join(shared_root, JOB_TREE, user, USER_JOBS_DIRNAME)

CHECKPOINTS_DIRNAME = "checkpoints"
"""The persistent tier's folder in a job directory (:attr:`JobPaths.checkpoints`); the Lab's file
browser never changes a path through a folder of this name."""

# ---- recovery modes (``resiliency.recovery``; the supervisor's ``--mode``) ---------------------
RECOVERY_RESTART = "restart"
"""A fault restarts the workers, which restore the newest checkpoint."""
RECOVERY_CHECKPOINTLESS = "checkpointless"
"""Surviving data-parallel replica groups heal a replaced one (torchft)."""
RECOVERY_MODES = (RECOVERY_RESTART, RECOVERY_CHECKPOINTLESS)
"""Every recovery mode, the default first (the goodput model's names: ``goodput.MODEL_MODE``)."""

# ---- checkpoint tiers, fastest first ----------------------------------------------------------
TIER_MEMORY = "memory"          # this node's shared memory
TIER_PEER = "peer"              # a copy in another node's memory
TIER_PERSISTENT = "persistent"  # the shared file system (DCP)
TIER_S3 = "s3"                  # object storage
TIER_REPLICA = "replica"        # checkpointless: healed from a live replica group's memory (torchft)
TIERS = (TIER_REPLICA, TIER_MEMORY, TIER_PEER, TIER_PERSISTENT, TIER_S3)
TIER_RANK = {t: i for i, t in enumerate(TIERS)}
"""Tier name -> 0-based position, fastest first (restore prefers the lowest)."""


# ---- the fault-injection request (``inject-fault``; written by the submit side, read by a rank) ----
class FaultKind(str, Enum):
    """What ``inject-fault --kind`` does (``Scheduler.inject_fault``): ``kill`` SIGKILLs the rank's
    process; ``node`` fails the rank's node the way the scheduler sees it (Slurm: the node set DOWN;
    EKS: the rank's pod deleted); ``exception`` has the rank raise ``InjectedFault`` inside its
    training step (a :class:`FaultRequest` file the runtime reads, :meth:`JobPaths.fault_request`);
    ``hang`` stops the rank's process (SIGSTOP; EKS: the rank stops itself on a request file) for the
    launch agent's hang watchdog to catch; ``slow`` makes the rank's steps take ``factor`` times
    longer (a request file). Mirrored in ``src/api/faults.ts`` (``FAULT_KINDS``)."""

    KILL = "kill"
    NODE = "node"
    EXCEPTION = "exception"
    HANG = "hang"
    SLOW = "slow"


FAULT_KINDS = tuple(k.value for k in FaultKind)
"""``("kill", "node", "exception", "hang", "slow")``, the default first."""
DEFAULT_FAULT_KIND = FaultKind.KILL.value
DEFAULT_SLOW_FACTOR = 2.0
"""The slowdown of ``inject-fault --kind slow`` without ``--factor``."""
MIN_SLOW_FACTOR = 1.0
"""The smallest ``--factor``: normal speed (it ends a slowdown)."""
MAX_SLOW_FACTOR = 100.0
"""The largest ``--factor`` the submit side accepts and a rank obeys (larger ones are capped)."""


def fault_kind(kind: object) -> str:
    """``kind`` when it is one of :data:`FAULT_KINDS`. Raises SpecError (field ``kind``) naming them."""
    if not isinstance(kind, str) or kind not in FAULT_KINDS:
        raise SpecError("kind", f"must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    return kind


def slow_factor(kind: str, factor: object) -> float | None:
    """The slowdown factor of an injection of ``kind``: for ``slow``, ``factor`` (default
    :data:`DEFAULT_SLOW_FACTOR`) as a float from :data:`MIN_SLOW_FACTOR` (back to normal speed)
    to :data:`MAX_SLOW_FACTOR`; for other kinds None.

    Raises:
        SpecError: (field ``factor``) not such a number, or given with a kind other than ``slow``.
    """
    if kind != FaultKind.SLOW:
        if factor is not None:
            raise SpecError("factor", f"is only for --kind slow, not {kind}")
        return None
    if factor is None:
        return DEFAULT_SLOW_FACTOR
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
            or not MIN_SLOW_FACTOR <= factor <= MAX_SLOW_FACTOR):
        raise SpecError("factor", f"must be a number from 1 (normal speed) to {MAX_SLOW_FACTOR:g}, got "
                                  f"{str(factor)[:40]}; e.g. --factor 2 doubles the rank's step time")
    return float(factor)


REQUEST_FILE_KINDS = (FaultKind.EXCEPTION.value, FaultKind.HANG.value, FaultKind.SLOW.value)
"""The kinds a :class:`FaultRequest` file can ask of a rank (``kill`` and ``node`` act from outside)."""


@dataclass(frozen=True)
class FaultRequest:
    """``faults/rank-R.json`` (:meth:`JobPaths.fault_request`): what the submit side asks a rank to do
    at its next step (``inject-fault --kind exception | hang | slow``); written atomically, 0600.

    Attributes:
        kind: one of :data:`REQUEST_FILE_KINDS`.
        message: the ``InjectedFault`` message (``exception``), or what the request does.
        time: when it was written, epoch seconds.
        nonce: a random token naming this request (echoed in the rank's output).
        factor: ``slow`` only: the slowdown (:data:`MIN_SLOW_FACTOR` .. :data:`MAX_SLOW_FACTOR`).
    """

    kind: str
    message: str
    time: float
    nonce: str | None
    factor: float | None = None

    @classmethod
    def from_json(cls, text: str | bytes) -> "FaultRequest":
        """The request in ``text``, validated.

        Raises:
            SpecError: (field ``fault_request``, or the offending field's) not a JSON object, an
                unknown kind, a ``factor`` out of range or with a kind other than ``slow``.
        """
        try:
            d = json.loads(text)
        except ValueError as e:
            raise SpecError("fault_request", f"is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise SpecError("fault_request", f"must be a JSON object, got {type(d).__name__}")
        req = cls(kind=d.get("kind"), message=d.get("message"), time=d.get("time"), nonce=d.get("nonce"),
                  factor=d.get("factor"))
        req._check()
        return req

    def to_json(self) -> str:
        """The file's text: ``{"kind", "message", "time", "nonce"[, "factor"]}``. Raises SpecError
        when the request is not one :meth:`from_json` accepts."""
        self._check()
        d = {"kind": self.kind, "message": self.message, "time": self.time, "nonce": self.nonce}
        if self.factor is not None:
            d["factor"] = self.factor
        return json.dumps(d)

    @classmethod
    def obeyed(cls, raw: str | bytes) -> "FaultRequest":
        """What a rank makes of a request file's bytes ``raw`` (it never refuses one): ``slow``
        and ``hang`` as asked (a ``factor`` that is not a number: :data:`DEFAULT_SLOW_FACTOR`;
        capped to :data:`MIN_SLOW_FACTOR` .. :data:`MAX_SLOW_FACTOR`; not finite: 1); anything
        else (another kind, none, not JSON) an ``exception``, with ``message`` as written
        (``""`` when none)."""
        try:
            d = json.loads(raw)
        except ValueError:
            d = {}
        if not isinstance(d, dict):
            d = {}
        kind, nonce, factor = d.get("kind"), d.get("nonce"), None
        nonce = None if nonce is None else str(nonce)
        if kind == FaultKind.SLOW:
            try:
                factor = float(d.get("factor", DEFAULT_SLOW_FACTOR))
            except (TypeError, ValueError):
                factor = DEFAULT_SLOW_FACTOR
            factor = min(MAX_SLOW_FACTOR, max(MIN_SLOW_FACTOR, factor)) if math.isfinite(factor) else MIN_SLOW_FACTOR
        elif kind != FaultKind.HANG:
            kind = FaultKind.EXCEPTION.value
        t = d.get("time")
        return cls(kind=str(kind), message=str(d.get("message") or ""), nonce=nonce, factor=factor,
                   time=float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0)

    def _check(self) -> None:
        if self.kind not in REQUEST_FILE_KINDS:
            raise SpecError("kind", f"a fault request must be one of {', '.join(REQUEST_FILE_KINDS)}, "
                                    f"got {self.kind!r}")
        if not isinstance(self.message, str):
            raise SpecError("message", f"must be a string, got {type(self.message).__name__}")
        if isinstance(self.time, bool) or not isinstance(self.time, (int, float)):
            raise SpecError("time", f"must be epoch seconds, got {self.time!r}")
        if self.nonce is not None and not isinstance(self.nonce, str):
            raise SpecError("nonce", f"must be a string, got {type(self.nonce).__name__}")
        slow_factor(self.kind, self.factor)  # a factor in range, and only with ``slow``


class _At:
    """A :class:`JobPaths` attribute: the path of ``parts`` below the job folder."""

    def __init__(self, *parts: str, doc: str | None = None):
        self.parts, self.__doc__ = parts, doc or f"``<folder>/{'/'.join(parts)}``"

    def __get__(self, paths: "JobPaths | None", owner: type) -> "str | _At":
        return self if paths is None else paths.path(*self.parts)


class JobPaths:
    """The layout of one job directory on shared storage, the one place that knows it.

    The submit side builds it with :meth:`for_job` (POSIX paths, the cluster may be remote);
    the runtime with :meth:`from_env` (``$HYPERPOD_LAB_JOB_DIR``, local paths). Every attribute
    is a path string; nothing here touches the file system.

    Layout::

        <folder>/spec.json              the JobSpec (JSON)
        <folder>/script/<name>          the staged training script
        <folder>/events/<writer>.jsonl  one event file per writer (rank-R, agent-<node>, client, ...)
        <folder>/ranks/rank-R.json      what rank R wrote at start (pid, node, log file)
        <folder>/logs/                  launcher, torchrun, Slurm and Lighthouse logs
        <folder>/checkpoints/           the persistent checkpoint tier
        <folder>/joins.json             allocations added by elastic scale-up
        <folder>/lighthouse.json        checkpointless: the Lighthouse's published address
        <folder>/native_id              the scheduler's job id, written by the job when it starts
        <folder>/checkpoint.key         the job's key for authenticating its checkpoints (0600)
        <folder>/faults/rank-R.json     an injected-exception request for rank R (inject-fault --kind exception)
        <folder>/agents/<writer>.lock   launch agents' claims on their writer names (flock)
        <folder>/placement.json         the supervisor's faults per node and excluded nodes
        <folder>/storm.json             a declared restart storm (its presence stops every later start)
        <folder>/storm-supervisor.json  the supervisor's storm guard's counts
        <folder>/stragglers/<writer>.json, stragglers/exclude/<node>.json   straggler summaries; exclusions
        <folder>/health/<node>/, health/<run id>/<node>.json   health probes; pre-flight results
        <folder>/tensorboard/[rank-R/]  TensorBoard event files
        <folder>/mlflow-run.json        the job's MLflow run (JobSpec tracking "mlflow")
        <folder>/replicas/group-G.json  checkpointless: replica group G's registration
        <folder>/replicas/claim-G       checkpointless: group number G taken (O_EXCL) by a spare or a join
        <folder>/runs/<restart>.<step>/node-N   Slurm: each node's start counter of a step
        <folder>/operator-state.json    EKS: the operator status of the last look
        <folder>/job.sbatch, join-N.sbatch, exit_code, cancelled   backend files
    """

    SUBDIRS = ("events", "logs", "ranks", "checkpoints", "script")
    """Directories :meth:`~hyperpod_lab.schedulers.base.Scheduler.stage` creates."""

    def __init__(self, folder: str, *, join: Callable[..., str] = posixpath.join):
        """Args:
            folder: the job directory.
            join: the path join of the file system it lives on (POSIX for clusters).
        """
        self.folder, self._join = folder, join

    @classmethod
    def for_job(cls, shared_root: str, job_id: str) -> "JobPaths":
        """The job directory of ``job_id`` in the shared :data:`JOBS_SUBDIR` (EKS; POSIX paths)."""
        return cls(posixpath.join(shared_root, JOBS_SUBDIR, job_id))

    @classmethod
    def for_user_job(cls, shared_root: str, user: str, job_id: str) -> "JobPaths":
        """The job directory of ``user``'s job ``job_id``: ``<shared_root>/hyperpod-lab/<user>/jobs/<job id>``
        (:func:`user_jobs_root`; POSIX paths)."""
        return cls(posixpath.join(user_jobs_root(shared_root, user), job_id))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "JobPaths | None":
        """The job directory named by ``$HYPERPOD_LAB_JOB_DIR``, or None when unset (local paths)."""
        folder = (environ if environ is not None else os.environ).get(ENV_JOB_DIR)
        return cls(folder, join=os.path.join) if folder else None

    def path(self, *parts: str) -> str:
        return self._join(self.folder, *parts)

    def __repr__(self) -> str:
        return f"JobPaths({self.folder!r})"

    # files and folders (each a path string below ``folder``)
    spec = _At("spec.json")
    events = _At(EVENTS_DIRNAME)
    logs = _At("logs")
    ranks = _At("ranks")
    checkpoints = _At(CHECKPOINTS_DIRNAME)
    script_dir = _At("script")
    joins = _At("joins.json")
    lighthouse = _At("lighthouse.json")
    lighthouse_log = _At("logs", "lighthouse.log")
    torchrun_logs = _At("logs", "torchrun")
    launcher_log = _At("logs", "launcher.log")
    sbatch = _At("job.sbatch")
    native_id = _At("native_id", doc="The scheduler's job id, written by the job itself when it starts.")
    client_finished = _At("client-finished", doc=(
        "Created (exclusively) by the one client that writes a ``finished`` event for a job that ended "
        "without the runtime's: two clients (the server's watcher, a CLI) never both do."))
    checkpoint_key = _At("checkpoint.key", doc=(
        "The job's secret key (32 random bytes, 0600) that authenticates its checkpoints and commit markers "
        "(HMAC-SHA256): written by the submitter at staging, read by the runtime; see CHECKPOINT_KEY_BYTES."))
    exit_code = _At("exit_code")
    cancelled = _At("cancelled")
    faults = _At("faults", doc=(
        "Fault requests of ``inject-fault --kind exception``: ``rank-R.json`` ({kind: \"exception\", message, time "
        "(epoch seconds), nonce}) written atomically by the submitter (0600, in a 0700 folder it creates on demand); "
        "rank R's runtime finds it at a step, deletes it and raises ``InjectedFault``. See :meth:`fault_request`."))

    agents = _At("agents", doc="Launch agents' writer-name claims: ``<writer>.lock``, held (flock) for an agent's life.")
    placement = _At("placement.json", doc=(
        "The supervisor's record of faults per node and excluded nodes (``hyperpod_lab.node.supervisor``)."))
    storm = _At("storm.json", doc=(
        "A declared restart storm, created once (``O_EXCL``); its presence stops every later start "
        "(``hyperpod_lab.node.storm``)."))
    storm_supervisor = _At("storm-supervisor.json", doc="The supervisor's restart-storm guard's counts.")
    stragglers = _At("stragglers", doc="Each node's straggler summary, ``<agent writer>.json``.")
    stragglers_exclude = _At("stragglers", "exclude", doc=(
        "Nodes a launch agent asked to exclude as stragglers: ``<node>.json``."))
    health = _At("health", doc="Pre-flight health checks: ``<node>/`` probes, ``<run id>/<node>.json`` results.")
    tensorboard = _At("tensorboard", doc="TensorBoard event files (rank 0's; ``rank-R/`` with all ranks).")
    mlflow_run = _At("mlflow-run.json", doc=(
        "The job's one MLflow run (JobSpec ``tracking`` \"mlflow\"): {run_id, experiment_id, tracking_uri}, written "
        "atomically by rank 0 when it creates the run; every later start (a torchrun restart, a requeue) logs to "
        "that run (``hyperpod_lab.runtime.mlflow_tracking``)."))
    replicas = _At("replicas", doc="Checkpointless: ``group-G.json``, what each replica group registered.")
    runs = _At("runs", doc="Slurm: ``<restart>.<step id>/node-N``, each node's start counter of a step.")
    operator_state = _At("operator-state.json", doc="EKS: the operator status events of the last look (JSON).")
    hyperpodrun_logs = _At("logs", "hyperpodrun", doc="EKS: ``hyperpodrun``'s ``--log-dir``.")

    def script(self, script: str) -> str:
        """Where the training script ``script`` (any path; its base name counts) is staged."""
        return self.path("script", posixpath.basename(script))

    def rank_file(self, rank: int) -> str:
        return self.path("ranks", f"rank-{int(rank)}.json")

    def fault_request(self, rank: int) -> str:
        """``faults/rank-R.json``: the injected-exception request for global rank ``rank`` (see :attr:`faults`)."""
        return self.path("faults", f"rank-{int(rank)}.json")

    def agent_lock(self, name: str) -> str:
        """``agents/<name>.lock``: the lock a launch agent holds on its writer name ``name``."""
        return self.path("agents", name + ".lock")

    def straggler_summary(self, writer: str) -> str:
        """``stragglers/<writer>.json``: one node's straggler summary."""
        return self.path("stragglers", writer + ".json")

    def straggler_exclusion(self, node: str) -> str:
        """``stragglers/exclude/<node>.json``: a launch agent's request to exclude ``node``."""
        return self.path("stragglers", "exclude", node + ".json")

    def health_probe_dir(self, node: str) -> str:
        """``health/<node>``: where ``node``'s storage probe writes (``node`` a safe name)."""
        return self.path("health", node)

    def health_results(self, run_id: str) -> str:
        """``health/<run id>``: a pre-flight run's per-node result files."""
        return self.path("health", run_id)

    def health_result(self, run_id: str, node: str) -> str:
        """``health/<run id>/<node>.json`` (``node`` a safe name)."""
        return self.path("health", run_id, node + ".json")

    def step_run(self, restart: str, step: str) -> str:
        """``runs/<restart>.<step>``: the Slurm step's node start counters (shell text allowed)."""
        return self.path("runs", f"{restart}.{step}")

    def tensorboard_rank(self, rank: int) -> str:
        """``tensorboard/rank-R``: rank R's TensorBoard folder when every rank writes."""
        return self.path("tensorboard", f"rank-{int(rank)}")

    def spare_assignment(self, node: str) -> str:
        """``spares/<node>.json``: the supervisor's assignment of the hot spare on ``node``
        (``node`` a safe name): ``{"group": G, "time": epoch s}``, written atomically."""
        return self.path("spares", node + ".json")

    def replica_group(self, group: int) -> str:
        """``replicas/group-G.json``: what replica group ``group`` registered (node, pid)."""
        return self.path("replicas", f"group-{int(group)}.json")

    def replica_claim(self, group: int) -> str:
        """``replicas/claim-G``: replica group number ``group`` is taken (see :func:`claim_groups`)."""
        return self.path("replicas", f"claim-{int(group)}")

    def event_file(self, writer: str) -> str:
        return self.path(EVENTS_DIRNAME, writer + ".jsonl")

    def join_sbatch(self, index: int) -> str:
        return self.path(f"join-{int(index)}.sbatch")

    def slurm_log(self, native_id: str) -> str:
        return self.path("logs", f"slurm-{native_id}.out")

    def group_log(self, group: int) -> str:
        """A local joining replica group's agent log."""
        return self.path("logs", f"join-group-{int(group)}.log")

    def group_torchrun_logs(self, group: int) -> str:
        return self.path("logs", "torchrun", f"group-{int(group)}")

    @staticmethod
    def rank_of(name: str) -> int | None:
        """``7`` for a ``ranks/`` entry named ``rank-7.json``, else None."""
        if name.startswith("rank-") and name.endswith(".json") and name[5:-5].isdigit():
            return int(name[5:-5])
        return None


def effective_restarts(resiliency) -> int:
    """How many times the launch agent restarts failed workers: ``max_retries`` when
    ``auto_resume`` is on, else 0. ``resiliency`` is a :class:`hyperpod_lab.spec.Resiliency`."""
    return int(resiliency.max_retries) if resiliency.auto_resume else 0


def job_env(job_id: str, job_dir: str, spec_path: str, shared_root: str) -> dict[str, str]:
    """The ``HYPERPOD_LAB_*`` variables every backend gives the job (before the spec's own env)."""
    return {ENV_JOB_ID: job_id, ENV_JOB_DIR: job_dir, ENV_SPEC: spec_path, ENV_SHARED_ROOT: shared_root}


def launcher_argv(python: str, script: str, args: Iterable[str], *, nproc_per_node: int | str,
                  max_restarts: int, log_dir: str, nnodes: int | str | None = 1, standalone: bool = False,
                  rdzv: Iterable[str] = (), monitor_interval: float | None = None, redirects: bool = True,
                  quote: Callable[[str], str] = str) -> list[str]:
    """The launch agent's command: ``python -m hyperpod_lab.node.launch`` with torchrun's
    options (pure). ``quote`` is applied to ``python``, ``script`` and each of ``args`` only, so
    a renderer may pass shell-expanded text (``"$JOB_DIR/logs/torchrun"``) as ``log_dir``.

    Args:
        nproc_per_node: processes per node (torchrun ``--nproc-per-node``).
        max_restarts: worker restarts (see :func:`effective_restarts`).
        log_dir: torchrun's ``--log-dir``.
        nnodes: ``--nnodes`` (an int or ``"MIN:MAX"``); None leaves it out.
        standalone: ``--standalone`` (a rendezvous of this node only).
        rdzv: rendezvous options, e.g. ``["--rdzv-backend=c10d", ...]``, put after ``--nproc-per-node``.
        monitor_interval: ``--monitor-interval`` seconds, or None for torchrun's default.
        redirects: ``--redirects=3`` (worker output to files; with ``--tee=3`` also to the console).
    """
    argv = [quote(python), "-m", "hyperpod_lab.node.launch"]
    if standalone:
        argv.append("--standalone")
    if nnodes is not None:
        argv.append(f"--nnodes={nnodes}")
    argv.append(f"--nproc-per-node={nproc_per_node}")
    argv += list(rdzv)
    argv.append(f"--max-restarts={int(max_restarts)}")
    if monitor_interval is not None:
        argv.append(f"--monitor-interval={monitor_interval:g}")
    argv.append(f"--log-dir={log_dir}")
    argv += ["--redirects=3", "--tee=3"] if redirects else ["--tee=3"]
    return argv + [quote(script)] + [quote(a) for a in args]


def ft_local_argv(python: str, script: str, args: Iterable[str], *, groups: int, nproc_per_node: int,
                  max_restarts: int, min_replicas: int) -> list[str]:
    """The local backend's checkpointless driver (``python -m hyperpod_lab.node.ft_local``):
    a Lighthouse plus ``groups`` replica-group agents on this machine (pure)."""
    return [python, "-m", "hyperpod_lab.node.ft_local", f"--groups={int(groups)}",
            f"--nproc-per-node={int(nproc_per_node)}", f"--max-restarts={int(max_restarts)}",
            f"--min-replicas={int(min_replicas)}", script, *args]


def lighthouse_argv(python: str, job_dir: str, *, min_replicas: int, host: str) -> list[str]:
    """The supervised torchft Lighthouse of a checkpointless job (``python -m
    hyperpod_lab.node.lighthouse``; pure). It publishes ``JobPaths.lighthouse``."""
    return [python, "-m", "hyperpod_lab.node.lighthouse", "--job-dir", job_dir,
            f"--min-replicas={int(min_replicas)}", "--host", host]


def group_env(group: int, groups: int) -> dict[str, str]:
    """The variables that make a local agent replica group ``group`` of ``groups`` initial ones
    (its node is named ``local-g<group>``)."""
    return {ENV_REPLICA_GROUP: str(int(group)), ENV_REPLICA_GROUPS: str(int(groups)),
            "SLURMD_NODENAME": f"local-g{int(group)}"}


# Facts about the node and the job read the same by the ranks and the node-side tools (torch-free).
DEFAULT_SHM_ROOT = "/dev/shm/hyperpod-lab"
"""Where the memory tier's slots live when ``$HYPERPOD_LAB_SHM_DIR`` is unset."""


def node_name() -> str:
    """This machine's name in the job: ``$SLURMD_NODENAME``, else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def safe_name(text: str, limit: int = 60) -> str:
    """``text`` reduced to the characters an event writer name allows (``[A-Za-z0-9_.-]``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:limit] or "unknown"


def shm_root() -> str:
    """``$HYPERPOD_LAB_SHM_DIR``, else ``/dev/shm/hyperpod-lab`` (no ``/dev/shm``: a temp dir)."""
    root = os.environ.get(ENV_SHM_DIR)
    if root:
        return root
    if os.path.isdir("/dev/shm"):
        return DEFAULT_SHM_ROOT
    import tempfile

    return os.path.join(tempfile.gettempdir(), "hyperpod-lab-shm")


def job_finished(job_dir: str) -> bool:
    """Whether the job in ``job_dir`` has a ``finished`` event (any writer): the last event its
    writer writes, so only the end of each event file is read
    (:func:`hyperpod_lab.events.last_events_include`), never the job's history."""
    return last_events_include(job_dir, EventKind.FINISHED.value)


def claim_groups(create_new: Callable[[str], bool], paths: JobPaths, start: int, count: int = 1) -> int:
    """Take ``count`` consecutive replica group numbers for new groups of a checkpointless job,
    from ``start`` on, and return the first. A number beyond the job's first ``nodes`` groups is
    given by two parties that do not talk to each other: the job's supervisor (a spare replacing a
    lost group) and ``hyperpod-lab scale`` (a joining allocation); each takes a number by
    creating ``replicas/claim-G`` (:meth:`JobPaths.replica_claim`) with ``O_EXCL``
    (``create_new(path) -> bool``: True for the one caller that created it), so two groups never
    share a number (a shared number gave two groups one set of global ranks, rank files and event
    files: issue 27, seen in the 16-node test). A number taken by the other party is skipped
    (numbers are not reused; a gap is harmless).

    Raises:
        OSError: the shared storage refused the claim file (not "it exists").
    """
    start, count = int(start), max(1, int(count))
    while True:
        for i in range(count):
            if not create_new(paths.replica_claim(start + i)):
                start += i + 1  # taken: the block starts after it (what was taken before it stays a gap)
                break
        else:
            return start
