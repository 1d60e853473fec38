"""8 ranks a node, the production shape (issue 27), on the real dev cluster (Slurm over SSH): 2
nodes x 8 processes, each node a replica group that shards the model with FSDP2 over its own 8
ranks (gloo), torchft replicating the shards across the nodes (``tests/scripts/ft_fsdp_train.py
--fsdp``). The nodes declare 8 CPUs for this test (``dev-cluster up --cpus 8``: slurm.conf
``SlurmdParameters=config_overrides``), so Slurm places one 8-CPU task a node
(``--cpus-per-task=8``) and its launch agent starts the node's 8 ranks, as on a GPU node of 8
GPUs; the 16 ranks share this host's cores. One job, two faults:

1. global rank 9 (n2's second rank) is SIGKILLed (``inject-fault``, which finds the rank's node
   and checks its pid there): n2's agent restarts all 8 of its ranks while n1 trains on alone, and
   each of the 8 heals its own shard, an eighth of the state, from the rank holding the same shard
   on n1 (``checkpoint.restored`` tier ``replica``), bit for bit;
2. Slurm marks n2 DOWN (``scontrol update NodeName=n2 State=DOWN``): slurmctld kills n2's step,
   the supervisor reports the node's 8 ranks lost in one ``fault.detected``, and n1's 8 ranks go
   on alone with twice the gradient accumulation (global batch size kept) until the job completes.

Each node's memory snapshots are one ``checkpoint.saved`` a step for its 8 ranks. Nothing is
read from storage, and the loss curve matches a fault-free run's (one unsharded rank
in this process) up to float reduction order. The cluster goes back to the host's CPU count
afterwards. About 2-3 minutes (18 torch processes on 2 cores), so ``scripts/test.sh`` runs it
alone after the suite, with the 16-node test.
"""

from __future__ import annotations

import os
import time

import pytest
from slurm_jobs import Follow, scontrol
from test_checkpointless_fsdp import SCRIPT, assert_healed_bit_equal, reference_run

from hyperpod_lab import cli, devcluster

PROCS = 8
STEPS = 160
GLOBAL_BATCH = 32  # ft_fsdp_train.py's global batch size (samples a step, whatever the replicas)
JOB_ENV = ("HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "RUST_LOG=warn", "OMP_NUM_THREADS=1")


def test_a_job_asking_more_cpus_a_node_than_its_nodes_have_says_what_to_do(dev_cluster, client):
    """Before ``--cpus``: the nodes declare this host's CPUs, so a job of 4 times as many processes
    a node (8 here, the production shape) pends with Slurm's ``PartitionConfig`` for ever (Slurm
    22.05 accepts it; it refuses 3 CPUs a node of 2 at submit, "CPU count per node can not be
    satisfied"); its status says why and what to do (``slurm.REASON_NOTES``), and cancelling it
    loses nothing."""
    procs = 4 * len(os.sched_getaffinity(0))  # nproc is what devcluster.sh declares
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", str(procs),
                      "--recovery", "checkpointless", "--name", "too-wide", "--", "--steps", "1"], client=client)
    try:
        deadline = time.monotonic() + 60
        while "PartitionConfig" not in (client.status(job_id).reason or ""):
            assert time.monotonic() < deadline, client.status(job_id)
            time.sleep(1)
        rec = client.status(job_id)
        assert rec.status == "pending" and "--procs-per-node" in rec.reason and "cancel it" in rec.reason, rec
    finally:
        client.cancel(job_id)
    assert client.wait(job_id, timeout_s=60).status == "cancelled"


@pytest.fixture
def nodes_of_8_cpus(dev_cluster):
    """The dev cluster's nodes declaring 8 CPUs each; afterwards the host's count again, n2 back."""
    devcluster.up(nodes=devcluster.DEFAULT_NODES, cpus=PROCS, quiet=True)
    try:
        yield dev_cluster
    finally:
        scontrol("update", "NodeName=n2", "State=RESUME")  # "Invalid node state transition" when up
        devcluster.up(nodes=devcluster.DEFAULT_NODES, quiet=True)


def test_8_ranks_a_node_heal_every_shard_from_the_other_node_and_survive_its_loss(nodes_of_8_cpus, client):
    args = ["--fsdp", "--checkpoint", "--bucket-bytes", "4096", "--steps", str(STEPS), "--step-sleep", "0.25"]
    clean_losses, clean_final = reference_run(args)
    env = [w for kv in JOB_ENV for w in ("--env", kv)]
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local-slurm", "--nodes", "2", "--procs-per-node", str(PROCS),
                      "--recovery", "checkpointless", "--name", "ft-shape8", *env, "--", *args], client=client)
    try:
        _faults_and_checks(client, job_id, clean_losses, clean_final)
    finally:
        client.cancel(job_id)  # a no-op once it completed; else nothing is left in the queue


def _faults_and_checks(client, job_id: str, clean_losses: dict, clean_final: dict) -> None:
    job = Follow(client, job_id)
    until, step, kinds = job.until, job.step, job.kinds

    # 1. a rank of n2 dies: n2's agent restarts its 8 ranks, each heals its shard from n1's
    until(lambda: step() >= 8, "step 8", timeout=600)  # includes 16 processes importing torch
    t1 = time.time()
    info = client.inject_fault(job_id, PROCS + 1)
    assert info["node"] == "n2", info
    until(lambda: [e for e in kinds("checkpoint.restored", tier="replica") if e.time > t1],
          "n2's ranks healing from n1", timeout=300)
    # one event for the group (its rank 0's); every rank's heal is checked bit for bit below
    healed = [e.data for e in kinds("checkpoint.restored", tier="replica") if e.time > t1]
    assert {d["replica_group"] for d in healed} == {1} and healed[0]["node"] == "n2", healed
    assert [e for e in kinds("fault.detected") if e.time > t1 and e.data.get("rank") == PROCS + 1]
    # a rank's heal moves its shard: model + Adam state of an eighth of every parameter
    full = sum(t.numel() * t.element_size() for t in clean_final.values())
    assert all(0.5 * 3 * full / PROCS <= d["bytes"] <= 2 * 3 * full / PROCS for d in healed), (healed, full)

    # 2. Slurm marks n2 DOWN: its 8 ranks are lost at once, n1's go on alone
    t2, down, scaled = job.node_marked_down("n2", "hyperpod-lab shape8 test: node lost")
    assert down["node"] == "n2" and down["rank"] == list(range(PROCS, 2 * PROCS)), down
    # a whole group left: the global batch size is kept, each of the 8 ranks left takes 4 samples
    # a step instead of 2 (one micro-batch of ft_fsdp_train.py's 4 either way: no accumulation)
    assert scaled["effective_batch"] == scaled["global_batch_size"] == GLOBAL_BATCH, scaled
    assert (scaled["old_world_size"], scaled["new_world_size"]) == (2 * PROCS, PROCS), scaled
    assert scaled["accumulation_steps"] == scaled["old_accumulation_steps"] == 1, scaled
    until(lambda: kinds("finished"), "finished", timeout=600)
    assert client.wait(job_id, timeout_s=120).status == "completed", client.logs(job_id)[-3000:]

    assert kinds("finished")[-1].data["steps"] == STEPS
    assert not [e for e in kinds("checkpoint.restored") if e.data["tier"] != "replica"], "read from storage"
    assert not kinds("recovery.fallback")
    assert [e for e in kinds("step") if e.time > t2 and e.data["replicas"] == 1]
    # each node's memory snapshots are one event a step for its 8 ranks, by its lowest rank
    # (runtime/checkpoint/node_saves.py), never one a rank
    mem = kinds("checkpoint.saved", tier="memory")
    assert mem and all("rank" not in e.data and len(e.data["ranks"]) == len(e.data["rank_bytes"]) == PROCS
                       for e in mem), mem[:3]
    assert {(e.data["node"], e.writer, tuple(e.data["ranks"])) for e in mem} == {
        ("n1", "rank-0", tuple(range(PROCS))), ("n2", f"rank-{PROCS}", tuple(range(PROCS, 2 * PROCS)))}
    keys = [(e.data["node"], e.data["step"]) for e in mem]
    assert len(keys) == len(set(keys)), sorted(keys)
    # every one of n2's 8 ranks was a new process that began its heal step with the bits of the
    # same rank on n1 (the shard records of ft_fsdp_train.py)
    assert_healed_bit_equal(client.get(job_id).job_dir, PROCS, 1, healed[0]["step"])

    losses = {e.data["step"]: e.data["loss"] for e in kinds("step")}
    assert sorted(losses) == list(range(STEPS)), "a step was lost or repeated"
    worst = max(abs(losses[s] - clean_losses[s]) / abs(clean_losses[s]) for s in range(STEPS))
    assert worst <= 1e-4, f"loss curve differs by {worst:.2e} (relative) from the fault-free run"
    print(f"2 nodes x {PROCS} ranks: {PROCS} shards healed ({healed[0]['bytes']} bytes each); node down -> "
          f"{PROCS} ranks alone; loss curve within {worst:.2e} of the fault-free run")
