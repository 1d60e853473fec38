"""Node failures the way Slurm produces them, on the real 3-node dev cluster (issue 14).

A node is lost when Slurm itself marks it DOWN (``scontrol update NodeName=n2 State=DOWN``, as an
operator or slurmctld's health program does): slurmctld then kills every step that touches it
("Killing JobId=.. StepId=.. due to failed node n2" in its log) and, under ``sbatch --no-kill``,
removes the node from the job instead of ending it. What the job does next is the supervisor's
(hyperpod_lab.node.supervisor): checkpointless survivors go on, a spare joins, a restart job
resumes on a spare from the peer tier, a node that faulted twice is excluded, and a node that
fails its pre-flight health check (a real 1 MiB /dev/shm or a read-only shared storage, mounted in
that node's own mount namespace) is caught before step 0.

The dev cluster's ReturnToService=2 returns a DOWN node to service as soon as its slurmd answers;
the tests still RESUME it in a ``finally`` in case it stays down.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import time

import pytest
from agents import assert_global_sample_order
from slurm_jobs import Follow, scontrol

from hyperpod_lab import cli, devcluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FT = os.path.join(REPO, "tests", "scripts", "ft_train.py")
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")


@pytest.fixture
def n2_back():
    """Make sure n2 is back in service after the test (it is marked DOWN on purpose)."""
    yield "n2"
    scontrol("update", "NodeName=n2", "State=RESUME")  # "Invalid node state transition" when it is already up


@pytest.fixture
def cluster3(dev_cluster):
    status = devcluster.status()
    assert set(status["nodes"]) >= {"n1", "n2", "n3"}, (
        f"these tests need the 3-node dev cluster ('hyperpod-lab dev-cluster up --nodes 3'): {status['nodes']}")
    return dev_cluster


def mark_down(node: str) -> float:
    """Slurm marks ``node`` DOWN (an admin's ``scontrol update``); returns the time it did."""
    t = time.time()
    out = scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=hyperpod-lab test: node lost")
    assert out.returncode == 0, out.stderr
    return t


def slurm_job(native_id: str) -> str:
    out = scontrol("show", "job", "-o", native_id)
    assert out.returncode == 0, out.stderr
    return out.stdout


def restarts(native_id: str) -> int:
    """How often Slurm requeued the job (``Restarts=`` of ``scontrol show job``)."""
    return int(re.search(r"Restarts=(\d+)", slurm_job(native_id)).group(1))


def sacct_state(native_id: str) -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", native_id, "-o", "State"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def submit(client, script: str, *opts: str, steps: int, sleep: float, script_args: list[str] = ()) -> str:
    return cli.run(["submit", script, "--cluster", "local-slurm", "--procs-per-node", "1", *opts,
                    "--env", "RUST_LOG=warn", "--", "--steps", str(steps), "--step-sleep", str(sleep), *script_args],
                   client=client)


def running_ft_job(client, name: str, *opts: str, steps: int, at_step: int = 15, script_args: list[str] = ()) -> Follow:
    """ft_train.py on 2 nodes with checkpointless recovery (``opts`` added after ``--nodes 2``),
    ``steps`` steps 0.2 s apart, named ``name``; followed until it reached step ``at_step``."""
    job = Follow(client, submit(client, FT, "--nodes", "2", *opts, "--recovery", "checkpointless", "--name", name,
                                steps=steps, sleep=0.2, script_args=script_args))
    job.until(lambda: job.step() >= at_step, f"step {at_step}", timeout=600)
    return job


def finish(client, job: Follow, steps: int) -> None:
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)
    rec = client.wait(job.job_id, timeout_s=120)
    assert rec.status == "completed", client.logs(job.job_id)[-3000:]
    assert job.kinds("finished")[-1].data["steps"] == steps
    deadline = time.monotonic() + 60
    while sacct_state(rec.native_id) != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sacct_state(rec.native_id) == "COMPLETED", slurm_job(rec.native_id)


def test_checkpointless_survivors_go_on_when_slurm_marks_a_node_down(cluster3, client, n2_back):
    """Must show: a checkpointless 2-node job whose n2 Slurm marks DOWN keeps making steps on n1
    within 5 s and ends COMPLETED."""
    steps = 150
    job = running_ft_job(client, "down-ft", "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", steps=steps)
    job_id = job.job_id
    t_down = mark_down("n2")
    job.until(lambda: [e for e in job.kinds("fault.detected", reason="node down") if e.data["node"] == "n2"],
              "the supervisor's node-down report")
    fault = job.kinds("fault.detected", reason="node down")[0]
    assert fault.writer == "supervisor" and fault.data["replica_group"] == 1 and fault.data["rank"] == [1]
    before = max(e.data["step"] for e in job.kinds("step") if e.time <= t_down)
    job.until(lambda: [e for e in job.kinds("step") if e.time > t_down and e.data["step"] > before + 1],
              "steps on n1 after n2 went down", timeout=30)
    first = min(e.time for e in job.kinds("step") if e.time > t_down and e.data["step"] > before + 1)
    assert first - t_down <= 5.0, f"n1 made its next step {first - t_down:.2f} s after n2 went down"
    assert [e for e in job.kinds("elastic.scaled") if e.data["new_replicas"] == 1]
    finish(client, job, steps)
    assert restarts(client.get(job_id).native_id) == 0  # no requeue


def test_a_spare_node_takes_over_a_lost_replica_group(cluster3, client, n2_back):
    """Must show: the same job with --spares 1 on the 3-node dev cluster is back to 2 replica
    groups without a requeue: the spare n3 joins as a new group and heals from n1's live state.

    The spare is hot (issue 26, item 2): its processes were started with the job and wait in
    ``hp.init()`` (interpreter up, torch imported, the script's model built); the supervisor's
    assignment file makes them join, so the spare's first step comes within 3 s of the node-down
    detection, with 0 bytes read from storage."""
    steps = 150
    job = running_ft_job(client, "spare-ft", "--spares", "1", "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                         steps=steps, script_args=["--record-samples"])
    job_id = job.job_id
    assert "hot spare on n3: started, waiting for a replica group" in client.logs(job_id)
    t_down = mark_down("n2")
    job.until(lambda: [e for e in job.kinds("checkpoint.restored", tier="replica") if e.time > t_down],
              "the spare healing from a live peer")
    healed = [e for e in job.kinds("checkpoint.restored", tier="replica") if e.time > t_down][0]
    assert healed.data["node"] == "n3" and healed.data["replica_group"] == 2, healed
    job.until(lambda: [e for e in job.kinds("elastic.scaled") if e.time > t_down and e.data["new_replicas"] == 2],
              "back to two replica groups")
    logs = client.logs(job_id)
    assert "spare node n3 joins as replica group 2 (hot spare" in logs, logs[-3000:]
    job.until(lambda: [e for e in job.kinds("fault.detected", reason="node down") if e.time > t_down],
              "the supervisor's node-down report")
    detected = min(e.time for e in job.kinds("fault.detected") if e.time > t_down)
    job.until(lambda: [e for e in job.kinds("step") if e.time > t_down and e.data.get("replicas") == 2],
              "a step with the spare")
    first = min(e.time for e in job.kinds("step") if e.time > t_down and e.data.get("replicas") == 2)
    print(f"hot spare: first step {first - detected:.2f} s after the node-down detection "
          f"(heal {healed.data['seconds']} s, {healed.data['bytes']} bytes)")
    assert first - detected <= 3.0, f"the spare's first step came {first - detected:.2f} s after the detection"
    finish(client, job, steps)
    assert restarts(client.get(job_id).native_id) == 0  # no requeue, no wait in the queue
    assert not [e for e in job.kinds("checkpoint.restored") if e.data["tier"] != "replica"]
    assert_global_sample_order(client.get(job_id).job_dir, steps)  # the spare went on with the exact order
    # issue 29: `hyperpod-lab events JOB` of a dev-cluster job (health checks, a node DOWN, a spare
    # joining) prints one readable line per event, none over 200 characters; --json the raw lines
    out = io.StringIO()
    cli.run(["events", job_id], out=out, client=client)
    lines = out.getvalue().splitlines()
    assert len(lines) >= len(job.events) and max(len(x) for x in lines) <= 200, max(lines, key=len)
    assert [x for x in lines if "health.checked" in x and "n3 passed" in x], lines[:10]
    out = io.StringIO()
    cli.run(["events", job_id, "--json"], out=out, client=client)
    assert max(len(x) for x in out.getvalue().splitlines()) > 200  # the raw health.checked lines


def test_a_restart_job_resumes_on_its_spare_from_the_peer_tier(cluster3, client, n2_back):
    """Must show: a checkpoint-restart job with --spares 1: node DOWN -> training resumes on the
    spare from the peer tier (the lost node's rank from its replica on n1), no requeue."""
    steps = 80
    job_id = submit(client, EXAMPLE, "--nodes", "2", "--spares", "1", "--checkpoint-memory-every", "2",
                    "--checkpoint-every", "1000", "--name", "spare-restart", steps=steps, sleep=0.1)
    job = Follow(client, job_id)
    job.until(lambda: [e for e in job.kinds("checkpoint.saved", tier="peer") if e.data["step"] >= 5],
              "a peer replica", timeout=600)
    t_down = mark_down("n2")
    job.until(lambda: [e for e in job.kinds("recovery.completed") if e.time > t_down], "recovery")
    restored = [e for e in job.kinds("checkpoint.restored") if e.time > t_down]
    assert {e.data["tier"] for e in restored} <= {"memory", "peer"} and "peer" in {e.data["tier"] for e in restored}
    assert {e.data["node"] for e in restored} == {"n1", "n3"}, restored
    down = [e for e in job.kinds("fault.detected", reason="node down") if e.data["node"] == "n2"]
    assert down and down[0].writer == "supervisor" and down[0].data["rank"], job.kinds("fault.detected")
    rec = [e for e in job.kinds("recovery.completed") if e.time > t_down][0]
    assert 0 < rec.data["downtime_s"] < 120, rec
    assert "resuming on n1,n3 without a requeue" in client.logs(job_id)
    finish(client, job, steps)
    assert restarts(client.get(job_id).native_id) == 0
    assert not [e for e in job.kinds("checkpoint.restored") if e.data["tier"] in ("persistent", "s3")]


class NodeMount:
    """A mount in one dev node's own mount namespace (a real fault of that node only)."""

    def __init__(self, node: str):
        self.pid = devcluster.node_pid(node)
        self.undo: list[list[str]] = []

    def run(self, *argv: str, undo: list[str] | None = None) -> None:
        subprocess.run(["nsenter", "--mount", f"--target={self.pid}", *argv], check=True)
        if undo:
            self.undo.append(undo)

    def close(self) -> None:
        for argv in reversed(self.undo):
            subprocess.run(["nsenter", "--mount", f"--target={self.pid}", *argv], check=False)


def test_a_node_with_too_little_shm_is_caught_before_step_0(cluster3, client):
    """Must show: n2's /dev/shm is a 1 MiB tmpfs (the memory tier needs 64 MiB at least): the
    pre-flight check fails it before any training step, naming the node and the check; with no
    spare the job fails fast with the reason."""
    m = NodeMount("n2")
    m.run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm", undo=["umount", "/dev/shm"])
    try:
        job_id = submit(client, FT, "--nodes", "2", "--recovery", "checkpointless", "--name", "hc-shm",
                        steps=20, sleep=0.0)
        rec = client.wait(job_id, timeout_s=300)
    finally:
        m.close()
    job = Follow(client, job_id)
    job.until(lambda: job.kinds("health.failed"), "health.failed")
    failed = job.kinds("health.failed")
    assert [(e.data["node"], e.data["check"]) for e in failed] == [("n2", "shm")], failed
    assert "MiB" in failed[0].data["detail"]
    assert not job.kinds("step") and not job.kinds("started")  # caught before step 0
    assert rec.status == "failed"
    log = client.logs(job_id)
    assert "health check failed on n2: shm" in log and "job failed before training" in log, log[-2000:]
    assert job.kinds("node.excluded")[0].data["node"] == "n2"


def test_a_node_with_read_only_shared_storage_is_replaced_by_a_spare(cluster3, client):
    """Must show: shared storage unwritable on n2 (a read-only bind mount in n2's namespace): the
    check fails n2 before step 0; with --spares 1 it is excluded and the job trains on n1 and n3."""
    shared = dev_cluster_root()
    m = NodeMount("n2")
    m.run("mount", "--bind", shared, shared, undo=["umount", shared])
    m.run("mount", "-o", "remount,bind,ro", shared)
    try:
        steps = 20
        job_id = submit(client, FT, "--nodes", "2", "--spares", "1", "--recovery", "checkpointless",
                        "--name", "hc-ro", steps=steps, sleep=0.0)
        job = Follow(client, job_id)
        job.until(lambda: job.kinds("finished"), "finished", timeout=400)
    finally:
        m.close()
    failed = job.kinds("health.failed")
    # n2 cannot write its own health.* events either (read-only storage): the supervisor's
    # exclusion names it, with the check, and the log has the node's detail
    excluded = job.kinds("node.excluded")
    assert [e.data["node"] for e in excluded] == ["n2"] and "storage" in excluded[0].data["reason"], excluded
    assert all(e.data["node"] != "n2" for e in failed)
    log = client.logs(job_id)
    assert re.search(r"health check failed on n2: (storage|run)", log), log[-2000:]
    assert {e.data["node"] for e in job.kinds("checkpoint.saved", tier="memory")} == {"n1", "n3"}
    finish(client, job, steps)


def dev_cluster_root() -> str:
    return os.path.join(devcluster.base_dir(), "fsx")


def test_a_node_that_faults_twice_is_excluded_and_replaced(cluster3, client):
    """Must show: a node that faults twice is excluded (node.excluded) and the job's next
    placement avoids it: rank 1's process on n2 is killed twice; the second time n2 is excluded,
    its group is stopped and the spare n3 takes its place."""
    steps = 200
    job = running_ft_job(client, "twice", "--spares", "1", steps=steps, at_step=10)
    job_id = job.job_id
    for n in (1, 2):
        t = time.time()
        info = client.inject_fault(job_id, 1)
        assert info["node"] == "n2"
        if n == 1:
            job.until(lambda: [e for e in job.kinds("checkpoint.restored", tier="replica", replica_group=1)
                               if e.time > t], "rank 1 healing on n2")
            assert not job.kinds("node.excluded")
    job.until(lambda: job.kinds("node.excluded"), "n2 excluded")
    ex = job.kinds("node.excluded")[0].data
    assert ex["node"] == "n2" and ex["faults"] == 2 and ex["excluded"] == ["n2"], ex
    job.until(lambda: job.kinds("checkpoint.restored", tier="replica", replica_group=2), "the spare healing")
    assert job.kinds("checkpoint.restored", tier="replica", replica_group=2)[0].data["node"] == "n3"
    finish(client, job, steps)
    t_ex = job.kinds("node.excluded")[0].time
    late = [e for e in job.events if e.time > t_ex + 5 and e.data.get("node") == "n2"]
    assert not late, late  # nothing ran on n2 after its exclusion
