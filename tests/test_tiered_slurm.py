"""Tiered checkpointing on the real 2-node dev cluster: one node's processes and shared memory
gone; the job is requeued by Slurm and every rank's state comes back from memory — its own
node's snapshot or a peer's replica — with no storage read."""

import os
import shutil
import subprocess
import time

from hyperpod_lab import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
SHM_ROOT = os.environ.get("HYPERPOD_LAB_SHM_DIR", "/dev/shm/hyperpod-lab")


def scontrol(*args):
    return subprocess.run(["scontrol", *args], capture_output=True, text=True)


def test_node_loss_restores_from_peer_memory(dev_cluster, client):
    job_id = cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", "1",
                      "--checkpoint-memory-every", "2", "--checkpoint-every", "1000", "--name", "nodeloss",
                      "--", "--steps", "60", "--step-sleep", "0.1"], client=client)
    rec = client.get(job_id)
    reader = client.event_reader(job_id)
    events, lost_at, deadline = [], None, time.monotonic() + 400
    while time.monotonic() < deadline:
        events += reader.poll()
        peers = [e for e in events if e.kind == "checkpoint.saved" and e.data.get("tier") == "peer"
                 and e.data.get("step", 0) >= 5]
        if lost_at is None and len(peers) >= 2:
            # node n2 fails: Slurm kills the job's processes there and requeues the job (--requeue)
            assert scontrol("update", "NodeName=n2", "State=DOWN", "Reason=hyperpod-lab-test").returncode == 0
            lost_at = len(events)
            for _ in range(100):
                if client.status(job_id).status == "pending":
                    break
                time.sleep(0.2)
            shutil.rmtree(os.path.join(SHM_ROOT, job_id, "n2"), ignore_errors=False)  # its memory is gone too
            # the replacement node comes up; the requeued job is released at once
            scontrol("update", "NodeName=n2", "State=RESUME")
            assert scontrol("update", f"JobId={rec.native_id}", "StartTime=now").returncode == 0
        if any(e.kind == "finished" for e in events):
            break
        time.sleep(0.3)
    kinds = [e.kind for e in events]
    assert lost_at is not None, f"no peer replica before the deadline: {kinds}\n{client.logs(job_id)[-3000:]}"
    assert "finished" in kinds, f"{kinds}\n{client.logs(job_id)[-3000:]}"
    after = events[lost_at:]
    restored = [e for e in after if e.kind == "checkpoint.restored"]
    tiers = sorted(e.data["tier"] for e in restored)
    assert len(restored) == 2 and set(tiers) <= {"memory", "peer"} and "peer" in tiers, restored
    assert len({e.data["step"] for e in restored}) == 1 and restored[0].data["step"] >= 5
    assert not any(e.kind == "checkpoint.restored" and e.data["tier"] in ("persistent", "s3") for e in events)
    fin = [e for e in events if e.kind == "finished"][-1]
    assert fin.data["status"] == "succeeded" and fin.data["steps"] == 60
    assert client.wait(job_id, timeout_s=60).status == "completed"
