"""Checkpointless recovery and elastic training with real processes (torchft Lighthouse and
Managers, torchrun launch agents, gloo), on this host.

Each data-parallel replica group is one launch agent (``--standalone``, one worker) with its own
``HYPERPOD_LAB_REPLICA_GROUP``; the agents share one torchft Lighthouse. The job is
``tests/scripts/ft_train.py`` (deterministic regression, Adam, global batch 32 kept by gradient
accumulation). The multi-node version of the same on the dev cluster is in
``tests/runtime/test_checkpointless_slurm.py``.

What "equal to the run without a fault" means here: the same samples, weights and optimizer
steps, summed in a different order (one replica sums 32 sample gradients; two replicas each sum
16 and all-reduce), so the final parameters differ only by float reduction order: we assert
they agree within 1e-5 (relative) and that both replicas end bit-identical to each other.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import torch  # a hard dependency: missing torch fails, never skips
from agents import kinds, read_events, stop_launchers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "ft_train.py")
STEPS = 60
ELASTIC_STEPS = 100


class Job:
    """A checkpointless job on this host: one Lighthouse and one launch agent per replica group."""

    def __init__(self, tmp_path, groups: int, args: list[str], min_replicas: int = 1,
                 group_args: dict[int, list[str]] | None = None):
        self.job_id = "ft-" + uuid.uuid4().hex[:8]
        self.job_dir = str(tmp_path / self.job_id)
        os.makedirs(self.job_dir)
        self.shm = str(tmp_path / "shm")
        self.args, self.groups = args, groups
        self.group_args = group_args or {}  # more arguments for one group (later ones win)
        self.lighthouse = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.lighthouse", "--job-dir", self.job_dir,
             "--min-replicas", str(min_replicas), "--host", "127.0.0.1"],
            stdout=open(os.path.join(self.job_dir, "lighthouse.log"), "wb"), stderr=subprocess.STDOUT)
        from hyperpod_lab.node.lighthouse import START_TIMEOUT_S, read_address

        self.address = read_address(self.job_dir, timeout_s=START_TIMEOUT_S + 30)
        self.agents: dict[int, subprocess.Popen] = {}
        for g in range(groups):
            self.start_group(g)

    def env(self, group: int) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.update({"HYPERPOD_LAB_JOB_DIR": self.job_dir, "HYPERPOD_LAB_JOB_ID": self.job_id,
                    "HYPERPOD_LAB_SHM_DIR": self.shm, "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "0.001",
                    "HYPERPOD_LAB_REPLICA_GROUP": str(group), "HYPERPOD_LAB_REPLICA_GROUPS": str(self.groups),
                    "TORCHFT_LIGHTHOUSE": self.address, "OMP_NUM_THREADS": "1", "SLURMD_NODENAME": f"n{group + 1}",
                    "RUST_LOG": "warn"})
        return env

    def start_group(self, group: int) -> None:
        log = open(os.path.join(self.job_dir, f"agent-{group}.log"), "ab")
        self.agents[group] = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_lab.node.launch", "--standalone", "--nnodes=1",
             "--nproc-per-node=1", "--max-restarts=3", "--monitor-interval=0.1", SCRIPT, "--steps", str(STEPS),
             *self.args, *self.group_args.get(group, [])], env=self.env(group), stdout=log, stderr=subprocess.STDOUT)

    def events(self) -> list[dict]:
        return read_events(self.job_dir)

    def last_step(self) -> int:
        steps = [e["data"]["step"] for e in kinds(self.events(), "step")]
        return max(steps, default=-1)

    def wait_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.last_step() < step:
            assert time.monotonic() < deadline, f"job did not reach step {step}: {self.logs()}"
            assert all(a.poll() is None for a in self.agents.values()), f"an agent exited early: {self.logs()}"
            time.sleep(0.05)

    def worker_pid(self, group: int) -> int:
        import json

        with open(os.path.join(self.job_dir, "ranks", f"rank-{group}.json")) as f:
            return json.load(f)["pid"]

    def lose_node(self, group: int) -> None:
        """The group's node is gone: its agent and worker SIGKILLed, nothing restarts them (the
        group leaves ``agents``; :meth:`start_group` may start it again)."""
        pid = self.worker_pid(group)
        agent = self.agents.pop(group)
        agent.kill()
        os.kill(pid, signal.SIGKILL)
        agent.wait()

    def lose_every_node(self) -> list[int]:
        """Every group's node gone at once (:meth:`lose_node`), with the job's memory tier (its
        directory under ``shm``). Returns the groups lost."""
        groups = sorted(self.agents)
        for g in groups:
            self.lose_node(g)
        shutil.rmtree(os.path.join(self.shm, self.job_id))
        return groups

    def start_groups(self, groups: list[int]) -> float:
        """:meth:`start_group` for each of ``groups``; returns the time (``time.time()``) just before."""
        t = time.time()
        for g in groups:
            self.start_group(g)
        return t

    def wait(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        for g, a in self.agents.items():
            if a.poll() is None and a.returncode is None:
                try:
                    a.wait(timeout=max(1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"group {g} did not finish: {self.logs()}")

    def finish(self, timeout: float = 180) -> list[dict]:
        """Wait for every agent (:meth:`wait`), assert each exited 0 (else the logs); the job's events."""
        self.wait(timeout)
        assert all(a.returncode == 0 for a in self.agents.values()), self.logs()
        return self.events()

    def completed(self, timeout: float = 180) -> "Job":
        """:meth:`finish`, then :meth:`stop` (also when it fails); returns this job."""
        try:
            self.finish(timeout)
        finally:
            self.stop()
        return self

    def logs(self) -> str:
        """The job's story for a failed assertion, most telling first (CI shows a part of it): each
        log's first error lines, the job's last events other than steps, then each log's tail."""
        errors = re.compile(r"Error|Exception|Traceback \(|timed out|[Hh]ang|Signal|killed|fell back")
        head, tails = [], []
        for name in sorted(os.listdir(self.job_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.job_dir, name), errors="replace") as f:
                    text = f.read()
                first = list(dict.fromkeys(line[:300] for line in text.splitlines() if errors.search(line)))[:8]
                head.append(f"--- {name}: first error lines\n" + "\n".join(first))
                tails.append(f"--- {name}\n" + text[-3000:])
        try:
            events = [e for e in self.events() if e.get("kind") != "step"][-15:]
        except Exception as exc:  # a diagnostic: a job dir without events still shows its logs
            events = [{"unreadable": repr(exc)}]
        head.append("--- last events other than steps\n" + "\n".join(
            f"{e.get('time', '')} {e.get('kind')} {e.get('writer')} {str(e.get('data', ''))[:200]}" for e in events))
        return "\n".join(head + tails)

    def final(self, group: int) -> dict[str, torch.Tensor]:
        return torch.load(os.path.join(self.job_dir, f"final-group-{group}.pt"))

    def stop(self) -> None:
        stop_launchers(list(self.agents.values()), self.job_dir, SCRIPT)
        self.lighthouse.terminate()
        try:
            self.lighthouse.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.lighthouse.kill()


def _close(a: dict, b: dict, rtol: float = 1e-5) -> float:
    worst = 0.0
    for k in a:
        d = ((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)).item()
        worst = max(worst, d)
    assert worst <= rtol, f"parameters differ by {worst:.2e} (relative) > {rtol}"
    return worst


def _replicas_equal(job: Job, g0: int, g1: int) -> dict[str, torch.Tensor]:
    """Assert two replica groups ended with bit-identical parameters; returns the first's."""
    a, b = job.final(g0), job.final(g1)
    for k in a:
        assert torch.equal(a[k], b[k]), f"replicas diverged at {k}"
    return a


def _storage_restores(events: list[dict]) -> list[dict]:
    return [e for e in kinds(events, "checkpoint.restored") if e["data"]["tier"] != "replica"]


def _run_clean(tmp_path, args=()) -> tuple[dict, list[dict]]:
    job = Job(tmp_path, 2, list(args)).completed()
    return job.final(0), job.events()


def test_killed_rank_recovers_from_live_peer_without_storage(tmp_path):
    """Kill rank 1 at step S: the survivor redoes step S alone within seconds, the restarted rank
    heals from the survivor's live state (tier "replica"), nothing is read from storage, and the
    final parameters equal the fault-free run's up to float reduction order."""
    clean, clean_events = _run_clean(tmp_path / "clean", ["--step-sleep", "0.3"])
    assert not _storage_restores(clean_events)

    job = Job(tmp_path / "fault", 2, ["--step-sleep", "0.3"])
    try:
        job.wait_step(9)
        s = job.last_step() + 1  # the step in flight when the fault hits
        t_fault = time.time()
        os.kill(job.worker_pid(1), signal.SIGKILL)
        ev = job.finish()
    finally:
        job.stop()

    faults = [e for e in kinds(ev, "fault.detected") if e["time"] >= t_fault]
    assert any(e["data"].get("signal") == "SIGKILL" and e["data"].get("rank") == 1 for e in faults), faults
    survivor = [e for e in faults if e["data"].get("replica_group") == 1 and e["data"].get("detected_by") == 0]
    assert survivor and survivor[0]["data"]["node"] == "n2", faults
    rec = kinds(ev, "recovery.completed", mode="checkpointless")
    assert rec, "the survivor reported no recovery"
    assert rec[0]["data"]["resumed_step"] in (s, s - 1), (rec[0]["data"], s)
    assert rec[0]["data"]["downtime_s"] < 5.0, rec[0]["data"]
    healed = [e for e in kinds(ev, "checkpoint.restored", tier="replica") if e["time"] > t_fault]
    assert healed and healed[0]["data"]["replica_group"] == 1, "the restarted rank did not heal from its peer"
    assert not _storage_restores(ev), f"read from storage: {_storage_restores(ev)}"
    assert not kinds(ev, "recovery.fallback")
    fin = kinds(ev, "finished")
    assert fin and fin[-1]["data"]["steps"] == STEPS
    # no step lost or repeated in the record: every step committed once
    assert sorted({e["data"]["step"] for e in kinds(ev, "step")}) == list(range(STEPS))
    _close(_replicas_equal(job, 0, 1), clean)


def test_heartbeat_timeouts_follow_the_lighthouse_address_and_the_groups_beat_five_times_per_timeout(tmp_path):
    """Loopback: 100 ms (no packet loss between groups on one host); a cluster address: 300 ms,
    above Linux's 200 ms minimum TCP retransmission timeout, so one lost heartbeat packet does not
    drop a live group. A group's Manager beats every fifth of the published timeout (>= 10 ms); an
    unpublished or unreadable one falls back to 20 ms."""
    import json

    from hyperpod_lab.node.lighthouse import default_heartbeat_ms, heartbeat_interval_ms
    from hyperpod_lab.runtime.checkpointless.ft import manager_heartbeat_interval_ms

    assert [default_heartbeat_ms(ip) for ip in ("127.0.0.1", "127.0.1.1", "::1", "10.0.3.7", "fd00::5")] == \
        [100, 100, 100, 300, 300]
    assert [heartbeat_interval_ms(t) for t in (100, 300, 500, 20)] == [20, 60, 100, 10]
    job_dir = str(tmp_path)
    assert manager_heartbeat_interval_ms(job_dir) == 20  # nothing published
    for published, interval in (({"heartbeat_ms": 300, "heartbeat_interval_ms": 60}, 60),
                                ({"heartbeat_ms": 500}, 100), ({"heartbeat_interval_ms": "x"}, 20)):
        with open(os.path.join(job_dir, "lighthouse.json"), "w") as f:
            json.dump(published, f)
        assert manager_heartbeat_interval_ms(job_dir) == interval, published


# The survivors' wait for their new quorum after a killed group, bounded: torchft's Lighthouse drops
# a group only when its heartbeats stop for the heartbeat timeout (100 ms on loopback, re-checked
# every 10 ms); the killed group's stopped with its process, so by the time a survivor's failed
# all-reduce returns that timeout has mostly passed. The wait is then at most 100 + 10 ms plus
# the reconfiguration (measured 3-63 ms); with the previous 500 ms timeout (100 ms heartbeats,
# 100 ms ticks) and this test's ~0.1 s steps it was at least 0.5 - 0.1 - 0.1 = 0.3 s (measured
# 0.33-0.56 s with 0.2 s steps). 0.25 s (issue 15's target) leaves 0.14 s for a loaded machine.
REQUORUM_BOUND_S = 0.25


def test_survivors_requorum_without_waiting_for_the_dead_groups_heartbeat(tmp_path):
    """A SIGKILLed group is out of the survivors' next quorum within REQUORUM_BOUND_S of the
    survivors' failed step: from the survivors' leader's ``fault.detected`` ``detected_at`` (its
    failed all-reduce) to its ``elastic.scaled`` 2 -> 1 (written right after that quorum
    returned), so the step time is not in it. Short steps (0.05 s sleep) keep the kill close to
    the failed all-reduce, where a long heartbeat timeout cannot hide behind the rest of a step.
    A kill that lands after the killed group's part of a step's all-reduce fails no collective:
    the survivor commits that step and waits in its next quorum request, so the wait is measured
    from that commit (its ``step`` event) instead."""
    import json

    job = Job(tmp_path, 2, ["--step-sleep", "0.05", "--steps", "300"])
    try:
        with open(os.path.join(job.job_dir, "lighthouse.json")) as f:
            published = json.load(f)
        assert published["heartbeat_ms"] == 100 and published["heartbeat_interval_ms"] == 20, published
        assert published["quorum_tick_ms"] == 10, published
        job.wait_step(15)
        t_kill = time.time()
        os.kill(job.worker_pid(1), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            ev = job.events()
            scaled = [e for e in kinds(ev, "elastic.scaled") if e["time"] > t_kill and e["data"]["new_replicas"] == 1]
            survivor = [e for e in kinds(ev, "fault.detected", replica_group=1, detected_by=0) if e["time"] > t_kill]
            if scaled and survivor:
                break
            assert time.monotonic() < deadline, f"no re-formed quorum after the kill: {job.logs()}"
            time.sleep(0.1)
    finally:
        job.stop()
    t_quorum, found = scaled[0]["time"], survivor[0]["data"]
    committed = [e["time"] for e in kinds(ev, "step") if e["writer"] == "rank-0" and e["time"] <= t_quorum]
    failed_step = t_kill - 0.05 <= found["detected_at"] <= t_quorum  # the failure this kill caused
    waited_from = found["detected_at"] if failed_step else max(committed)
    requorum_s = t_quorum - waited_from
    assert waited_from >= t_kill - 0.2, (waited_from, t_kill, found)
    assert 0 <= requorum_s <= REQUORUM_BOUND_S, (
        f"the survivor waited {requorum_s:.3f} s for a quorum without the killed group "
        f"(bound {REQUORUM_BOUND_S} s; from its {'failed all-reduce' if failed_step else 'last commit'}): "
        f"{found}, {scaled[0]}")
    if failed_step:  # detected from the broken connection (the killed process's kernel closed it)
        assert re.search(r"Connection (closed|reset) by peer", found["reason"]), found["reason"]


def test_a_slow_but_alive_group_is_waited_for_not_dropped(tmp_path):
    """Group 1 takes 0.7 s a step, group 0 0.05 s: at every step group 0 asks for its quorum
    ~0.65 s before group 1 does (more than 6 heartbeat timeouts of 100 ms, and more than the
    previous 500 ms one), yet group 1 keeps heartbeating from torchft's Rust thread, so the
    Lighthouse waits for it (join timeout 5 s): every step is committed by both groups, nobody
    is reported lost, nobody heals, and the two replicas end bit-identical."""
    steps = 20
    job = Job(tmp_path, 2, ["--step-sleep", "0.05", "--steps", str(steps)], group_args={1: ["--step-sleep", "0.7"]})
    try:
        ev = job.finish(timeout=240)
    finally:
        job.stop()
    step_events = kinds(ev, "step")
    assert {e["data"]["step"] for e in step_events} == set(range(steps))
    assert all(e["data"]["replicas"] == 2 for e in step_events), \
        sorted({(e["data"]["step"], e["data"]["replicas"]) for e in step_events if e["data"]["replicas"] != 2})
    assert not kinds(ev, "fault.detected"), kinds(ev, "fault.detected")
    assert not kinds(ev, "elastic.scaled"), kinds(ev, "elastic.scaled")
    assert not kinds(ev, "checkpoint.restored", tier="replica"), "a group was dropped and healed"
    # it really was slow: group 0 waited for it at every step
    first, last = min(e["time"] for e in step_events), max(e["time"] for e in step_events)
    assert (last - first) / (steps - 1) >= 0.6, (last - first) / (steps - 1)
    _replicas_equal(job, 0, 1)


def test_losing_every_replica_falls_back_to_the_tiered_checkpoint(tmp_path):
    """Both replica groups die at once: no live replica holds the state, so each restores its
    tiered checkpoint (memory tier, saved every step) with a recovery.fallback event."""
    job = Job(tmp_path, 2, ["--step-sleep", "0.3"])
    try:
        job.wait_step(9)
        reached = job.last_step()
        for g in (0, 1):
            os.kill(job.worker_pid(g), signal.SIGKILL)
        ev = job.finish()
    finally:
        job.stop()
    fb = kinds(ev, "recovery.fallback")
    assert fb, "no recovery.fallback event"
    assert all(e["data"]["tier"] == "memory" and e["data"]["step"] >= reached for e in fb), (fb, reached)
    assert "no live replica" in fb[0]["data"]["reason"]
    # each group restored its own tier, or healed from a group that had (whichever came first)
    healed = {e["data"]["replica_group"] for e in kinds(ev, "checkpoint.restored", tier="replica")
              if e["time"] >= fb[0]["time"]}
    assert {e["data"]["replica_group"] for e in fb} | healed == {0, 1}, (fb, healed)
    assert kinds(ev, "finished")[-1]["data"]["steps"] == STEPS
    _replicas_equal(job, 0, 1)


def _losses(events: list[dict]) -> dict[int, float]:
    return {e["data"]["step"]: e["data"]["loss"] for e in kinds(events, "step")}


def test_elastic_shrink_and_grow_with_tiered_checkpointing_keeps_the_loss_curve(tmp_path):
    """Checkpointless + tiered checkpointing (memory every step, persistent every 10) + elastic in
    one job: 2 replica groups -> group 1's node is lost (agent and worker SIGKILLed, nothing
    restarts it) -> group 0 goes on alone with twice the gradient accumulation (global batch kept,
    learning rate unchanged) -> a new group joins and heals from group 0 -> 2 groups again. The
    loss curve stays within 2 % of a fixed 2-group run with the same global batch."""
    args = ["--step-sleep", "0.3", "--steps", str(ELASTIC_STEPS)]  # long enough for a new group to start
    _, fixed_events = _run_clean(tmp_path / "fixed", args)
    fixed = _losses(fixed_events)
    assert sorted(fixed) == list(range(ELASTIC_STEPS))

    job = Job(tmp_path / "elastic", 2, args)
    try:
        job.wait_step(14)
        job.lose_node(1)
        job.wait_step(job.last_step() + 8)  # group 0 trains alone for a while
        job.start_group(2)
        job.wait()
        ev = job.events()
        assert job.agents[0].returncode == 0 and job.agents[2].returncode == 0, job.logs()
    finally:
        job.stop()

    scaled = kinds(ev, "elastic.scaled")
    down_ev = [e for e in scaled if e["data"]["new_replicas"] < e["data"]["old_replicas"]]
    down = [e["data"] for e in down_ev]
    up = [e["data"] for e in scaled if e["data"]["new_replicas"] > e["data"]["old_replicas"]
          and down_ev and e["time"] > down_ev[0]["time"]]
    assert down and down[0]["old_world_size"] == 2 and down[0]["new_world_size"] == 1, scaled
    assert down[0]["accumulation_steps"] == 2 * down[0]["old_accumulation_steps"]
    assert down[0]["effective_batch"] == down[0]["global_batch_size"] == 32 and down[0]["lr"] == down[0]["old_lr"]
    assert up and up[-1]["new_replicas"] == 2, scaled
    assert kinds(ev, "checkpoint.restored", tier="replica", replica_group=2), "the new group did not heal from a peer"
    assert not _storage_restores(ev)
    assert kinds(ev, "checkpoint.saved", tier="memory") and kinds(ev, "checkpoint.saved", tier="persistent")
    replicas = {e["data"]["step"]: e["data"]["replicas"] for e in kinds(ev, "step")}
    assert 1 in replicas.values() and replicas[ELASTIC_STEPS - 1] == 2, replicas

    losses = _losses(ev)
    assert sorted(losses) == list(range(ELASTIC_STEPS)), "a step was lost or repeated"
    worst = max(abs(losses[s] - fixed[s]) / abs(fixed[s]) for s in range(ELASTIC_STEPS))
    assert worst <= 0.02, f"loss curve differs by {worst:.2%} from the fixed 2-group run"
    _replicas_equal(job, 0, 2)


def test_local_backend_runs_the_spec_checkpointless_and_scales(client, tmp_path):
    """The JobSpec drives it on the local backend: ``--recovery checkpointless --nodes 2`` runs two
    replica groups under a Lighthouse; a rank killed through the client heals from its peer;
    ``scale --add-nodes 1`` starts a third group that joins; the job completes."""
    from hyperpod_lab import cli

    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--nodes", "2", "--procs-per-node", "1",
                      "--recovery", "checkpointless", "--elastic", "1:3", "--name", "ft-local",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001", "--env", "RUST_LOG=warn",
                      "--", "--steps", "80", "--step-sleep", "0.3", "--no-checkpoint"], client=client)
    rec = client.get(job_id)
    assert "hyperpod_lab.node.ft_local" in client.render(_spec_of(rec))

    def wait_for(pred, what, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = read_events(rec.job_dir)
            if pred(ev):
                return ev
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {client.logs(job_id)[-3000:]}")

    wait_for(lambda ev: max([e["data"]["step"] for e in kinds(ev, "step")], default=-1) >= 8, "step 8")
    t = time.time()
    client.inject_fault(job_id, 1)
    wait_for(lambda ev: [e for e in kinds(ev, "checkpoint.restored", tier="replica", replica_group=1)
                         if e["time"] > t], "rank 1 healing")
    join = cli.run(["scale", job_id, "--add-nodes", "1"], client=client)
    assert join["offset"] == 2
    wait_for(lambda ev: kinds(ev, "checkpoint.restored", tier="replica", replica_group=2), "group 2 joining")
    final = client.wait(job_id, timeout_s=240)
    ev = read_events(rec.job_dir)
    assert final.status == "completed", client.logs(job_id)[-3000:]
    assert kinds(ev, "finished")[-1]["data"]["steps"] == 80
    assert [e for e in kinds(ev, "elastic.scaled") if e["data"]["new_replicas"] == 3]
    assert not _storage_restores(ev)


def _spec_of(rec):
    from hyperpod_lab.spec import JobSpec

    return JobSpec.from_dict(rec.spec)


def test_every_replica_and_their_memory_and_shared_storage_lost_falls_back_to_s3(tmp_path, monkeypatch):
    """Checkpointless with the S3 tier on (moto on loopback, a real S3 HTTP endpoint): each replica
    group writes and uploads the job's one fallback checkpoint in turn. Then both groups' nodes are
    lost (agents and workers SIGKILLed), and with them the memory tier and the shared file system
    (their checkpoint directories deleted); new agents start both groups: no live replica, no
    memory or persistent copy, so each group restores the newest complete S3 step with a
    ``recovery.fallback`` event (tier ``s3``), trains on and both end bit-identical."""
    from moto_server import CREDENTIALS, MotoServer

    srv = MotoServer(str(tmp_path / "moto.log")).start()
    try:
        srv.create_bucket("ckpt")
        for k, v in {**CREDENTIALS, "HYPERPOD_LAB_S3_ENDPOINT_URL": srv.url}.items():
            monkeypatch.setenv(k, v)
        job = Job(tmp_path, 2, ["--step-sleep", "0.2", "--s3-uri", "s3://ckpt/runs", "--s3-every", "10"])
        try:
            deadline = time.monotonic() + 180
            while True:  # both groups hold a complete S3 step, and both trained past it
                ev = job.events()
                uploaded = {e["writer"] for e in kinds(ev, "checkpoint.saved", tier="s3")}
                if len(uploaded) == 2 and job.last_step() >= 12:
                    break
                assert time.monotonic() < deadline, f"no S3 upload from both groups: {uploaded}\n{job.logs()}"
                time.sleep(0.1)
            reached = job.last_step()
            lost = job.lose_every_node()  # and their memory
            shutil.rmtree(os.path.join(job.job_dir, "checkpoints"))  # the shared file system's copies
            t_lost = job.start_groups(lost)
            ev = job.finish()
        finally:
            job.stop()
        keys = [o["Key"] for o in srv.client().list_objects_v2(Bucket="ckpt", Prefix="runs/").get("Contents", [])]
    finally:
        srv.kill()

    fb = [e for e in kinds(ev, "recovery.fallback") if e["time"] >= t_lost]
    assert fb, f"no recovery.fallback after the loss: {kinds(ev, 'recovery.fallback')}"
    # step: the next step to train, the restored S3 step + 1 (an upload of the step reached may have
    # finished before that step's event was read)
    assert all(e["data"]["tier"] == "s3" and 10 <= e["data"]["step"] <= reached + 1 for e in fb), (fb, reached)
    restored = [e for e in kinds(ev, "checkpoint.restored") if e["time"] >= t_lost]
    assert {e["data"]["tier"] for e in restored} <= {"s3", "replica"}, restored
    # each group restored its own S3 copy, or healed from a group that had (whichever came first)
    healed = {e["data"]["replica_group"] for e in restored if e["data"]["tier"] == "replica"}
    assert {e["data"]["replica_group"] for e in fb} | healed == {0, 1}, (fb, healed)
    # one copy per job, in the ordinary layout (the writers rotate: both groups uploaded one above)
    assert keys and all(k.startswith(f"runs/{job.job_id}/step-") for k in keys), keys
    assert kinds(ev, "finished")[-1]["data"]["steps"] == STEPS
    assert set(range(STEPS)) <= {e["data"]["step"] for e in kinds(ev, "step")}
    _replicas_equal(job, 0, 1)


def test_a_crashed_lighthouse_is_restarted_on_its_port_and_training_goes_on(tmp_path, monkeypatch):
    """The Lighthouse process (torchft_lighthouse) is SIGKILLed mid-run. Its supervisor
    (``python -m hyperpod_lab.node.lighthouse``) restarts it on the same, published port; the
    replica groups' pending quorum times out (set to 10 s here), torchrun restarts their workers,
    they find the Lighthouse again and the job completes every step with both replicas equal."""
    import json

    monkeypatch.setenv("HYPERPOD_LAB_FT_QUORUM_TIMEOUT_S", "10")
    job = Job(tmp_path, 2, ["--step-sleep", "0.2"])
    try:
        job.wait_step(8)
        with open(os.path.join(job.job_dir, "lighthouse.json")) as f:
            first = json.load(f)
        os.kill(first["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:  # the supervisor republishes the same address with the new process's pid
            with open(os.path.join(job.job_dir, "lighthouse.json")) as f:
                again = json.load(f)
            if again["pid"] != first["pid"]:
                break
            assert time.monotonic() < deadline, f"the Lighthouse was not restarted: {job.logs()}"
            time.sleep(0.1)
        assert again["address"] == first["address"]
        ev = job.finish(timeout=240)
        assert job.lighthouse.poll() is None, "the supervisor exited"
    finally:
        job.stop()
    with open(os.path.join(job.job_dir, "lighthouse.log"), errors="replace") as f:
        assert "restarting it on port" in f.read()
    assert kinds(ev, "finished")[-1]["data"]["steps"] == STEPS
    assert set(range(STEPS)) <= {e["data"]["step"] for e in kinds(ev, "step")}
    _replicas_equal(job, 0, 1)
