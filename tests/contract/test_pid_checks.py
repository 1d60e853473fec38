"""Fault injection and cancel signal only the job's own processes (issue 13, finding 7).

Reproduced on the code before the fix: ``POST .../faults`` SIGKILLed whatever pid
``ranks/rank-N.json`` named (a reused pid, an unrelated process), pid 0 or -1 was not refused,
and the local backend's cancel SIGTERMed every process group ``joins.json`` named. Here the
files name real unrelated processes (``sleep``), which must survive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hyperpod_lab import procs
from hyperpod_lab.errors import JobStateError
from hyperpod_lab.jobdir import ENV_JOB_ID, JobPaths
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = "victim-20261123-000000-00000000000000aa"


def _sleeper(job_id: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != ENV_JOB_ID}
    if job_id:
        env[ENV_JOB_ID] = job_id
    p = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    # Popen returns once the child called execve (vfork), but the kernel sets the new image's
    # environment address after that: /proc/<pid>/environ can read empty for a moment (a loaded
    # fresh-clone run saw "belongs to no hyperpod-lab job"). Wait until the new image is complete.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if f.read():
                    break
        except OSError:
            pass
        time.sleep(0.01)
    return p


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


@pytest.fixture
def sleepers():
    made = []

    def make(job_id=None):
        made.append(_sleeper(job_id))
        return made[-1]

    yield make
    for p in made:
        if p.poll() is None:
            p.kill()
            p.wait()


def _job(tmp_path, ranks: dict[int, dict], joins: list | None = None, native_id: str = "999999"):
    paths = JobPaths(str(tmp_path / JOB))
    os.makedirs(paths.ranks)
    for r, info in ranks.items():
        with open(paths.rank_file(r), "w") as f:
            json.dump({"rank": r, "node": "localhost", **info}, f)
    if joins is not None:
        with open(paths.joins, "w") as f:
            json.dump(joins, f)
    rec = JobRecord(job_id=JOB, name="victim", cluster="local", orchestrator="local", native_id=native_id,
                    job_dir=paths.folder, spec=JobSpec(script="x.py").to_dict(), status="running")
    return LocalScheduler(ClusterProfile(name="local", orchestrator="local", shared_root=str(tmp_path)), LocalRemote()), rec


@pytest.mark.parametrize("pid", [0, -1, 1, "-1", "", None, True, "12 13", 3.5])
def test_pids_that_name_groups_init_or_nothing_are_refused(pid):
    with pytest.raises(JobStateError):
        procs.verify(pid, JOB)


def test_inject_fault_refuses_an_unrelated_process(tmp_path, sleepers):
    other = sleepers()
    sched, rec = _job(tmp_path, {1: {"pid": other.pid}})
    with pytest.raises(JobStateError, match="belongs to no hyperpod-lab job"):
        sched.inject_fault(rec, 1)
    time.sleep(0.2)
    assert _alive(other)


def test_inject_fault_refuses_a_process_of_another_job(tmp_path, sleepers):
    other = sleepers("another-job")
    sched, rec = _job(tmp_path, {1: {"pid": other.pid}})
    with pytest.raises(JobStateError, match="belongs to job another-job"):
        sched.inject_fault(rec, 1)
    assert _alive(other)


def test_inject_fault_refuses_pid_zero_and_minus_one(tmp_path):
    """kill(0) / kill(-1) would hit this process's group / every process of the user: run in a
    child of its own session so that a regression kills the child, not the test run."""
    code = (
        "import sys; sys.path[:0] = %r\n"
        "from test_pid_checks import _job\n"
        "import pathlib, tempfile\n"
        "from hyperpod_lab.errors import JobStateError\n"
        "for pid in (0, -1):\n"
        "    sched, rec = _job(pathlib.Path(tempfile.mkdtemp()), {1: {'pid': pid}})\n"
        "    try:\n"
        "        sched.inject_fault(rec, 1)\n"
        "    except JobStateError as e:\n"
        "        print('refused', pid, e)\n"
    ) % [os.path.join(ROOT, "tests", "contract"), os.path.join(ROOT, "tests")]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       start_new_session=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused 0" in p.stdout and "refused -1" in p.stdout


def test_a_reused_pid_inside_the_job_is_refused_by_its_start_time(tmp_path, sleepers):
    mine = sleepers(JOB)
    start = procs.process_start(mine.pid)
    sched, rec = _job(tmp_path, {1: {"pid": mine.pid, "proc_start": start + 1}})
    with pytest.raises(JobStateError, match="pid was reused"):
        sched.inject_fault(rec, 1)
    assert _alive(mine)
    sched, rec = _job(tmp_path / "again", {1: {"pid": mine.pid, "proc_start": start}})
    sched.inject_fault(rec, 1)
    assert mine.wait(timeout=10) == -signal.SIGKILL


def test_local_cancel_signals_the_job_but_not_what_joins_json_wrongly_names(tmp_path, sleepers):
    launcher, joined, stranger = sleepers(JOB), sleepers(JOB), sleepers()
    sched, rec = _job(tmp_path, {}, joins=[{"native_id": f"{joined.pid},{stranger.pid}", "offset": 2, "nodes": 2}],
                      native_id=str(launcher.pid))
    with pytest.raises(JobStateError, match=f"process {stranger.pid} belongs to no hyperpod-lab job"):
        sched.cancel(rec)
    assert launcher.wait(timeout=10) == -signal.SIGTERM and joined.wait(timeout=10) == -signal.SIGTERM
    assert _alive(stranger)


def test_procs_command_line_exit_status():
    """What ``srun ... python -m hyperpod_lab.procs`` reports to the Slurm backend."""
    other = _sleeper()
    try:
        res = subprocess.run([sys.executable, "-m", "hyperpod_lab.procs", "--job-id", JOB, "--pid", str(other.pid)],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == procs.REFUSED_EXIT and "refusing" in res.stderr
        assert _alive(other)
    finally:
        other.kill()
        other.wait()


def test_slurm_inject_fault_checks_the_pid_on_the_rank_node(dev_cluster, client, sleepers):
    """Dev cluster: the check runs beside the process (``srun --overlap`` on the rank's node):
    a rank file naming an unrelated process is refused and the process lives; the real rank is
    then killed and the job reports the fault."""
    script = os.path.join(ROOT, "tests", "scripts", "steps.py")
    rec = client.submit(JobSpec.from_dict({"script": script, "cluster": "local-slurm", "name": "pidcheck", "nodes": 2,
                                           "args": ["--steps", "600", "--sleep", "0.2"]}))
    try:
        path = JobPaths(rec.job_dir).rank_file(1)
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            assert time.monotonic() < deadline, client.logs(rec.job_id)[-3000:]
            time.sleep(0.5)
        real = open(path).read()
        stranger = sleepers()
        with open(path, "w") as f:
            json.dump({**json.loads(real), "pid": stranger.pid}, f)
        with pytest.raises(JobStateError, match="belongs to no hyperpod-lab job"):
            client.inject_fault(rec.job_id, 1)
        assert _alive(stranger)
        with open(path, "w") as f:
            f.write(real)
        info = client.inject_fault(rec.job_id, 1)
        assert info["pid"] == json.loads(real)["pid"]
    finally:
        client.cancel(rec.job_id)
