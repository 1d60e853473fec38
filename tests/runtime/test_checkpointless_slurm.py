"""Checkpointless recovery, tiered checkpointing and elastic training together, on the real 2-node
dev cluster (Slurm over SSH): one replica group per node under the job's torchft Lighthouse.

0. rank 1 raises in its step (``inject-fault --kind exception``): an in-process restart, the step
   dropped in both groups and redone in the same processes;
1. rank 1's process is SIGKILLed (``inject-fault``): torchrun on n2 restarts it (the process
   level), it heals from n1's live state (tier ``replica``) while n1 goes on;
2. node n2's processes are all killed (agent and worker: the node is gone): n1 trains alone, the
   global batch kept by accumulation (``elastic.scaled`` 2 -> 1);
3. ``hyperpod-lab scale --add-nodes 1``: a second allocation joins the same Lighthouse as replica
   group 2 and heals from n1 (``elastic.scaled`` 1 -> 2);
4. the job completes (sacct COMPLETED) and nothing was ever read from storage.
"""

import os
import signal
import time

from slurm_jobs import Follow, scontrol, wait_pending, wait_until_gone

from hyperpod_lab import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "ft_train.py")
STEPS = 200


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("PPid:")))


def test_checkpointless_elastic_job_on_slurm(dev_cluster, client):
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--recovery", "checkpointless", "--elastic", "1:3", "--name", "ft-elastic",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                      "--", "--steps", str(STEPS), "--step-sleep", "0.3"], client=client)
    job = Follow(client, job_id)
    until, step, kinds = job.until, job.step, job.kinds

    # 0. an exception in rank 1's step (inject-fault --kind exception): an in-process restart. Every
    #    group drops that step and redoes it in the same processes (issue 26: the pid is the same,
    #    at most one step lost, job-wide downtime <= 2 x one step + 0.5 s)
    until(lambda: step() >= 5, "step 5", timeout=600)  # includes waiting in the queue
    slurm = client.scheduler("local-slurm")
    pid = slurm.rank_info(client.get(job_id), 1)["pid"]
    t0 = time.time()
    client.inject_fault(job_id, 1, kind="exception")
    until(lambda: [e for e in kinds("recovery.completed", level="in-process") if e.time > t0], "the in-process restart")
    done = [e for e in kinds("recovery.completed", level="in-process") if e.time > t0][0].data
    rates = sorted(e.data["steps_per_s"] for e in kinds("step") if e.time < t0 and e.data.get("steps_per_s"))
    step_s = 1.0 / rates[len(rates) // 2]
    assert done["dropped_steps"] == 1 and done["downtime_s"] <= 2 * step_s + 0.5, (done, step_s)
    assert done["pid"] == pid == slurm.rank_info(client.get(job_id), 1)["pid"], "rank 1 is a new process"
    assert [e.data["level"] for e in kinds("recovery.started") if e.time > t0] == ["in-process"]
    print(f"in-process restart on the dev cluster: downtime {done['downtime_s']} s at {step_s:.3f} s steps")

    # 1. a rank's process dies: beyond the in-process rung, torchrun restarts it (the process level)
    #    and it heals from its live peer
    until(lambda: step() >= 10, "step 10")
    t1 = time.time()
    info = client.inject_fault(job_id, 1)
    until(lambda: [e for e in kinds("checkpoint.restored", tier="replica", replica_group=1) if e.time > t1],
          "rank 1 healing from its peer")
    rec1 = [e for e in kinds("recovery.completed", mode="checkpointless") if e.time > t1]
    assert rec1 and rec1[0].data["downtime_s"] < 10, rec1
    assert [e for e in kinds("recovery.started", level="process") if e.time > t1 and e.data["node"] == info["node"]]
    # the agent of the node that ran rank 1 reported it (Slurm may have placed the job on n1 and n3)
    assert [e for e in kinds("fault.detected") if e.time > t1 and e.data.get("node") == info["node"]
            and e.data.get("rank") == 1], (info, kinds("fault.detected"))

    # 2. node n2 is lost: its agent and worker die, nothing restarts them
    target = step() + 3
    until(lambda: step() >= target, "progress after healing")
    worker = client.scheduler("local-slurm").rank_info(client.get(job_id), 1)["pid"]
    agent = _ppid(worker)
    t2 = time.time()
    for pid in (agent, worker):
        os.kill(pid, signal.SIGKILL)
    until(lambda: [e for e in kinds("elastic.scaled") if e.time > t2 and e.data["new_replicas"] == 1],
          "scale-down to one replica")
    down = [e for e in kinds("elastic.scaled") if e.time > t2][0].data
    assert down["accumulation_steps"] == 2 * down["old_accumulation_steps"] and down["lr"] == down["old_lr"]

    # 3. a new node joins from a second allocation
    join = cli.run(["scale", job_id, "--add-nodes", "1"], client=client)
    assert join["offset"] == 2
    until(lambda: kinds("checkpoint.restored", tier="replica", replica_group=2), "the new node healing")
    until(lambda: [e for e in kinds("elastic.scaled") if e.time > t2 and e.data["new_replicas"] == 2],
          "scale-up to two replicas")

    # 4. completion, with no storage read at any point
    until(lambda: kinds("finished"), "finished", timeout=300)
    assert client.wait(job_id, timeout_s=120).status == "completed", client.logs(job_id)[-3000:]
    assert kinds("finished")[-1].data["steps"] == STEPS
    assert not [e for e in kinds("checkpoint.restored") if e.data["tier"] != "replica"]
    assert kinds("checkpoint.saved", tier="memory") and kinds("checkpoint.saved", tier="persistent")


def test_requeued_checkpointless_job_falls_back_to_its_tiered_checkpoint(dev_cluster, client):
    """The whole allocation is lost (``scontrol requeue``: Slurm kills every process of the job,
    Lighthouse included, and queues it again). The next run starts a new Lighthouse; no live
    replica holds the state, so the replica groups restore their tiered checkpoint (each node's
    memory tier survived in its /dev/shm) with a ``recovery.fallback`` event, and the job
    completes every step."""
    steps = 60
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--recovery", "checkpointless", "--name", "ft-requeue",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                      "--", "--steps", str(steps), "--step-sleep", "0.2"], client=client)
    rec = client.get(job_id)
    job = Follow(client, job_id)
    events, until, step = job.events, job.until, job.step

    until(lambda: step() >= 12, "step 12", timeout=600)
    reached = step()
    t = time.time()
    assert scontrol("requeue", str(rec.native_id)).returncode == 0
    wait_pending(client, job_id)
    wait_until_gone(rec.native_id)
    assert scontrol("update", f"JobId={rec.native_id}", "StartTime=now").returncode == 0
    until(lambda: any(e.kind == "finished" for e in events), "the requeued run to finish", timeout=300)
    assert client.wait(job_id, timeout_s=120).status == "completed", client.logs(job_id)[-3000:]

    fb = [e for e in events if e.kind == "recovery.fallback" and e.time > t]
    assert fb and all(e.data["tier"] == "memory" and e.data["step"] >= reached - 1 for e in fb), (fb, reached)
    restored = [e for e in events if e.kind == "checkpoint.restored" and e.time > t]
    assert {e.data["tier"] for e in restored} <= {"memory", "replica"}, restored
    assert [e for e in events if e.kind == "finished"][-1].data["steps"] == steps
    assert "restart 1" in client.logs(job_id)
