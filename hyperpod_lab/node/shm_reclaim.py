"""Free the memory tier of jobs that are over: their snapshots in a node's ``/dev/shm``.

A job that ends normally deletes its ranks' snapshots and held replicas
(:meth:`hyperpod_lab.runtime.checkpoint.tiered.TieredCheckpointer.close`). A job that is
cancelled (``scancel``), times out, fails, or loses its node does not: its ranks are killed, and
their shared-memory files stay in ``<shm_root>/<job_id>/<node>/`` until the node reboots. On a
node of 8 ranks that is every rank's snapshots times ``checkpoint.keep_last`` plus the replicas it
holds for its peers, in RAM, and the next job's ``shm`` health check fails on it.

:func:`reclaim_ended_jobs` runs in every node's pre-flight health check
(:func:`hyperpod_lab.node.health.check_node`), at the start of each job on the node, before the
``shm`` check measures the free space. It deletes the directory of a job under ``shm_root`` only
when it knows the job is over, from the job's folder on the shared storage (a sibling of the
running job's folder, ``<jobs_root>/<job_id>``):

* the folder has a ``finished`` event (:func:`hyperpod_lab.jobdir.job_finished`), or
* the job wrote its Slurm job id (``native_id``) and Slurm no longer lists that job
  (``squeue --me``: a job leaves the queue once it has ended, whatever ended it; squeue(1)).

Everything else is kept: the running job's own directory; a job whose folder is not found (it
may belong to another shared storage); a job Slurm still lists (pending, running, requeued); any
directory when ``squeue`` cannot answer; another user's directory. Standard library only; no
torch.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from hyperpod_lab.jobdir import JobPaths, job_finished

__all__ = ["Reclaimed", "held_bytes", "live_slurm_jobs", "reclaim_ended_jobs", "SQUEUE_TIMEOUT_S"]

#: seconds ``squeue`` may take before the reclaim gives up (and keeps every directory)
SQUEUE_TIMEOUT_S = 15.0

_UNASKED = object()


@dataclass
class Reclaimed:
    """One ended job's memory tier, deleted from this node.

    Attributes:
        job_id: the job (the directory's name under ``shm_root``).
        bytes: bytes of shared memory it held (allocated blocks), now free.
        why: ``"finished"`` (a ``finished`` event) or ``"Slurm job <id> not in squeue"``.
    """

    job_id: str
    bytes: int
    why: str

    def as_dict(self) -> dict:
        return {"job_id": self.job_id, "bytes": self.bytes, "why": self.why}


def live_slurm_jobs(timeout_s: float = SQUEUE_TIMEOUT_S) -> set[str] | None:
    """Slurm job ids of this user's jobs that Slurm still lists (any state: pending, running,
    completing, requeued), from ``squeue --me --noheader --format=%A`` (squeue(1): ``%A`` is the
    job id number). Returns None when squeue is missing, fails or takes over ``timeout_s`` seconds:
    then no job can be said to be over by Slurm."""
    try:
        res = subprocess.run(["squeue", "--me", "--noheader", "--format=%A"], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return {line.strip() for line in res.stdout.splitlines() if line.strip()}


def held_bytes(directory: str) -> int:
    """Bytes the regular files below ``directory`` occupy (allocated blocks, so a sparse slot
    counts what it holds; links not followed); 0 when it does not exist."""
    total = 0
    for root, _dirs, files in os.walk(directory, onerror=lambda e: None):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def _native_id(job_dir: str) -> str | None:
    """The Slurm job id the job wrote when it started (the batch script's ``$SLURM_JOB_ID``)."""
    try:
        with open(JobPaths(job_dir, join=os.path.join).native_id, encoding="utf-8") as f:
            return f.read(200).strip() or None
    except OSError:
        return None


def reclaim_ended_jobs(shm_root: str, jobs_root: str, current_job_id: str,
                       live_jobs: Callable[[], set[str] | None] = live_slurm_jobs) -> list[Reclaimed]:
    """Delete the memory-tier directories under ``shm_root`` of this user's jobs that are over.

    Args:
        shm_root: the memory tier's root on this node (``<shm_root>/<job_id>/<node>/...``).
        jobs_root: the folder of the jobs' folders on the shared storage (``<jobs_root>/<job_id>``).
        current_job_id: the job running this check; its directory is never touched.
        live_jobs: returns the Slurm job ids Slurm still lists, or None when Slurm cannot tell
            (only a ``finished`` event then ends a job); called once, and only when a directory
            needs it. Default: :func:`live_slurm_jobs` (``squeue``).

    Returns:
        the directories deleted, by job id. A directory that cannot be deleted is left as it is
        (never an error: this check must not stop a job).
    """
    try:
        names = sorted(os.listdir(shm_root))
    except OSError:
        return []
    uid = os.geteuid()
    live: object = _UNASKED
    out: list[Reclaimed] = []
    for name in names:
        if name == current_job_id:
            continue
        path = os.path.join(shm_root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:  # lstat: a link is not a directory
            continue
        job_dir = os.path.join(jobs_root, name)
        if not os.path.isdir(job_dir):
            continue
        why = None
        if job_finished(job_dir):
            why = "finished"
        else:
            native = _native_id(job_dir)
            if native is not None:
                if live is _UNASKED:
                    live = live_jobs()
                if live is not None and native not in live:
                    why = f"Slurm job {native} not in squeue"
        if why is None:
            continue
        held = held_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            out.append(Reclaimed(job_id=name, bytes=held, why=why))
    return out
