"""Job ids and job records (issue 13, findings 8 and 10: collisions, a kill between the
scheduler's submit and the record).

Reproduced on the code before the fix: ids had 16 random bits plus a one-second time stamp
(about 8 % odds of a collision among 100 same-name submissions in one second); a collision
silently replaced the other job's record, a later failed submission's cleanup deleted the other
job's directory; and a client killed after ``sbatch`` returned but before the record was written
left a running job that no command knew.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hyperpod_lab.errors import DuplicateJob
from hyperpod_lab.schedulers.eks.manifest import resource_name
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.jobs import JobRecord, JobStore, new_job_id

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# self-contained (the backends stage the script file alone)
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "steps.py")


def test_ids_of_same_name_submissions_in_one_second_carry_64_random_bits():
    now = time.time()
    ids = [new_job_id("train", now=now) for _ in range(20000)]
    assert len(set(ids)) == len(ids)
    tails = {i.rsplit("-", 1)[1] for i in ids}
    assert all(re.fullmatch(r"[0-9a-f]{16}", t) for t in tails)  # 64 bits
    # every bit of the random part varies (none stuck)
    bits = 0
    for t in tails:
        bits |= int(t, 16)
    assert bits == (1 << 64) - 1


def test_kubernetes_names_keep_the_random_part_of_long_ids():
    ids = [new_job_id("a-very-long-experiment-name-for-the-big-run", now=0) for _ in range(1000)]
    names = {resource_name(i) for i in ids}
    assert len(names) == len(ids) and all(len(n) <= 53 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", n)
                                          for n in names)


def _record(job_id: str, job_dir: str, native_id: str = "7") -> JobRecord:
    return JobRecord(job_id=job_id, name="train", cluster="local", orchestrator="local", native_id=native_id,
                     job_dir=job_dir, spec={"script": "train.py"})


def test_store_refuses_a_duplicate_and_keeps_the_first_record(tmp_path):
    store = JobStore(str(tmp_path / "jobs"))
    first = _record("train-20261123-000000-0123456789abcdef", "/first")
    store.add(first)
    with pytest.raises(DuplicateJob, match="already taken"):
        store.add(_record(first.job_id, "/second", native_id="8"))
    kept = store.get(first.job_id)
    assert (kept.job_dir, kept.native_id) == ("/first", "7")


def test_a_colliding_submission_fails_without_touching_the_other_job(client, monkeypatch, tmp_path):
    """A submission whose fresh id is taken is refused before anything is staged: the other
    job's record and directory stay as they were."""
    import hyperpod_lab.submit.client as client_mod

    spec = JobSpec.from_dict({"script": SCRIPT, "cluster": "local", "name": "collide", "args": ["--steps", "1"]})
    first = client.submit(spec)
    client.wait(first.job_id, timeout_s=120)
    before = sorted(os.listdir(first.job_dir))
    monkeypatch.setattr(client_mod, "new_job_id", lambda name: first.job_id)
    with pytest.raises(DuplicateJob):
        client.submit(JobSpec.from_dict({"script": SCRIPT, "cluster": "local", "name": "collide"}))
    assert sorted(os.listdir(first.job_dir)) == before
    assert client.get(first.job_id).native_id == first.native_id


def test_a_failed_submission_leaves_no_record_and_no_directory(client, monkeypatch):
    from hyperpod_lab.schedulers.local import LocalScheduler

    def refuse(self, spec, job_id, script_bytes, secrets=None):
        self.stage(spec, job_id, script_bytes)
        raise RuntimeError("the scheduler refused the job")

    monkeypatch.setattr(LocalScheduler, "submit", refuse)
    with pytest.raises(RuntimeError):
        client.submit(JobSpec.from_dict({"script": SCRIPT, "cluster": "local", "name": "refused"}))
    assert [r for r in client.store.list() if r.name == "refused"] == []
    jobs_root = os.path.dirname(client.scheduler("local").job_dir("x"))  # the user's job tree
    assert not [d for d in os.listdir(jobs_root) if d.startswith("refused-")]


_KILLED_AFTER_SUBMIT = textwrap.dedent("""
    import os, signal, sys
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore
    from hyperpod_lab.spec import JobSpec

    store = JobStore(sys.argv[1])
    real_put = JobStore.put

    def die(self, rec):  # the update after the scheduler's submit: SIGKILL, as a crash would
        print(rec.job_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    JobStore.put = die
    Client(store).submit(JobSpec.from_dict({"script": sys.argv[2], "cluster": sys.argv[3], "name": "killed",
                                            "nodes": int(sys.argv[4]), "args": ["--steps", "3"]}))
""")


def _submit_and_die(store_root: str, cluster: str, nodes: int) -> str:
    p = subprocess.run([sys.executable, "-c", _KILLED_AFTER_SUBMIT, store_root, SCRIPT, cluster, str(nodes)],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    return p.stdout.split()[-1]


def test_a_client_killed_after_submit_leaves_a_record_that_finds_its_job(client, tmp_path):
    """Local backend: the submitter is SIGKILLed after the launcher started but before the
    record got its native id; the next refresh finds the job through the id the job wrote."""
    job_id = _submit_and_die(client.store.root, "local", 1)
    rec = client.get(job_id)
    assert rec.native_id == "" and rec.reason == "submitting"
    final = client.wait(job_id, timeout_s=120)
    assert final.native_id.isdigit() and final.status == "completed", final


def test_a_client_killed_after_sbatch_leaves_a_record_that_finds_its_slurm_job(dev_cluster, client):
    """Dev cluster: the submitter is SIGKILLed right after sbatch returned; the record is
    completed from squeue (the job's --comment) or from the id the batch script wrote."""
    job_id = _submit_and_die(client.store.root, "local-slurm", 2)
    rec = client.get(job_id)
    assert rec.native_id == ""
    final = client.wait(job_id, timeout_s=180)
    assert final.native_id.isdigit() and final.status == "completed", final
