"""Job records: what was submitted where, and its last known state.

Records live in one SQLite database, ``<data_dir>/jobs/jobs.sqlite3``
(``hyperpod_lab.submit.clusters.data_dir``), in WAL mode with full synchronous commits: every write is
one transaction, so a crash or ``kill -9`` of any writer (CLI, kernel, server) never leaves half a
record, and many processes may read and write at once. The server also keeps each job's event
cursor and progress summary there, so they survive a restart. Records of the earlier
one-JSON-file-per-job layout in the same directory are imported on first open.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from hyperpod_lab.errors import DuplicateJob, JobStateError, UnknownJob
from hyperpod_lab.submit.clusters import data_dir


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


JOB_ID_RANDOM_BYTES = 8  # 64 random bits


def new_job_id(name: str, now: float | None = None) -> str:
    """A unique, shell- and path-safe id derived from the job name:
    ``<slug>-<YYYYmmdd-HHMMSS>-<16 hex digits>`` (64 random bits: a collision among a billion
    same-name submissions in one second has odds of about 3e-2; among 100, about 3e-16)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{slug}-{stamp}-{secrets.token_hex(JOB_ID_RANDOM_BYTES)}"


_JOB_ID_RE = re.compile(r"[A-Za-z0-9_.-]+")
DB_NAME = "jobs.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    submitted_at REAL NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_time ON jobs (submitted_at);
CREATE TABLE IF NOT EXISTS event_cursors (
    job_id TEXT PRIMARY KEY,
    cursor TEXT NOT NULL,
    progress TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class JobStore:
    """Durable job records in SQLite (default ``<data_dir>/jobs/jobs.sqlite3``).

    Safe to share between threads (one connection per thread) and processes (SQLite locking,
    WAL, ``busy_timeout`` 30 s). Every method is one transaction.

    Args:
        root: directory of the database (default ``<data_dir>/jobs``); ``*.json`` records of the
            earlier layout found there are imported once.
    """

    def __init__(self, root: str | None = None):
        self.root = root or os.path.join(data_dir(), "jobs")
        self.path = os.path.join(self.root, DB_NAME)
        self._local = threading.local()
        self._ready = False
        self._init_lock = threading.Lock()

    # ---- connection ------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        """This thread's connection; the database is created on first use (so a dry run
        writes nothing)."""
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            self._make_private()
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            self._local.db, self._local.pid = db, os.getpid()
        if not self._ready:
            with self._init_lock:
                if not self._ready:
                    db.executescript(_SCHEMA)  # idempotent; executescript commits on its own
                    self._ready = True
                    self._migrate_json()
        return db

    def _make_private(self) -> None:
        """The store is private to the user (specs hold env values): a new database file is
        created 0600 (SQLite gives its -wal/-shm files the database file's mode); an existing
        one is chmod-ed. Never opens and closes a descriptor of an existing database: closing
        any descriptor of a file drops this process's POSIX locks on it, which SQLite's other
        connections rely on (that gave "disk I/O error" in the server's worker threads)."""
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            for suffix in ("", "-wal", "-shm"):
                try:
                    if os.stat(self.path + suffix).st_mode & 0o077:
                        os.chmod(self.path + suffix, 0o600)
                except FileNotFoundError:
                    pass

    class _Tx:
        def __init__(self, db: sqlite3.Connection, immediate: bool):
            self.db, self.immediate = db, immediate

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
            return self.db

        def __exit__(self, exc_type, exc, tb):
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
            return False

    def _tx(self, immediate: bool = True) -> "_Tx":
        return JobStore._Tx(self._db(), immediate)

    def _migrate_json(self) -> None:
        """Import ``<root>/*.json`` records (the earlier layout) once; unreadable files are skipped."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM meta WHERE key = 'json_migrated'").fetchone():
                return
            for name in sorted(os.listdir(self.root)):
                if not name.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(self.root, name)) as f:
                        rec = JobRecord.from_json(f.read())
                except (OSError, ValueError, TypeError):
                    continue
                db.execute("INSERT OR IGNORE INTO jobs (job_id, submitted_at, record) VALUES (?, ?, ?)",
                           (rec.job_id, rec.submitted_at, rec.to_json()))
            db.execute("INSERT INTO meta (key, value) VALUES ('json_migrated', ?)", (str(time.time()),))

    @staticmethod
    def _check_id(job_id: str) -> None:
        if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
            raise UnknownJob(f"'{job_id}' is not a job id; list jobs with 'hyperpod-lab jobs'")

    # ---- records ---------------------------------------------------------------------
    def put(self, rec: JobRecord) -> None:
        """Insert or replace ``rec`` (stamps ``updated_at``)."""
        self._check_id(rec.job_id)
        rec.updated_at = time.time()
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO jobs (job_id, submitted_at, record) VALUES (?, ?, ?)",
                       (rec.job_id, rec.submitted_at, rec.to_json()))

    def add(self, rec: JobRecord) -> None:
        """Insert a new record (stamps ``updated_at``); never replaces one.

        Raises:
            DuplicateJob: a record with ``rec.job_id`` exists (it is left as it was).
        """
        self._check_id(rec.job_id)
        rec.updated_at = time.time()
        try:
            with self._tx() as db:
                db.execute("INSERT INTO jobs (job_id, submitted_at, record) VALUES (?, ?, ?)",
                           (rec.job_id, rec.submitted_at, rec.to_json()))
        except sqlite3.IntegrityError:
            raise DuplicateJob(f"job id {rec.job_id} is already taken; submit again for a new id") from None

    def remove(self, job_id: str) -> None:
        """Delete a record (a submission that failed before the scheduler took it)."""
        self._check_id(job_id)
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM event_cursors WHERE job_id = ?", (job_id,))

    def get(self, job_id: str) -> JobRecord:
        """The record of ``job_id``. Raises UnknownJob (listing recent ids)."""
        self._check_id(job_id)
        row = self._db().execute("SELECT record FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            recent = [r.job_id for r in self.list()[:5]]
            hint = f"recent jobs: {', '.join(recent)}" if recent else "no jobs submitted yet"
            raise UnknownJob(f"unknown job '{job_id}'; {hint}")
        return JobRecord.from_json(row[0])

    def list(self) -> list[JobRecord]:
        """All records, newest first."""
        rows = self._db().execute("SELECT record FROM jobs ORDER BY submitted_at DESC, job_id").fetchall()
        return [JobRecord.from_json(r[0]) for r in rows]

    def update_status(self, rec: JobRecord, status: JobStatus, exit_code: int | None = None,
                      reason: str | None = None) -> JobRecord:
        """Move ``rec`` to ``status`` and persist it. Raises JobStateError when ``rec`` is
        terminal and ``status`` differs (a finished job never comes back).

        Read and write are one transaction: when another process already stored a terminal
        state, that state wins and is copied into ``rec``.
        """
        if rec.state.is_terminal() and status != rec.state:
            raise JobStateError(f"job {rec.job_id} is {rec.status}; it cannot become {status.value}")
        with self._tx() as db:
            row = db.execute("SELECT record FROM jobs WHERE job_id = ?", (rec.job_id,)).fetchone()
            stored = JobRecord.from_json(row[0]) if row else None
            if stored is not None and stored.state.is_terminal():
                rec.__dict__.update(stored.__dict__)
                return rec
            if rec.state == status and exit_code == rec.exit_code and (reason is None or reason == rec.reason):
                return rec
            rec.status, rec.exit_code = status.value, exit_code
            if reason is not None:
                rec.reason = reason
            rec.updated_at = time.time()
            db.execute("INSERT OR REPLACE INTO jobs (job_id, submitted_at, record) VALUES (?, ?, ?)",
                       (rec.job_id, rec.submitted_at, rec.to_json()))
        return rec

    # ---- event cursors (the server's) ------------------------------------------------
    def put_cursor(self, job_id: str, cursor: dict[str, int], progress: dict[str, Any] | None = None) -> None:
        """Remember how far the server has read a job's events (``{file name: byte offset}``)
        and the progress summary computed up to there."""
        self.put_cursors([(job_id, cursor, progress)])

    def put_cursors(self, items: "list[tuple[str, dict[str, int], dict[str, Any] | None]]") -> None:
        """:meth:`put_cursor` for many jobs in one transaction (one fsync)."""
        for job_id, _, _ in items:
            self._check_id(job_id)
        now = time.time()
        with self._tx() as db:
            db.executemany("INSERT OR REPLACE INTO event_cursors (job_id, cursor, progress, updated_at) "
                           "VALUES (?, ?, ?, ?)",
                           [(j, json.dumps(c, sort_keys=True), None if p is None else json.dumps(p), now)
                            for j, c, p in items])

    def get_cursor(self, job_id: str) -> tuple[dict[str, int], dict[str, Any] | None] | None:
        """``(cursor, progress)`` saved by :meth:`put_cursor`, or None."""
        self._check_id(job_id)
        row = self._db().execute("SELECT cursor, progress FROM event_cursors WHERE job_id = ?",
                                 (job_id,)).fetchone()
        if row is None:
            return None
        return json.loads(row[0]), (json.loads(row[1]) if row[1] else None)

    def cursors(self) -> dict[str, tuple[dict[str, int], dict[str, Any] | None]]:
        """Every saved ``{job_id: (cursor, progress)}`` (one query; the server loads them at start)."""
        rows = self._db().execute("SELECT job_id, cursor, progress FROM event_cursors").fetchall()
        return {j: (json.loads(c), json.loads(p) if p else None) for j, c, p in rows}
