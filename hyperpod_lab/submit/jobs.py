"""Job records: what was submitted where, and its last known state.

Records live in one SQLite database, ``<data_dir>/jobs/jobs.sqlite3``
(``hyperpod_lab.submit.clusters.data_dir``), in WAL mode with full synchronous commits: every write is
one transaction, so a crash or ``kill -9`` of any writer (CLI, kernel, server) never leaves half a
record, and many processes may read and write at once. The server also keeps each job's event
cursor and progress summary there, so they survive a restart. Records of the earlier
one-JSON-file-per-job layout in the same directory are imported on first open.

Several processes (two Jupyter servers, a CLI) may share one data directory. A terminal state
(completed, failed, cancelled) is final in the database itself: every write of a record is one
conditional SQL statement that leaves a stored terminal record alone unless the new one has the
same status, so a stale in-memory copy written back later never makes a finished job "running"
again. SQLite's WAL mode needs shared memory and POSIX locks that network file systems (NFS,
Lustre, CIFS, ...) do not give reliably: the store logs a warning (once per directory and
process) when its directory is on one (:func:`network_fs_type`). A full disk fails a write with
:class:`JobStoreFull` (the records committed before stay intact).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from hyperpod_lab.errors import DuplicateJob, HyperPodLabError, JobStateError, UnknownJob
from hyperpod_lab.jobdir import ENV_DATA_DIR
from hyperpod_lab.submit.clusters import data_dir

log = logging.getLogger("hyperpod_lab.submit.jobs")


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


_TERMINAL = tuple(s.value for s in JobStatus if s.is_terminal())
_UPSERT = (
    "INSERT INTO jobs (job_id, submitted_at, record) VALUES (?, ?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET submitted_at = excluded.submitted_at, record = excluded.record "
    "WHERE json_extract(jobs.record, '$.status') NOT IN (" + ", ".join(f"'{v}'" for v in _TERMINAL) + ") "
    "OR json_extract(jobs.record, '$.status') = json_extract(excluded.record, '$.status')")
"""Insert or replace a record, except over a stored terminal record of another status (a
finished job never comes back); ``rowcount`` 0 when it was left alone."""

NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph", "glusterfs", "fuse.glusterfs", "gpfs",
    "beegfs", "9p", "afs", "ocfs2", "gfs2", "fuse.sshfs", "fuse.s3fs", "fuse.mountpoint-s3", "fuse.rclone",
    "fuse.gcsfuse", "fuse.juicefs", "panfs", "wekafs", "fuse.weka"})
"""File system types (``/proc/mounts``' third field) where SQLite's WAL mode is unsafe: its
``-shm`` index is shared memory and its locks are POSIX locks, neither of which a network file
system keeps consistent between hosts (SQLite's documentation, "WAL mode", "Disadvantages")."""
MOUNTS_FILE = "/proc/mounts"
_WARNED: set[str] = set()


class JobStoreFull(HyperPodLabError, OSError):
    """The job store's file system is full (SQLite: SQLITE_FULL); the write was rolled back and the
    records committed before are intact. The message names the database and the fix."""


def _unescape_mount(field_: str) -> str:
    """A ``/proc/mounts`` field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def fs_type(path: str, mounts: str | None = None) -> str | None:
    """The file system type of the mount holding ``path`` (or its nearest existing parent): the
    third field of the ``mounts`` line (default :data:`MOUNTS_FILE`, ``/proc/mounts``, Linux) whose
    mount point is the longest prefix of its real path; None where ``mounts`` cannot be read."""
    p = os.path.realpath(path)
    try:
        with open(mounts or MOUNTS_FILE, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best, best_len = None, -1
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = _unescape_mount(parts[1])
        inside = p == mnt or p.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) > best_len:  # a later line of the same mount point wins (mounted over)
            best, best_len = parts[2], len(mnt)
        elif inside and len(mnt) == best_len:
            best = parts[2]
    return best


def network_fs_type(path: str, mounts: str | None = None) -> str | None:
    """``path``'s file system type (:func:`fs_type`) when it is a network or cluster file system
    (:data:`NETWORK_FS_TYPES`), else None."""
    kind = fs_type(path, mounts)
    return kind if kind in NETWORK_FS_TYPES else None


BUSY_TIMEOUT_S = 30.0
"""How long a store operation waits for another connection's lock (seconds)."""


def _enable_wal(db: sqlite3.Connection, path: str, timeout: float = BUSY_TIMEOUT_S) -> None:
    """Put the database in WAL mode, retrying while another process holds a lock.

    Switching a new database from the rollback journal to WAL takes an exclusive lock, and
    SQLite answers ``SQLITE_BUSY`` to that pragma at once, without calling the busy handler,
    while another connection is in the middle of the same switch (several processes opening a
    new store at the same moment; a fresh CI run saw it in tests/submit/test_store.py). A
    database already in WAL mode returns at once. Raises sqlite3.OperationalError after
    ``timeout`` seconds (naming the database file)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError(f"the job store {path} stayed locked for {timeout:.0f} s while "
                                               f"switching it to WAL mode ({e}); another process holds it: "
                                               f"stop it or retry") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


class JobStore:
    """Durable job records in SQLite (default ``<data_dir>/jobs/jobs.sqlite3``).

    Safe to share between threads (one connection per thread) and processes (SQLite locking,
    WAL, ``busy_timeout`` 30 s). Every method is one transaction.

    Args:
        root: directory of the database (default ``<data_dir>/jobs``); ``*.json`` records of the
            earlier layout found there are imported once.

    Every write raises :class:`JobStoreFull` when the file system is full (nothing of it is
    stored). Opening the store logs a warning (once per process) when ``root`` is on a network
    file system (:func:`network_fs_type`), where SQLite's WAL is unsafe.
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
            self._warn_network_fs()
            self._make_private()
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            _enable_wal(db, self.path)
            db.execute("PRAGMA synchronous=FULL")
            self._local.db, self._local.pid = db, os.getpid()
        if not self._ready:
            with self._init_lock:
                if not self._ready:
                    db.executescript(_SCHEMA)  # idempotent; executescript commits on its own
                    self._ready = True
                    self._migrate_json()
        return db

    def _warn_network_fs(self) -> None:
        """Log a warning (once per directory and process) when the store is on a network file system."""
        root = os.path.realpath(self.root)
        if root in _WARNED:
            return
        _WARNED.add(root)
        kind = network_fs_type(root)
        if kind is not None:
            log.warning("hyperpod-lab: the job store %s is on a %s file system, where SQLite's WAL mode (shared "
                        "memory, POSIX locks) is unsafe: two servers or hosts writing it can corrupt it. Point "
                        "$%s (the data directory) at a local disk; each host keeps its own.",
                        self.path, kind, ENV_DATA_DIR)

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
        """One transaction; a full disk (SQLITE_FULL) anywhere in it, the commit included, rolls
        it back and raises :class:`JobStoreFull`."""

        def __init__(self, db: sqlite3.Connection, immediate: bool, path: str):
            self.db, self.immediate, self.path = db, immediate, path

        def __enter__(self) -> sqlite3.Connection:
            try:
                self.db.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
            except sqlite3.OperationalError as e:
                raise self._full(e) or e
            return self.db

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                try:
                    self.db.execute("COMMIT")
                    return False
                except sqlite3.Error as e:
                    self._rollback()
                    raise self._full(e) or e
            self._rollback()
            full = self._full(exc) if isinstance(exc, sqlite3.Error) else None
            if full is not None:
                raise full from exc
            return False

        def _rollback(self) -> None:
            if self.db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL does)
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass

        def _full(self, e: BaseException) -> "JobStoreFull | None":
            if getattr(e, "sqlite_errorname", None) != "SQLITE_FULL" and "disk is full" not in str(e):
                return None
            return JobStoreFull(errno.ENOSPC, f"no space left on the device for the job store {self.path} "
                                f"(SQLite: {e}); nothing of this change was stored and earlier records are intact; "
                                f"free space on its file system (or move the data directory, "
                                f"${ENV_DATA_DIR}) and retry")

    def _tx(self, immediate: bool = True) -> "_Tx":
        return JobStore._Tx(self._db(), immediate, self.path)

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
    def put(self, rec: JobRecord) -> bool:
        """Insert or replace ``rec`` (stamps ``updated_at``), unless the stored record is terminal
        (completed, failed, cancelled) and ``rec`` has another status: then the stored record is
        kept and copied into ``rec`` (another process finished the job while ``rec`` was a stale
        copy). One conditional SQL statement, so two servers on one data directory cannot undo
        each other's terminal state.

        Returns:
            Whether ``rec`` was stored (False: the stored terminal record won).

        Raises:
            JobStoreFull: the disk is full (nothing stored; earlier records intact).
        """
        self._check_id(rec.job_id)
        new = replace(rec, updated_at=time.time())
        with self._tx() as db:
            stored = db.execute(_UPSERT, (new.job_id, new.submitted_at, new.to_json())).rowcount > 0
            row = None if stored else db.execute("SELECT record FROM jobs WHERE job_id = ?", (rec.job_id,)).fetchone()
        if row is not None:
            log.info("job %s is %s in the store: a stale copy of it (%s) was not written over that",
                     rec.job_id, json.loads(row[0]).get("status"), rec.status)
            new = JobRecord.from_json(row[0])
        rec.__dict__.update(new.__dict__)
        return stored

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
            db.execute(_UPSERT, (rec.job_id, rec.submitted_at, rec.to_json()))  # (the read above holds the lock)
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
