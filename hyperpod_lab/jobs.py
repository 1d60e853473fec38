"""Job records: what was submitted where, and its last known state.

Records are JSON files, one per job, in ``<data_dir>/jobs/`` (``hyperpod_lab.clusters.data_dir``),
written atomically (temporary file, fsync, rename) so a crash never leaves half a record.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from hyperpod_lab.clusters import data_dir
from hyperpod_lab.errors import JobStateError, UnknownJob


class JobStatus(str, Enum):
    """Lifecycle of a job, across backends."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    def is_terminal(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass
class JobRecord:
    """One submitted job.

    Attributes:
        job_id: hyperpod-lab id (``<name-slug>-<YYYYmmdd-HHMMSS>-<hex>``), used by every command.
        name: the job name as the user gave it.
        cluster: cluster profile name; orchestrator: its orchestrator.
        native_id: the scheduler's id (Slurm job id, local launcher pid).
        job_dir: the job's directory on the cluster's shared storage.
        spec: the JobSpec as a dict.
        status: last known JobStatus value; exit_code: when known.
        submitted_at, updated_at: seconds since the epoch.
    """

    job_id: str
    name: str
    cluster: str
    orchestrator: str
    native_id: str
    job_dir: str
    spec: dict[str, Any]
    status: str = JobStatus.PENDING.value
    exit_code: int | None = None
    submitted_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    reason: str | None = None

    @property
    def state(self) -> JobStatus:
        return JobStatus(self.status)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobRecord":
        return cls(**json.loads(text))


def new_job_id(name: str, now: float | None = None) -> str:
    """A unique, shell- and path-safe id derived from the job name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{slug}-{stamp}-{secrets.token_hex(2)}"


class JobStore:
    """Durable job records in a directory (default ``<data_dir>/jobs``)."""

    def __init__(self, root: str | None = None):
        self.root = root or os.path.join(data_dir(), "jobs")
        os.makedirs(self.root, exist_ok=True)

    def _path(self, job_id: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id or ""):
            raise UnknownJob(f"'{job_id}' is not a job id; list jobs with 'hyperpod-lab jobs'")
        return os.path.join(self.root, job_id + ".json")

    def put(self, rec: JobRecord) -> None:
        rec.updated_at = time.time()
        path = self._path(rec.job_id)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(rec.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def get(self, job_id: str) -> JobRecord:
        try:
            with open(self._path(job_id)) as f:
                return JobRecord.from_json(f.read())
        except FileNotFoundError:
            recent = [r.job_id for r in self.list()[:5]]
            hint = f"recent jobs: {', '.join(recent)}" if recent else "no jobs submitted yet"
            raise UnknownJob(f"unknown job '{job_id}'; {hint}") from None

    def list(self) -> list[JobRecord]:
        """All records, newest first."""
        out = []
        for name in os.listdir(self.root):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.root, name)) as f:
                        out.append(JobRecord.from_json(f.read()))
                except (OSError, ValueError, TypeError):
                    continue
        return sorted(out, key=lambda r: r.submitted_at, reverse=True)

    def update_status(self, rec: JobRecord, status: JobStatus, exit_code: int | None = None,
                      reason: str | None = None) -> JobRecord:
        """Move ``rec`` to ``status`` and persist it. Raises JobStateError when ``rec`` is
        terminal and ``status`` differs (a finished job never comes back)."""
        if rec.state.is_terminal() and status != rec.state:
            raise JobStateError(f"job {rec.job_id} is {rec.status}; it cannot become {status.value}")
        if rec.state == status and exit_code == rec.exit_code and (reason is None or reason == rec.reason):
            return rec
        rec.status, rec.exit_code = status.value, exit_code
        if reason is not None:
            rec.reason = reason
        self.put(rec)
        return rec
