"""The checkpointless runtime at the largest shape this host holds (issue 27, item 5): a job of
16 nodes x 2 processes (32 training ranks, tests/scripts/ft_train.py's small MLP, gloo on CPU)
plus one hot spare, on the dev cluster grown to 17 slurmd nodes (``dev-cluster up --nodes 17``),
under the job's torchft Lighthouse, watched through a real jupyter server's WebSocket stream (the
one the Lab sidebar reads, ``/hyperpod/jobs/<id>/stream``).

One job, in order:

1. start: 16 replica groups of 2 ranks, the spare's 2 ranks waiting in ``hp.init()``;
2. a training node marked DOWN the way Slurm does it (``scontrol update State=DOWN``): the hot
   spare joins as a new group and heals from a live peer (16 groups again);
3. a second node DOWN, no spare left: elastic scale-down 16 -> 15 groups, the global batch kept;
4. ``hyperpod-lab scale --add-nodes 1``: a node from a second allocation joins, 15 -> 16;
5. the job completes every step, and nothing was ever restored from storage.

Measured and printed (docs/scale.md holds the runs' numbers): the supervisor's placement (its
last ``health.checked`` to the newest of the 32 rank files, and to the first 16-group step), the
quorum's re-formation after each DOWN (the DOWN to the first step of every surviving group, and
the fewest groups of a step in between: the survivors of a gloo ring notice the loss at
different times, so a quorum may be partial for a few steps), and the events' delivery: each
event's ``time`` (stamped when its writer wrote it) to its arrival at a WebSocket client in its
own process (tests/scripts/ws_latency.py); the issue's p99 <= 1 s is asserted (missed at
1.13-1.76 s while the server's live poll queued behind status refreshes on the cluster's one
worker thread; 0.32 s once event reads had workers of their own: docs/scale.md).
The job runs ``--no-checkpoint`` to keep to the CI budget: with ft_train.py's tiered checkpoint
(memory every step, persistent every 10) the same test passed everything but the p99 in 340 s,
with 4,273 events instead of ~300 (docs/scale.md, run 6); every ``checkpoint.restored`` is a heal
from a live peer (tier ``replica``) either way.

Wall time: 4.2 to 4.5 minutes on this 2-core machine, the cluster's growing and shrinking included.

The cluster goes back to its 3 nodes n1-n3 (idle) afterwards, whatever happened: the other
dev-cluster tests expect that shape (they run after this one on the same pytest-xdist worker).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from jupyter_server_proc import JupyterServer
from slurm_jobs import Follow, job_pids, scontrol

from hyperpod_lab import cli, devcluster
from hyperpod_lab.events import EventReader
from hyperpod_lab.submit.client import Client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FT = os.path.join(REPO, "tests", "scripts", "ft_train.py")
WS_LATENCY = os.path.join(REPO, "tests", "scripts", "ws_latency.py")
NODES, PROCS, SPARES = 16, 2, 1
CLUSTER_NODES = NODES + SPARES  # the scale-up takes a node that Slurm returned to service
STEPS = 130
STEP_SLEEP_S = 0.2
# 34 training processes on this 2-core host: every rank gets about 1/17 of a core, so one
# all-reduce of the cross-group gloo ring may stall for seconds; the job's collective timeout
# (10 s by default, docs/checkpointless.md's timeout hierarchy) is raised to 30 s and every
# process keeps to one intra-op thread. The first quorum waits for MIN_GROUPS groups (--elastic),
# so it does not start with the first group that asked, which would make every other group heal
# from it, one membership change after another.
# The job's elastic minimum (the Lighthouse's and every Manager's min_replicas) is a majority of its
# 16 groups: with 1 (the default when a spec gives none) the survivors of a DOWN that noticed the
# loss at different times formed two disjoint quorums of the same step (partial quorums of 9 and
# 8 groups, fresh22 on 2026-11-28), each committed it from different gradients, no group was
# behind at the next full quorum, and 15 groups ended with parameters that differ from group 0's
# (docs/scale.md, "Split quorums"). Two disjoint quorums of 9 need 18 groups; the job has 15-17.
MIN_GROUPS = NODES // 2 + 1
JOB_ENV = ("HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "RUST_LOG=warn", "OMP_NUM_THREADS=1")
# The Must show: events reach the sidebar's WebSocket within 1 s of being written (p99),
# with the job's 34 training processes on this host's 2 cores (docs/scale.md has every run's p99).
P99_TARGET_S = 1.0


@pytest.fixture
def cluster17(dev_cluster):
    """The dev cluster with 17 nodes for this test; afterwards its 3 nodes n1-n3, idle."""
    t = time.monotonic()
    devcluster.up(nodes=CLUSTER_NODES, quiet=True)
    print(f"dev cluster grown to {CLUSTER_NODES} nodes in {time.monotonic() - t:.1f} s")
    try:
        yield dev_cluster
    finally:
        for i in range(1, CLUSTER_NODES + 1):
            scontrol("update", f"NodeName=n{i}", "State=RESUME")  # "Invalid node state transition" when up
        devcluster.up(nodes=devcluster.DEFAULT_NODES, quiet=True)


class StreamClient:
    """The sidebar's WebSocket stream of one job, read by tests/scripts/ws_latency.py in a process
    of its own: each live event's delivery latency (arrival there minus its ``time``)."""

    def __init__(self, srv: JupyterServer, job_id: str, out: str):
        import subprocess

        self.out = out
        self.proc = subprocess.Popen([sys.executable, WS_LATENCY, srv.url, srv.token, job_id, out],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "open", "the WebSocket client did not connect"

    def result(self, timeout_s: float = 30.0) -> dict:
        """Wait for the stream's end (the job ended), else stop the client; its record."""
        import subprocess

        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        with open(self.out) as f:
            return json.load(f)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def mark_down(node: str) -> float:
    t = time.time()
    out = scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=hyperpod-lab scale16 test: node lost")
    assert out.returncode == 0, out.stderr
    return t


# 34 torch processes on 2 cores: 4.4 min on one machine, 7.9 min (471 s) on another of the same kind
# (its 32 ranks up 140 s after the pre-flight checks instead of 65 s); stop 34's CI stopped it at
# pytest's default 600 s. Its own waits are bounded (each ``until`` has a timeout).
@pytest.mark.timeout(1500)
def test_a_16_node_checkpointless_job_survives_a_node_down_and_scales_down_and_up(cluster17, tmp_path):
    t_test = time.monotonic()
    client = Client()  # the session's job store: the jupyter server below reads the same one
    srv = JupyterServer(str(tmp_path), str(tmp_path)).start()
    job_id = stream = None
    try:
        job_id = cli.run(["submit", FT, "--cluster", "local-slurm", "--nodes", str(NODES),
                          "--procs-per-node", str(PROCS), "--spares", str(SPARES), "--recovery", "checkpointless",
                          "--elastic", f"{MIN_GROUPS}:{CLUSTER_NODES}", "--name", "scale16",
                          *[a for kv in JOB_ENV for a in ("--env", kv)], "--", "--steps", str(STEPS), "--step-sleep", str(STEP_SLEEP_S),
                          "--no-checkpoint"], client=client)
        stream = StreamClient(srv, job_id, str(tmp_path / "latency.json"))
        job = Follow(client, job_id)
        # the test reads the job's events from the dev cluster's shared directory on this host
        # (the same files), not over SFTP as the server does: its own polling would otherwise load
        # the 2 cores (paramiko) whose share the server's delivery is measured against
        job.reader = EventReader(client.get(job_id).job_dir)
        until, kinds = job.until, job.kinds

        def steps_with(replicas: int, after: float) -> list:
            return [e for e in kinds("step") if e.time > after and e.data.get("replicas") == replicas]

        # 1. start: 16 groups x 2 ranks step together; the spare waits
        until(lambda: steps_with(NODES, 0), f"a step of {NODES} replica groups", timeout=600)
        rec = client.get(job_id)
        logs = client.logs(job_id)
        assert "hot spare on n17: started, waiting for a replica group" in logs, logs[-3000:]
        ranks = [json.load(open(os.path.join(rec.job_dir, "ranks", f))) for f in os.listdir(os.path.join(rec.job_dir, "ranks"))
                 if f.startswith("rank-") and f.endswith(".json")]
        ranks = [r for r in ranks if r.get("replica_group") is not None]  # not the spare's, waiting
        assert len(ranks) == NODES * PROCS and {r["node"] for r in ranks} == {f"n{i}" for i in range(1, NODES + 1)}, ranks
        t_checked = max(e.time for e in kinds("health.checked"))
        t_first = min(e.time for e in steps_with(NODES, 0))
        placement = {"ranks_up_s": round(max(r["time"] for r in ranks) - t_checked, 2),
                     "first_step_s": round(t_first - t_checked, 2)}
        print(f"placement: health checks done -> all {NODES * PROCS} training ranks up {placement['ranks_up_s']} s, "
              f"-> first {NODES}-group step {placement['first_step_s']} s")

        # 2. a node DOWN: the hot spare n17 joins as a new group, healing from a live peer. The
        #    survivors' gloo ring all-reduce fails at once only next to the lost ranks; the others
        #    wait out the collective timeout (10 s), and the quorum the first of them form may be
        #    partial for a step or two (at least MIN_GROUPS): measured as "fewest groups"
        t1 = mark_down("n5")
        until(lambda: [e for e in kinds("checkpoint.restored", tier="replica") if e.time > t1 and e.data["node"] == "n17"],
              "the spare healing from a live peer")
        until(lambda: steps_with(NODES, after=t1) and [e for e in kinds("fault.detected", reason="node down")
                                                      if e.data["node"] == "n5"],
              f"{NODES} groups again with the spare")
        detected1 = min(e.time for e in kinds("fault.detected", reason="node down") if e.data["node"] == "n5")
        back1 = min(e.time for e in steps_with(NODES, after=t1))
        between1 = [e.data["replicas"] for e in kinds("step") if t1 < e.time < back1]
        recovery = {"down_detected_s": round(detected1 - t1, 2),
                    "first_step_s": round(min(e.time for e in kinds("step") if e.time > t1) - t1, 2),
                    "spare_back_to_16_s": round(back1 - t1, 2), "fewest_groups": min(between1, default=NODES)}
        print(f"node n5 DOWN: {recovery}")

        # 3. another node DOWN, no spare left: scale-down to the 15 survivors, global batch kept
        until(lambda: len(steps_with(NODES, after=back1)) >= 3, "steps after the spare joined")
        t2 = mark_down("n9")
        until(lambda: steps_with(NODES - 1, after=t2), f"a step of the {NODES - 1} surviving groups")
        first_down = min(e.time for e in steps_with(NODES - 1, after=t2))
        between2 = [e.data["replicas"] for e in kinds("step") if t2 < e.time <= first_down]
        down = {"quorum_of_15_s": round(first_down - t2, 2),
                "first_step_s": round(min(e.time for e in kinds("step") if e.time > t2) - t2, 2),
                "fewest_groups": min(between2)}
        print(f"node n9 DOWN, no spare: {down}")
        assert [e for e in kinds("elastic.scaled") if e.time > t2 and e.data["new_replicas"] == NODES - 1]

        # 4. scale up: a second allocation joins the same Lighthouse (n5 is back in service)
        scontrol("update", "NodeName=n5", "State=RESUME")
        t3 = time.time()
        join = cli.run(["scale", job_id, "--add-nodes", "1"], client=client)
        until(lambda: steps_with(NODES, after=t3), f"a step of {NODES} groups after the scale-up", timeout=300)
        up = [e for e in kinds("elastic.scaled") if e.time > t3 and e.data["new_replicas"] == NODES]
        first_up = min(e.time for e in steps_with(NODES, after=t3))
        joined = [e for e in kinds("checkpoint.restored", tier="replica") if e.time > t3 and e.data["node"] in ("n5", "n9")]
        assert up and joined, (up, kinds("checkpoint.restored"))  # the new node healed from a live peer
        print(f"scale --add-nodes 1 (offset {join['offset']}, node {joined[0].data['node']}): "
              f"{NODES} groups {first_up - t3:.2f} s after the request")
        scaled = kinds("elastic.scaled")
        assert all(e.data["effective_batch"] == e.data["global_batch_size"] for e in scaled), scaled  # batch kept

        # 5. completion, every step, no storage read
        until(lambda: kinds("finished"), "finished", timeout=600)
        assert client.wait(job_id, timeout_s=120).status == "completed", client.logs(job_id)[-3000:]
        assert kinds("finished")[-1].data["steps"] == STEPS
        restored = kinds("checkpoint.restored")
        assert restored and all(e.data["tier"] == "replica" for e in restored), restored
        assert rec.native_id
        # the data-parallel replicas agree bit for bit: every group alive at the end (its rank 0's
        # final-group-<G>.pt) holds the same parameters. torchft heals only the groups behind the
        # highest step, so two quorums committing the same step apart (a partial quorum of one
        # beside the rest, docs/scale.md) would show here as groups that differ
        import torch

        finals = sorted(f for f in os.listdir(rec.job_dir) if f.startswith("final-group-") and f.endswith(".pt"))
        assert len(finals) >= NODES, f"{len(finals)} groups wrote their final parameters: {finals}"
        params = {f: torch.load(os.path.join(rec.job_dir, f), weights_only=True) for f in finals}
        first = params[finals[0]]
        diverged = [f for f in finals if any(not torch.equal(params[f][k], first[k]) for k in first)]
        assert not diverged, f"replica groups whose parameters differ from {finals[0]}'s: {diverged}"
        print(f"final parameters of {len(finals)} replica groups: identical")

        # the events' delivery to the sidebar's WebSocket client
        got = stream.result()
        assert got["error"] is None, got["error"]
        lat = [x[0] for x in got["latencies"]]
        assert len(lat) >= STEPS, f"only {len(lat)} live events reached the WebSocket client"
        worst = sorted(got["latencies"], reverse=True)[:5]
        print(f"event delivery over the WebSocket: {len(lat)} events, p50 {pct(lat, 50):.3f} s, "
              f"p99 {pct(lat, 99):.3f} s, max {max(lat):.3f} s (worst: {worst})")
        assert pct(lat, 99) <= P99_TARGET_S, f"p99 {pct(lat, 99):.3f} s over the issue's {P99_TARGET_S} s: {worst}"
        print(f"test wall time {time.monotonic() - t_test:.1f} s")
    finally:
        if stream is not None:
            stream.stop()
        if job_id is not None and client.status(job_id).status not in ("completed", "failed", "cancelled"):
            client.cancel(job_id)
        if job_id is not None and client.get(job_id).native_id:
            deadline = time.monotonic() + 60
            while job_pids(client.get(job_id).native_id) and time.monotonic() < deadline:
                time.sleep(0.5)
        srv.stop()


def test_the_dev_cluster_takes_2_to_32_nodes():
    """``dev-cluster up --nodes N``: N from 2 to devcluster.MAX_NODES = 32, and ``--cpus C`` from 1
    to devcluster.MAX_CPUS = 64 (the script and the Python API agree; nothing is started for a
    refused value); ``node_pid`` knows n1..n32."""
    import subprocess

    from hyperpod_lab.errors import HyperPodLabError

    # ``--nodes N`` and ``--cpus C`` (1 to 64 CPUs a node: more than the host's through
    # config_overrides): (keyword, bad values, API message, variable, bad values, script message)
    for kw, api_bad, api_says, var, env_bad, script_says in (
            ("nodes", (1, 33, True), "2 to 32", "HYPERPOD_LAB_DEV_NODES", ("33", "1", "x", "017"), "must be 2 to 32"),
            ("cpus", (0, 65, True, "8"), "cpus must be 1 to 64", "HYPERPOD_LAB_DEV_CPUS", ("0", "65", "x", "123"),
             "must be 1 to 64")):
        for bad in api_bad:
            with pytest.raises(HyperPodLabError, match=api_says):
                devcluster.up(**{kw: bad})
        for bad in env_bad:
            out = subprocess.run(["bash", devcluster.SCRIPT, "status"], capture_output=True, text=True,
                                 env={**os.environ, var: bad})
            assert out.returncode == 2 and script_says in out.stderr, (var, bad, out.returncode, out.stderr)
    with pytest.raises(HyperPodLabError, match="nodes are n1..n32"):
        devcluster.node_pid("n33")
    with pytest.raises(HyperPodLabError, match="slurmd of n32 is not running"):  # a valid name, no such slurmd
        devcluster.node_pid("n32")
