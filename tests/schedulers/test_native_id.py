"""A native id read back from a job file or a job record is checked before it reaches a command
(issue 24, finding 10): a job folder's ``native_id`` holding ``--me`` must never make cancel run
``scancel --me`` (sbatch(1)/scancel(1): ``--me`` "Restrict the scancel operation to jobs owned by
the current user": every job of the user).

Real parts: the dev cluster's Slurm (sbatch, squeue, scancel on this host, reached through
``LocalRemote``) and real processes for the local backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hyperpod_lab.errors import JobStateError
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.schedulers.slurm import SlurmScheduler
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord, JobStatus

BAD_IDS = ["--me", "--name=x", "-u root", "123 --me", "123,456", "0x10", "", "12_3", "123\n--me", "../1"]


def _rec(job_dir: str, native_id: str, orchestrator: str = "slurm", job_id: str = "nid-test-1") -> JobRecord:
    return JobRecord(job_id=job_id, name="nid-test", cluster="t", orchestrator=orchestrator, native_id=native_id,
                     job_dir=job_dir, spec={"nodes": 1, "procs_per_node": 1})


def _slurm(tmp_path) -> SlurmScheduler:
    return SlurmScheduler(ClusterProfile(name="t", orchestrator="slurm", shared_root=str(tmp_path)), LocalRemote())


VICTIM = f"nid-victim-{os.getpid()}"
#: an option in place of a job id; ``--me`` is the finding's, but on the shared dev cluster a
#: regression must not cancel other tests' jobs, so the test plants ``--name=<the victim's name>``,
#: which cancels the victim alone when it reaches scancel (scancel(1): "-n, --name=job_name
#: Restrict the scancel operation to jobs with this job name")
PLANTED = f"--name={VICTIM}"


@pytest.fixture
def victim(dev_cluster):
    """A real job of this user that the planted option would cancel."""
    out = subprocess.run(["sbatch", "--parsable", f"--job-name={VICTIM}", "-p", "dev", "--output=/dev/null", "--wrap", "sleep 300"],
                         capture_output=True, text=True, check=True).stdout.strip()
    jid = out.split(";")[0]
    yield jid
    subprocess.run(["scancel", jid], capture_output=True)


def _alive(jid: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%T", "-j", jid], capture_output=True, text=True).stdout.strip()
    return out in ("PENDING", "RUNNING", "CONFIGURING")


def test_native_id_file_holding_an_option_is_refused_and_cancels_nothing(victim, tmp_path):
    sched = _slurm(tmp_path)
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    with open(JobPaths(job_dir).native_id, "w") as f:
        f.write(PLANTED + "\n")
    rec = _rec(job_dir, "")
    with pytest.raises(JobStateError) as e:
        sched.find_native_id(rec)
    msg = str(e.value)
    assert "native_id" in msg and repr(PLANTED) in msg and "digits" in msg and "remove it" in msg
    assert rec.native_id == ""  # the record is left as it was

    # a record that holds it anyway (an older store, a hand edit) is never passed to scancel
    rec.native_id = PLANTED
    with pytest.raises(JobStateError, match="not a slurm job id"):
        sched.cancel(rec)
    time.sleep(1)
    assert _alive(victim), "scancel ran with the planted option: the user's other job was cancelled"
    # nor to squeue/sacct: the poll says why, for this job alone, and the others are polled
    good = _rec(job_dir, victim, job_id="nid-test-2")
    states = sched.poll([rec, good])
    assert states["nid-test-1"][0] == JobStatus.UNKNOWN and repr(PLANTED) in states["nid-test-1"][2]
    assert states["nid-test-2"][0] in (JobStatus.PENDING, JobStatus.RUNNING)
    with pytest.raises(JobStateError):
        sched.log_range(rec)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_every_malformed_slurm_id_is_refused(bad, tmp_path):
    sched = _slurm(tmp_path)
    with pytest.raises(JobStateError):
        sched.native_id(bad, "x")
    assert sched.native_id(" 4711\n", "x") == "4711"


def test_good_native_id_file_is_read(tmp_path):
    sched = _slurm(tmp_path)
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    with open(JobPaths(job_dir).native_id, "w") as f:
        f.write("4711\n")
    assert sched.find_native_id(_rec(job_dir, "")) == "4711"


def test_local_backend_refuses_a_record_whose_pid_is_not_digits(tmp_path):
    """Local backend: the native id is a pid; ``-1`` given to ``kill`` is every process the user may
    signal, ``--me`` crashed the whole poll (``int()``)."""
    sched = LocalScheduler(ClusterProfile(name="t", orchestrator="local", shared_root=str(tmp_path)), LocalRemote())
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        bad, good = _rec(job_dir, "-1", "local", "l-1"), _rec(job_dir, str(sleeper.pid), "local", "l-2")
        states = sched.poll([bad, good, _rec(job_dir, "--me", "local", "l-3")])
        assert states["l-1"][0] == JobStatus.UNKNOWN and "'-1'" in states["l-1"][2]
        assert states["l-3"][0] == JobStatus.UNKNOWN
        assert states["l-2"][0] == JobStatus.RUNNING
        with pytest.raises(JobStateError, match="process id"):
            sched.cancel(bad)
        assert sleeper.poll() is None
        assert not os.path.exists(JobPaths(job_dir).cancelled)  # refused before anything was written
    finally:
        sleeper.kill()
        sleeper.wait()
    json.dumps(states, default=str)
