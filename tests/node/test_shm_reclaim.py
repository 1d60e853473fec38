"""A job that is over leaves its memory tier in the node's /dev/shm when its ranks were killed
(scancel, a timeout, a failure: seen in this suite, a cancelled 2-node job left 94 MiB a node);
the next job's pre-flight ``shm`` check on the node frees it (hyperpod_lab.node.shm_reclaim), and
only that: a job that Slurm still lists, the running job, and a job whose folder is unknown keep
theirs. Slurm is real (the dev cluster): a job ended by ``scancel`` leaves ``squeue``'s list
(squeue(1): it lists jobs "in the scheduling queue")."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from hyperpod_lab.events import EventKind, EventWriter
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.node import health
from hyperpod_lab.node.shm_reclaim import live_slurm_jobs, reclaim_ended_jobs

MIB = 1 << 20


def _sbatch_sleep() -> str:
    res = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--output=/dev/null", "--chdir=/tmp",
                          "--job-name=shm-reclaim-test", "--wrap", "sleep 300"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def _cancel_and_wait_gone(native: str, timeout_s: float = 60.0) -> None:
    subprocess.run(["scancel", native], check=True, timeout=30)
    deadline = time.monotonic() + timeout_s
    while native in (live_slurm_jobs() or {native}):
        assert time.monotonic() < deadline, f"Slurm job {native} still in squeue {timeout_s} s after scancel"
        time.sleep(0.5)


def _job(jobs_root, shm_root, job_id: str, *, native: str | None = None, folder: bool = True) -> str:
    """A job's folder on the shared storage (with the Slurm job id it wrote when it started) and
    its memory tier on this node: one rank's 1 MiB slot and a held replica."""
    job_dir = os.path.join(jobs_root, job_id)
    if folder:
        os.makedirs(job_dir)
        if native is not None:
            with open(JobPaths(job_dir, join=os.path.join).native_id, "w") as f:
                f.write(native + "\n")
    for sub in ("rank-0", "replica-of-rank-1"):
        d = os.path.join(shm_root, job_id, "n1", sub)
        os.makedirs(d)
        with open(os.path.join(d, "slot-0.bin"), "wb") as f:
            f.write(b"\1" * MIB)
    return job_dir


def test_the_next_jobs_health_check_frees_the_memory_tier_of_jobs_that_are_over(dev_cluster, tmp_path):
    jobs_root, shm_root = str(tmp_path / "jobs"), str(tmp_path / "shm")
    live = _sbatch_sleep()
    cancelled = _sbatch_sleep()
    try:
        _cancel_and_wait_gone(cancelled)
        current = _job(jobs_root, shm_root, "current", native=live)
        _job(jobs_root, shm_root, "cancelled", native=cancelled)
        _job(jobs_root, shm_root, "still-queued", native=live)
        finished = _job(jobs_root, shm_root, "finished")  # no Slurm id: a local job, ended normally
        EventWriter(finished, "client", "finished").emit(EventKind.FINISHED, status="succeeded", exit_code=0)
        _job(jobs_root, shm_root, "unknown", folder=False)  # another storage's job, maybe

        # squeue cannot answer: only the finished event tells a job is over
        assert [r.job_id for r in reclaim_ended_jobs(shm_root, jobs_root, "current", live_jobs=lambda: None)] \
            == ["finished"]
        _job(jobs_root, shm_root, "finished-again", native=None)
        EventWriter(os.path.join(jobs_root, "finished-again"), "client", "finished-again").emit(
            EventKind.FINISHED, status="failed", exit_code=1)

        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"script": "train.py", "checkpoint": {"memory_every_steps": 5}}))
        result = health.check_node(current, "current", "n1", shm_bytes=MIB, shm_root=shm_root,
                                   spec_path=str(spec)).checks["shm"]
    finally:
        subprocess.run(["scancel", live, cancelled], timeout=30)

    assert result.status == health.PASSED, result.detail
    reclaimed = {r["job_id"]: r for r in result.extra["reclaimed"]}
    assert sorted(reclaimed) == ["cancelled", "finished-again"], result.extra
    assert reclaimed["cancelled"]["why"] == f"Slurm job {cancelled} not in squeue"
    assert reclaimed["finished-again"]["why"] == "finished"
    assert all(r["bytes"] >= 2 * MIB for r in reclaimed.values())  # a slot and a held replica each
    assert "freed 4.0 MiB" in result.detail and "2 ended job(s)' snapshots (cancelled, finished-again)" \
        in result.detail, result.detail
    assert sorted(os.listdir(shm_root)) == ["current", "still-queued", "unknown"]
    for kept in ("current", "still-queued", "unknown"):  # untouched, every file
        assert os.path.getsize(os.path.join(shm_root, kept, "n1", "rank-0", "slot-0.bin")) == MIB


def test_another_users_directory_and_a_link_are_never_followed_or_deleted(tmp_path):
    jobs_root, shm_root = str(tmp_path / "jobs"), str(tmp_path / "shm")
    _job(jobs_root, shm_root, "other-user", native="1")
    EventWriter(os.path.join(jobs_root, "other-user"), "client", "other-user").emit(
        EventKind.FINISHED, status="succeeded", exit_code=0)
    if os.geteuid() != 0:
        pytest.fail("this test changes a directory's owner: run it as root (scripts/test.sh does)", pytrace=False)
    os.chown(os.path.join(shm_root, "other-user"), 12345, 12345)
    target = _job(jobs_root, str(tmp_path / "elsewhere"), "linked")
    EventWriter(target, "client", "linked").emit(EventKind.FINISHED, status="succeeded", exit_code=0)
    os.symlink(str(tmp_path / "elsewhere" / "linked"), os.path.join(shm_root, "linked"))

    assert reclaim_ended_jobs(shm_root, jobs_root, "current", live_jobs=lambda: set()) == []
    assert os.path.isdir(os.path.join(shm_root, "other-user", "n1"))
    assert os.path.getsize(str(tmp_path / "elsewhere" / "linked" / "n1" / "rank-0" / "slot-0.bin")) == MIB
