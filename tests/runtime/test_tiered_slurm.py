"""Tiered checkpointing on the real 2-node dev cluster: one node's processes and shared memory
gone; the job is requeued by Slurm and every rank's state comes back from memory — its own
node's snapshot or a peer's replica — with no storage read."""

import os
import shutil
import time

from slurm_jobs import kill_node_processes, scontrol, wait_pending, wait_until_gone

from hyperpod_lab import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
SHM_ROOT = os.environ.get("HYPERPOD_LAB_SHM_DIR", "/dev/shm/hyperpod-lab")


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
            # node n2 fails: its processes die with it, Slurm marks it DOWN and requeues the job
            # (--requeue), killing the job's processes on the surviving node n1
            kill_node_processes(rec.native_id, "n2")
            assert scontrol("update", "NodeName=n2", "State=DOWN", "Reason=hyperpod-lab-test").returncode == 0
            lost_at = len(events)
            wait_pending(client, job_id)
            # Slurm delays a requeued job's start until the old run is gone; the test releases it
            # early, so it first waits for that itself (a stale agent on a dev node shares this
            # host and would hold the requeued run's rendezvous port)
            wait_until_gone(rec.native_id)
            shutil.rmtree(os.path.join(SHM_ROOT, job_id, "n2"), ignore_errors=False)  # its memory is gone too
            # the replacement node comes up (ReturnToService=2 may already have returned it to
            # service); the requeued job is released at once
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
