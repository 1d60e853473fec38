"""The main job end to end on the real dev cluster: the example submitted over SSH to Slurm,
2 nodes x 1 process; a rank is SIGKILLed mid-run; the job resumes from its last checkpoint and
completes; the events arrive in order; the loss goes down."""

import json
import os
import signal
import subprocess
import time

from hyperpod_lab import cli
from hyperpod_lab.submit.jobs import JobStatus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")


def first(events, kind):
    return next(i for i, e in enumerate(events) if e.kind == kind)


def test_example_survives_a_killed_rank(dev_cluster, client):
    job_id = cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--checkpoint-every", "10", "--max-retries", "3", "--name", "e2e",
                      "--", "--steps", "50", "--step-sleep", "0.05"], client=client)
    rec = client.get(job_id)
    assert rec.orchestrator == "slurm" and rec.native_id.isdigit()
    reader = client.event_reader(job_id)
    events, killed, deadline = [], None, time.monotonic() + 300
    while time.monotonic() < deadline:
        events += reader.poll()
        if killed is None and any(e.kind == "checkpoint.saved" for e in events):
            info = json.load(open(os.path.join(rec.job_dir, "ranks", "rank-1.json")))
            os.kill(info["pid"], signal.SIGKILL)  # a plain kill -9, independent of inject-fault
            killed = info
        if any(e.kind == "finished" for e in events):
            break
        time.sleep(0.3)
    kinds = [e.kind for e in events]
    assert killed, f"no checkpoint before the deadline: {kinds}\n{client.logs(job_id)}"
    assert "finished" in kinds, f"{kinds}\n{client.logs(job_id)[-3000:]}"
    order = ["submitted", "started", "checkpoint.saved", "fault.detected", "recovery.completed", "finished"]
    idx = [first(events, k) for k in order]
    assert idx == sorted(idx), kinds
    fault = events[first(events, "fault.detected")]
    assert fault.data["rank"] == 1 and fault.data.get("signal") == "SIGKILL"
    restored = [e for e in events if e.kind == "checkpoint.restored"]
    before = [e for e in events[:first(events, "fault.detected")] if e.kind == "checkpoint.saved"]
    complete = {e.data["step"] for e in before if e.data["tier"] == "persistent"}  # committed for all ranks
    mem = {}
    for e in before:
        if e.data["tier"] == "memory":
            mem.setdefault(e.data["step"], set()).add(e.writer)
    complete |= {step for step, writers in mem.items() if len(writers) == 2}  # in memory on every rank
    saved_before_kill = max(complete, default=-1)
    assert restored and restored[-1].data["step"] >= saved_before_kill  # the newest complete checkpoint
    assert restored[-1].data["tier"] in ("memory", "peer", "persistent")
    rec_done = events[first(events, "recovery.completed")]
    assert rec_done.data["downtime_s"] > 0
    fin = events[first(events, "finished")]
    assert fin.data["status"] == "succeeded"
    steps = [e for e in events if e.kind == "step"]
    assert fin.data["steps"] == 50 and steps[-1].data["step"] <= 49
    assert fin.data["final_loss"] < steps[0].data["loss"]
    rec = client.wait(job_id, timeout_s=60)
    assert rec.state == JobStatus.COMPLETED and rec.exit_code == 0
    sacct = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "State", "-j", rec.native_id],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert sacct == "COMPLETED"
    # per-rank logs over SFTP
    assert "step" in client.logs(job_id, rank=0)


def test_cancel_and_batched_status(dev_cluster, client):
    ids = [cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "1", "--name", f"c{i}",
                    "--", "--steps", "100000", "--step-sleep", "0.5"], client=client) for i in range(2)]
    recs = [client.get(i) for i in ids]
    client.refresh(recs)
    assert all(r.status in ("pending", "running") for r in recs)
    for i in ids:
        cli.run(["cancel", i], client=client)
    for i in ids:
        rec = client.wait(i, timeout_s=60)
        assert rec.state == JobStatus.CANCELLED
        kinds = [e.kind for e in client.event_reader(i).poll()]
        assert kinds[0] == "submitted" and kinds[-1] == "finished"
