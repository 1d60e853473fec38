"""``inject-fault --kind kill|node|exception`` (issue 14, item 5), with real parts:

* local backend, ``--kind exception`` into a running 2-process job: rank 1 raises
  ``InjectedFault`` inside ``ctx.step``, ``fault.detected`` names it, torchrun restarts the workers
  and the job completes; the request file is consumed (no second fault after the restart);
* local backend, ``--kind node``: the clear error (no nodes here);
* the runtime's step hook on a request the local backend wrote: one look per 0.5 s at most, the
  request consumed, a link in its place never followed;
* a bad kind: the clear error from the CLI (parser and exit status), the ``%hyperpod`` magic, the
  client and the REST route (a real jupyter-server);
* the dev cluster (real Slurm): ``--kind node --rank 1`` of a 2-node job sets the rank's node DOWN
  through scontrol over SSH (slurmctld logs it) and the job's processes on that node end; the node
  is resumed and the job cancelled whatever happens.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
from slurm_jobs import Follow

from hyperpod_lab import cli
from hyperpod_lab.errors import HyperPodLabError, JobStateError, SpecError
from hyperpod_lab.jobdir import JobPaths
from hyperpod_lab.schedulers.slurm import scontrol_refused
from hyperpod_lab.submit.jobs import JobStatus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = os.path.join(REPO, "tests", "scripts", "steps.py")
SLURMCTLD_LOG = "/var/tmp/hyperpod-lab-dev/log/slurmctld.log"
KINDS = "kill, node, exception, hang, slow"


def test_exception_kind_raises_in_the_rank_and_the_job_recovers(client):
    job_id = cli.run(["submit", STEPS, "--cluster", "local", "--procs-per-node", "2", "--name", "inject-exc",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--", "--steps", "40", "--sleep", "0.1"], client=client)
    job = Follow(client, job_id)
    job.until(lambda: any(e.data["step"] >= 3 for e in job.kinds("step")), "step 3")

    # the local backend has no nodes: a clear error, and nothing happens to the job
    with pytest.raises(JobStateError, match="the local backend has no nodes; use --kind kill or exception"):
        cli.run(["inject-fault", job_id, "--rank", "1", "--kind", "node"], client=client)
    # a rank outside the job's world is refused before anything is written
    with pytest.raises(SpecError, match=r"has ranks 0\.\.1; got 2"):
        client.inject_fault(job_id, 2, kind="exception")

    t0 = time.time()
    info = client.inject_fault(job_id, 1, kind="exception")
    assert info["kind"] == "exception" and info["rank"] == 1 and info["path"] == JobPaths(
        client.get(job_id).job_dir).fault_request(1)
    assert info["pid"] and info["node"]
    job.until(lambda: [e for e in job.kinds("fault.detected") if e.time >= t0], "fault.detected")
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)

    faults = [e for e in job.kinds("fault.detected") if e.time >= t0]
    injected = [e for e in faults if "InjectedFault" in (e.data.get("reason") or "")]
    assert len(injected) == 1, [e.data for e in faults]  # consumed: the restarted rank 1 does not raise again
    fault = injected[0].data
    assert fault["rank"] == 1 and fault["root_cause"] and info["nonce"] in fault["reason"], fault
    assert "exception injected into rank 1 of job " + job_id in fault["reason"]
    assert job.kinds("recovery.completed") and job.kinds("recovery.completed")[-1].data["restart_count"] >= 1
    assert job.kinds("finished")[-1].data["status"] == "succeeded"
    assert not os.path.exists(info["path"])
    assert client.wait(job_id, timeout_s=60).state == JobStatus.COMPLETED, client.logs(job_id)[-3000:]


def test_the_step_hook_raises_once_looks_at_most_every_half_second_and_follows_no_link(tmp_path):
    """The request written by a real scheduler (the local backend's file access) into a job
    directory; a one-rank JobContext (no process group) steps over it."""
    from hyperpod_lab.runtime.context import FAULT_CHECK_INTERVAL_S, InjectedFault, JobContext
    from hyperpod_lab.schedulers.local import LocalScheduler
    from hyperpod_lab.schedulers.remote import LocalRemote
    from hyperpod_lab.spec import JobSpec
    from hyperpod_lab.submit.clusters import ClusterProfile
    from hyperpod_lab.submit.jobs import JobRecord

    paths = JobPaths.for_job(str(tmp_path), "hook-job")
    os.makedirs(paths.events)
    sched = LocalScheduler(ClusterProfile(name="local", orchestrator="local", shared_root=str(tmp_path)), LocalRemote())
    rec = JobRecord(job_id="hook-job", name="hook", cluster="local", orchestrator="local", native_id="1",
                    job_dir=paths.folder, spec=JobSpec(script="x.py").to_dict(), status="running")
    ctx = JobContext(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0, nodes=1, node="test",
                     job_id="hook-job", job_dir=paths.folder, spec=None, restart_count=0, is_restart=False,
                     owns_default_group=False, cpu_group=None, step_interval_s=1.0)
    ctx.step(0, 1.0)  # nothing requested: the first step looks and finds nothing
    info = sched.inject_fault(rec, 0, "exception")
    assert info["kind"] == "exception" and "pid" not in info  # rank 0 wrote no rank file: it raises when it steps
    assert oct(os.stat(paths.faults).st_mode & 0o777) == "0o700" and oct(os.stat(info["path"]).st_mode & 0o777) == "0o600"
    ctx.step(1, 1.0)  # within FAULT_CHECK_INTERVAL_S of the last look: no look
    assert os.path.exists(info["path"])
    time.sleep(FAULT_CHECK_INTERVAL_S + 0.05)
    with pytest.raises(InjectedFault, match=f"exception injected into rank 0 of job hook-job .*nonce {info['nonce']}"):
        ctx.step(2, 1.0)
    assert not os.path.exists(info["path"])  # consumed: a restarted worker does not raise again
    time.sleep(FAULT_CHECK_INTERVAL_S + 0.05)
    ctx.step(3, 1.0)
    # a link in place of the request is never followed (nor raised on)
    target = tmp_path / "elsewhere.json"
    target.write_text('{"kind": "exception", "message": "through a link"}')
    os.symlink(target, paths.fault_request(0))
    time.sleep(FAULT_CHECK_INTERVAL_S + 0.05)
    ctx.step(4, 1.0)
    # a rank outside the job's world (1 node x 1 process) is refused
    with pytest.raises(SpecError, match=r"job hook-job has ranks 0\.\.0; got 1"):
        sched.inject_fault(rec, 1, "exception")


def test_a_bad_kind_is_refused_by_the_cli_the_magic_and_the_client(client, capsys, ipython):
    with pytest.raises(SpecError, match="argument --kind: invalid choice: 'bogus'.*'kill', 'node', 'exception'"):
        cli.run(["inject-fault", "any-job", "--rank", "0", "--kind", "bogus"], client=client)
    p = subprocess.run([sys.executable, "-m", "hyperpod_lab.cli", "inject-fault", "any-job", "--rank", "0",
                        "--kind", "reboot"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "invalid choice: 'reboot'" in p.stderr and "'exception'" in p.stderr, p.stderr
    # the %hyperpod magic (a real IPython shell) prints the same error
    shell = ipython
    capsys.readouterr()
    assert shell.run_line_magic("hyperpod", "inject-fault any-job --rank 0 --kind bogus") is None
    assert "error: arguments: argument --kind: invalid choice: 'bogus'" in capsys.readouterr().err
    # the kind is checked before the job is looked up
    with pytest.raises(SpecError, match=f"kind: must be one of {KINDS}, got 'bogus'"):
        client.inject_fault("no-such-job", 0, kind="bogus")


def test_a_bad_kind_is_refused_by_the_rest_route(tmp_path):
    from jupyter_server_proc import JupyterServer

    srv = JupyterServer(str(tmp_path / "root"), str(tmp_path))
    os.makedirs(srv.root_dir)
    srv.start()
    try:
        status, body = srv.call("POST", "/hyperpod/jobs/no-such-job/faults", {"rank": 0, "kind": "bogus"})
        assert status == 400 and body["error"]["field"] == "kind", body
        assert body["error"]["message"] == f"kind: must be one of {KINDS}, got 'bogus'"
        status, body = srv.call("POST", "/hyperpod/jobs/no-such-job/faults", {"rank": 0, "kind": 3})
        assert status == 400 and body["error"]["field"] == "kind", body
        # a valid kind gets as far as the job lookup
        status, body = srv.call("POST", "/hyperpod/jobs/no-such-job/faults", {"rank": 0, "kind": "exception"})
        assert status == 404, body
    finally:
        srv.stop()
    assert not srv.auth_warnings(), srv.auth_warnings()


def test_scontrol_refusals_are_told_apart_from_other_failures():
    # scontrol's own words (Slurm's error strings ESLURM_USER_ID_MISSING, ESLURM_ACCESS_DENIED)
    assert scontrol_refused("slurm_update error: Invalid user id")
    assert scontrol_refused("slurm_update error: Access/permission denied")
    assert not scontrol_refused("slurm_update error: Invalid node name specified")
    assert not scontrol_refused("Unable to contact slurm controller (connect failure)")


def _log_size() -> int:
    try:
        return os.path.getsize(SLURMCTLD_LOG)
    except OSError:
        return 0


def _log_since(offset: int) -> str:
    with open(SLURMCTLD_LOG, "rb") as f:
        if os.fstat(f.fileno()).st_size < offset:  # restarted with a fresh log
            offset = 0
        f.seek(offset)
        return f.read().decode(errors="replace")


def test_node_kind_sets_the_ranks_node_down_on_slurm(dev_cluster, client):
    from slurm_jobs import job_pids, scontrol

    job_id = cli.run(["submit", STEPS, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--name", "inject-node", "--", "--steps", "3000", "--sleep", "0.1"], client=client)
    rec, node = client.get(job_id), None
    try:
        job = Follow(client, job_id)
        sched = client.scheduler("local-slurm")

        def rank1_stepping():
            try:
                sched.rank_info(client.get(job_id), 1)
            except JobStateError:
                return False
            return any(e.data["step"] >= 3 for e in job.kinds("step"))

        job.until(rank1_stepping, "rank 1 started and step 3", timeout=400)
        rec = client.get(job_id)
        node = sched.rank_info(rec, 1)["node"]
        assert job_pids(rec.native_id, node), f"no process of Slurm job {rec.native_id} on {node}"
        log_at = _log_size()
        out = io.StringIO()
        cli.run(["inject-fault", job_id, "--rank", "1", "--kind", "node"], out=out, client=client)
        assert out.getvalue().startswith(f"failed node {node} of rank 1 of {job_id}: scontrol update "
                                         f"NodeName={node} State=DOWN"), out.getvalue()
        # what the scheduler did, as slurmctld saw it
        deadline = time.monotonic() + 30
        while f"update_node: node {node} state set to DOWN" not in _log_since(log_at):
            assert time.monotonic() < deadline, _log_since(log_at)[-3000:]
            time.sleep(0.3)
        assert f"update_node: node {node} reason set to: hyperpod-lab inject-fault {job_id}" in _log_since(log_at)
        # the job's step on that node is killed
        deadline = time.monotonic() + 120
        while job_pids(rec.native_id, node):
            assert time.monotonic() < deadline, f"processes of {rec.native_id} still on {node}: " \
                                                f"{job_pids(rec.native_id, node)}"
            time.sleep(0.5)
    finally:
        if node:
            # the dev cluster's ReturnToService=2 returns a node whose slurmd answers at once; then
            # RESUME is refused ("Invalid node state specified": IDLE to RESUME), which is fine
            res = scontrol("update", f"NodeName={node}", "State=RESUME")
            assert res.returncode == 0 or "Invalid node state" in res.stderr, res.stderr
        try:
            client.cancel(job_id)
        except HyperPodLabError:
            pass
