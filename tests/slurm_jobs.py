"""Helpers for tests that act on the dev cluster's Slurm jobs as an operator (or a failing node)
would: scontrol, and the job's processes on this host (both dev nodes run on it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True)


def job_pids(slurm_job_id, node: str | None = None) -> list[int]:
    """PIDs of this host's processes that belong to Slurm job ``slurm_job_id`` (on ``node`` if
    given), read from each process's environment (srun sets SLURM_JOB_ID and SLURMD_NODENAME)."""
    want = {f"SLURM_JOB_ID={slurm_job_id}".encode()}
    if node:
        want.add(f"SLURMD_NODENAME={node}".encode())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            pids.append(int(entry))
    return pids


def kill_node_processes(slurm_job_id, node: str) -> None:
    """A node that dies takes its processes with it: SIGKILL the job's processes on ``node``."""
    for pid in job_pids(slurm_job_id, node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until_gone(slurm_job_id, timeout_s: float = 60.0) -> None:
    """Wait until no process of the job's previous run is left on this host. Slurm delays a
    requeued job's start until the old run is gone; a test that releases it early
    (``StartTime=now``) waits for that itself."""
    deadline = time.monotonic() + timeout_s
    left = job_pids(slurm_job_id)
    while left:
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of Slurm job {slurm_job_id} still alive after {timeout_s} s: {left}")
        time.sleep(0.2)
        left = job_pids(slurm_job_id)


def wait_pending(client, job_id: str, timeout_s: float = 20.0) -> None:
    """Wait until the job is back in the queue (requeued)."""
    deadline = time.monotonic() + timeout_s
    while client.status(job_id).status != "pending":
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} was not requeued within {timeout_s} s: {client.status(job_id)}")
        time.sleep(0.2)
