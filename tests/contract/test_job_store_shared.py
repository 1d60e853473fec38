"""Two servers (or a server and a CLI) on one data directory: the job store (issue 24 #15).

Real SQLite databases, two ``JobStore`` objects on one directory as two processes would hold
them (each with its own connection). A job one of them recorded as finished never goes back to
running through the other's stale copy, and a store on a network file system (where SQLite's
WAL is unsafe) is warned about once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os

import pytest

from hyperpod_lab.submit import jobs
from hyperpod_lab.submit.jobs import JobRecord, JobStatus, JobStore


def _rec(job_id: str = "train-1") -> JobRecord:
    return JobRecord(job_id=job_id, name="train", cluster="c", orchestrator="local", native_id="", job_dir="/x",
                     spec={}, status=JobStatus.RUNNING.value)


@pytest.mark.parametrize("final", [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_put_of_a_stale_copy_never_reverts_a_terminal_state(tmp_path, final):
    a, b = JobStore(str(tmp_path)), JobStore(str(tmp_path))
    a.put(_rec())
    stale = a.get("train-1")  # server A's copy: running
    b.update_status(b.get("train-1"), final, exit_code=0 if final == JobStatus.COMPLETED else 1, reason="done")
    stale.native_id = "4242"  # A adopts the scheduler id, and writes its copy back
    assert a.put(stale) is False
    assert b.get("train-1").status == final.value
    assert a.get("train-1").status == final.value
    assert stale.status == final.value and stale.reason == "done"  # the caller's copy now says so too
    again = b.get("train-1")  # a write with the same terminal status still goes through
    again.reason = "done, with a note"
    assert b.put(again) is True and a.get("train-1").reason == "done, with a note"


def _put_running(root: str, n: int) -> None:
    store = JobStore(root)
    rec = store.get("train-1")
    rec.status = JobStatus.RUNNING.value
    for _ in range(n):
        store.put(rec)


def test_terminal_state_survives_a_racing_writer_process(tmp_path):
    """Another process keeps writing its 'running' copy while this one finishes the job."""
    root = str(tmp_path)
    store = JobStore(root)
    store.put(_rec())
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_put_running, args=(root, 300))
    p.start()
    store.update_status(store.get("train-1"), JobStatus.COMPLETED, exit_code=0)
    p.join(60)
    assert p.exitcode == 0
    assert JobStore(root).get("train-1").status == "completed"


def test_network_fs_warned_once(tmp_path, monkeypatch, caplog):
    """A store on NFS logs one warning naming the file system type; a local one none. The mount
    table is a file in /proc/mounts' format written here (a fake: no NFS server can run in a test)."""
    nfs_dir, local_dir = tmp_path / "nfs" / "home", tmp_path / "local"
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / rootfs rw 0 0\n"
                      f"server:/export {tmp_path / 'nfs'} nfs4 rw,relatime,vers=4.2 0 0\n"
                      f"tmpfs {local_dir} tmpfs rw 0 0\n")
    monkeypatch.setattr(jobs, "MOUNTS_FILE", str(mounts))
    monkeypatch.setattr(jobs, "_WARNED", set())
    assert jobs.network_fs_type(str(nfs_dir / "jobs"), str(mounts)) == "nfs4"
    assert jobs.network_fs_type(str(local_dir), str(mounts)) is None
    with caplog.at_level(logging.WARNING, logger="hyperpod_lab.submit.jobs"):
        for _ in range(2):
            JobStore(str(nfs_dir / "jobs")).list()
        JobStore(str(local_dir / "jobs")).list()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "nfs4" in warned[0] and "WAL" in warned[0] and os.path.join(str(nfs_dir), "jobs") in warned[0]


def test_fs_type_reads_escaped_mount_points(tmp_path):
    d = tmp_path / "with space"
    d.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text("/ / ext4 rw 0 0\n" + f"srv:/e {str(d).replace(' ', chr(92) + '040')} lustre rw 0 0\n")
    assert jobs.fs_type(str(d / "jobs"), str(mounts)) == "lustre"
    assert jobs.fs_type(str(tmp_path), str(mounts)) == "ext4"
