"""Checkpointless HSDP on the real dev cluster (Slurm over SSH): 2 nodes x 2 processes, each node a
replica group that shards the model with FSDP2 over its own 2 ranks (gloo), torchft replicating
the shards across the nodes (``tests/scripts/ft_fsdp_train.py --fsdp``). One job, two faults:

1. rank 3 (n2's second rank) is SIGKILLed (``inject-fault``): torchrun on n2 restarts both of its
   ranks, each heals its own shard from the rank holding the same shard on n1 (tier ``replica``),
   bit for bit, while n1 trains on alone;
2. Slurm marks n2 DOWN (``scontrol update NodeName=n2 State=DOWN``): slurmctld kills n2's step,
   n1 goes on alone with twice the accumulation, and the job completes.

Nothing is read from storage at any point (the sharded fallback checkpoint is written, memory tier
every step, and never used), and the job's loss curve matches the fault-free run's
(one unsharded rank, computed in the test process) up to float reduction order.
"""

import time

import pytest
from slurm_jobs import Follow, scontrol
from test_checkpointless_fsdp import SCRIPT, assert_healed_bit_equal, reference_run

from hyperpod_lab import cli

STEPS = 200
PROCS = 2


@pytest.fixture
def n2_back():
    """n2 is back in service after the test (it is marked DOWN on purpose)."""
    yield "n2"
    scontrol("update", "NodeName=n2", "State=RESUME")  # "Invalid node state transition" when already up


def test_fsdp_checkpointless_job_heals_a_killed_rank_and_survives_a_node_down(dev_cluster, client, n2_back):
    args = ["--fsdp", "--checkpoint", "--steps", str(STEPS), "--step-sleep", "0.25"]
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", str(PROCS),
                      "--recovery", "checkpointless", "--name", "ft-hsdp",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                      "--", *args], client=client)
    job = Follow(client, job_id)
    until, step, kinds = job.until, job.step, job.kinds

    # 1. a rank of n2's group dies: the group restarts and heals its shards from n1's ranks
    until(lambda: step() >= 8, "step 8", timeout=600)  # includes waiting in the queue
    t1 = time.time()
    info = client.inject_fault(job_id, 3)
    assert info["node"] == "n2", info
    until(lambda: [e for e in kinds("checkpoint.restored", tier="replica", replica_group=1) if e.time > t1],
          "n2's group healing from n1", timeout=300)
    healed = [e for e in kinds("checkpoint.restored", tier="replica", replica_group=1) if e.time > t1][0].data
    assert [e for e in kinds("fault.detected") if e.time > t1 and e.data.get("rank") == 3], kinds("fault.detected")

    # 2. Slurm marks n2 DOWN: n1 goes on alone
    t2, down, scaled = job.node_marked_down("n2", "hyperpod-lab test: node lost")
    assert down["node"] == "n2" and down["rank"] == [2, 3], down
    # a whole group left: batch kept
    assert scaled["accumulation_steps"] == 2 * scaled["old_accumulation_steps"], scaled
    assert scaled["effective_batch"] == scaled["global_batch_size"] == 32 and scaled["new_world_size"] == PROCS
    until(lambda: kinds("finished"), "finished", timeout=600)
    assert client.wait(job_id, timeout_s=120).status == "completed", client.logs(job_id)[-3000:]

    ev = job.events
    assert kinds("finished")[-1].data["steps"] == STEPS
    assert not [e for e in kinds("checkpoint.restored") if e.data["tier"] != "replica"], "read from storage"
    assert not kinds("recovery.fallback")
    assert kinds("checkpoint.saved", tier="memory")  # the fallback was there, unused
    assert [e for e in kinds("step") if e.time > t2 and e.data["replicas"] == 1]
    assert_healed_bit_equal(client.get(job_id).job_dir, PROCS, 1, healed["step"])

    ref, _ = reference_run(args)
    losses = {e.data["step"]: e.data["loss"] for e in ev if e.kind == "step"}
    assert sorted(losses) == list(range(STEPS)), "a step was lost or repeated"
    worst = max(abs(losses[s] - ref[s]) / abs(ref[s]) for s in range(STEPS))
    assert worst <= 1e-4, f"loss curve differs by {worst:.2e} (relative) from the fault-free run"
    print(f"healed {healed}; loss curve within {worst:.2e} of the fault-free run")
