"""Reads over SFTP never follow a symbolic link (issue 24, finding 14), as local reads do
(``O_NOFOLLOW``): a rank's log named by ``ranks/rank-R.json`` that is a link to a file outside the
job directory (another user's, a key) is refused, never returned.

Real parts: the dev cluster's sshd on loopback (``SSHRemote``), whose login node is this host, so
the files the test makes here are the files SFTP reads there.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote, SSHRemote
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord

SECRET = b"outside the job directory: never to be read\n"


@pytest.fixture
def job(tmp_path):
    """A job directory whose rank 0 names a log that is a link to a file outside it."""
    outside = tmp_path / "secret.txt"
    outside.write_bytes(SECRET)
    job_dir = tmp_path / "job"
    paths = JobPaths(str(job_dir))
    for d in ("ranks", "logs"):
        os.makedirs(paths.path(d))
    log = paths.path("logs", "rank-0.log")
    os.symlink(str(outside), log)
    good = paths.path("logs", "rank-1.log")
    with open(good, "wb") as f:
        f.write(b"hello from rank 1\n")
    for r, p in ((0, log), (1, good)):
        with open(paths.rank_file(r), "w") as f:
            json.dump({"rank": r, "node": "n1", "pid": 1, "log_file": p}, f)
    os.mkfifo(paths.path("logs", "fifo"))
    return str(job_dir), log, good


@pytest.mark.parametrize("kind", ["ssh", "local"])
def test_read_from_refuses_a_link(kind, job, dev_cluster):
    job_dir, log, good = job
    remote = SSHRemote(dev_cluster) if kind == "ssh" else LocalRemote()
    try:
        with pytest.raises(OSError) as e:
            remote.read_from(log)
        assert e.value.errno == errno.ELOOP
        assert remote.read_from(good, 6) == b"from rank 1\n"
        if kind == "ssh":
            # a FIFO is not opened (the SFTP server would block on it), a directory is not a file
            with pytest.raises(OSError) as e:
                remote.read_from(os.path.join(job_dir, "logs", "fifo"))
            assert e.value.errno == errno.EINVAL
            with pytest.raises(IsADirectoryError):
                remote.read_from(os.path.join(job_dir, "logs"))
            assert remote.exists(os.path.join(job_dir, "logs"))  # existence of a directory still answers

        # through the scheduler, as the Lab's log view reads it: refused, naming the file
        sched = LocalScheduler(ClusterProfile(name="t", orchestrator="local", shared_root="/tmp"), remote)
        rec = JobRecord(job_id="links-1", name="links", cluster="t", orchestrator="local", native_id="1",
                        job_dir=job_dir, spec={"nodes": 1, "procs_per_node": 2})
        with pytest.raises(HyperPodLabError) as e:
            sched.rank_log(rec, 0)
        assert "not a regular file" in str(e.value) and SECRET.decode().strip() not in str(e.value)
        assert sched.rank_log(rec, 1).text == "hello from rank 1\n"
    finally:
        remote.close()


def test_ssh_read_of_a_link_by_its_own_name(job, dev_cluster):
    """The bare seam: a link read by name returns nothing of its target (today's main returned it)."""
    _, log, _ = job
    remote = SSHRemote(dev_cluster)
    try:
        try:
            data = remote.read_from(log)
        except OSError:
            data = b""
        assert SECRET not in data
    finally:
        remote.close()
