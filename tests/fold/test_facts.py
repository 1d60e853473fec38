"""The one fold from events to job facts (hyperpod_lab.fold.facts): what a fault, a recovery and
downtime mean, on literal event sequences as the runtime, the agents and the operator write them."""

import json
import subprocess
import sys

import pytest

from hyperpod_lab.events import Event, EventReader, EventWriter
from hyperpod_lab.fold.facts import JobFacts, fold
from hyperpod_lab.fold.progress import Progress
from hyperpod_lab.submit.client import summarize


def mk():
    seq = {}

    def ev(kind, t, writer="rank-0", **data):
        seq[writer] = seq.get(writer, -1) + 1
        return Event(kind=kind, job_id="job-1", time=t, writer=writer, seq=seq[writer], data=data)
    return ev


def checkpoint_restart():
    """Two nodes, one rank each; rank 1 (node n1) is SIGKILLed after step 9 at t=110.
    Both agents report (n1: the kill; n0: its worker died of the broken collective), both
    restart; rank 0 restores step 7 and completes step 8 at t=118."""
    ev = mk()
    out = [ev("submitted", 99.0, "client"), ev("started", 100.0, world_size=2)]
    out += [ev("step", 100.0 + s, step=s, loss=10.0 - s) for s in range(10)]      # step 9 at 109
    out += [ev("checkpoint.saved", 108.1, tier="persistent", step=7, blocked_s=0.1)]
    out += [ev("fault.detected", 110.0, "agent-n1", rank=1, node="n1", signal="SIGKILL"),
            ev("recovery.started", 110.1, "agent-n1", restart_count=1, reason="local worker failed"),
            ev("fault.detected", 110.5, "agent-n0", rank=0, node="n0", exitcode=1),
            ev("recovery.started", 110.6, "agent-n0", restart_count=1, reason="local worker failed"),
            ev("started", 114.0, world_size=2),
            ev("checkpoint.restored", 115.0, tier="persistent", step=7, seconds=1.5),
            ev("checkpoint.restored", 115.2, "rank-1", tier="persistent", step=7, seconds=1.7),
            ev("recovery.completed", 118.0, restored_step=7, restart_count=1, downtime_s=8.0,
               restored_from="persistent"),
            ev("step", 118.0, step=8, loss=2.0),
            ev("step", 119.0, step=9, loss=1.5),
            ev("finished", 120.0, status="succeeded", steps=10, final_loss=1.4)]
    return out


def test_checkpoint_restart_with_both_agents_reporting_is_one_fault():
    f = fold(checkpoint_restart())
    assert f.faults == 1 and f.fault_events == 2 and f.recoveries == 1
    (inc,) = f.incidents
    assert inc["detected_at"] == 110.0 and inc["end_at"] == 118.0 and inc["closed"]
    assert f.downtime_s == 8.0 and f.last_downtime_s == 8.0 and f.downtimes_s == [8.0]
    assert inc["reported_downtime_s"] == inc["downtime_s"]  # the writer and the fold agree
    assert inc["last_step"] == 9 and inc["last_step_time"] == 109.0 and inc["restore_s"] == 1.7
    assert inc["restored_step"] == 7 and inc["restored_from"] == "persistent" and inc["restart_count"] == 1
    assert f.lost_s == 9.0  # last step before the fault (109) to the first step after (118)
    assert (f.steps, f.step, f.first_loss, f.last_loss, f.final_loss, f.loss) == (10, 9, 10.0, 1.5, 1.4, 1.4)
    assert (f.checkpoints, f.restores, f.status) == (1, 2, "succeeded")
    assert (f.first_time, f.started_time, f.wall_s) == (99.0, 100.0, 21.0)


def test_summarize_counts_through_the_fold():
    s = summarize(checkpoint_restart())
    assert s["faults"] == 1 and s["fault_events"] == 2 and s["recoveries"] == 1
    assert s["recovery_downtime_s"] == [8.0] and s["steps"] == 10 and s["wall_s"] == 21.0
    assert s["first_loss"] == 10.0 and s["last_loss"] == 1.5 and s["final_loss"] == 1.4
    assert s["checkpoints"] == 1 and s["restores"] == 2 and s["status"] == "succeeded"


def checkpointless_loss():
    """Three replica groups; group 1 (node n1) is killed at t=50.2 after step 19 (t=50). Its
    agent reports the kill; the survivors' leaders of groups 0 and 2 each name group 1, noting
    their detection (the failed collective at 50.4) and writing the events at the first commit
    after the loss (t=51.4), where the leader writes recovery.completed; the step follows."""
    ev = mk()
    out = [ev("started", 40.0, world_size=1)]
    out += [ev("step", 40.0 + s * 0.5, step=s, loss=1.0) for s in range(21)]  # step 20 at 50.0
    out += [ev("fault.detected", 50.2, "agent-n1", rank=1, node="n1", signal="SIGKILL", replica_group=1),
            ev("fault.detected", 51.4, "rank-0", rank=[1], replica_group=1, node="n1", detected_by=0,
               detection_s=0.4, detected_at=50.4),
            ev("fault.detected", 51.4, "rank-2", rank=[1], replica_group=1, node="n1", detected_by=2,
               detection_s=0.4, detected_at=50.4),
            ev("recovery.completed", 51.4, mode="checkpointless", restored_step=None, restored_from="none",
               resumed_step=21, downtime_s=1.2, replicas=2, lost_replica_groups=[1], restart_count=0),
            ev("step", 51.5, step=21, loss=0.9)]
    return out


def test_checkpointless_loss_reported_by_two_survivors_is_one_fault():
    f = fold(checkpointless_loss())
    assert f.faults == 1 and f.fault_events == 3 and f.recoveries == 1
    (inc,) = f.incidents
    assert inc["detected_at"] == 50.2  # the agent's report came first
    assert f.downtime_s == pytest.approx(1.2) and inc["end_at"] == 51.4
    assert inc["downtime_s"] == pytest.approx(inc["reported_downtime_s"])
    assert inc["resumed_step"] == 21 and inc["restored_from"] == "none" and inc["closed"]


def test_survivors_detection_time_counts_without_the_agents_report():
    """The lost node died with its agent: only the survivors report, at the first commit."""
    events = [e for e in checkpointless_loss() if e.writer != "agent-n1"]
    f = fold(events)
    (inc,) = f.incidents
    assert f.faults == 1 and inc["detected_at"] == 50.4
    assert f.downtime_s == pytest.approx(1.0)


def test_two_separate_incidents():
    ev = mk()
    events = [ev("step", 1.0, step=0, loss=3.0),
              ev("fault.detected", 2.0, "agent-n1", rank=1),
              ev("recovery.completed", 5.0, restored_step=None, restart_count=1, downtime_s=3.0),
              ev("step", 5.0, step=0, loss=3.0),
              ev("step", 6.0, step=1, loss=2.0),
              ev("fault.detected", 7.0, "agent-n1", rank=1),
              ev("fault.detected", 7.1, "agent-n0", rank=0),
              ev("recovery.completed", 11.0, restored_step=None, restart_count=2, downtime_s=4.0),
              ev("step", 11.0, step=0, loss=3.0)]
    f = fold(events)
    assert f.faults == 2 and f.fault_events == 3 and f.recoveries == 2
    assert f.downtimes_s == [3.0, 4.0] and f.downtime_s == 7.0 and f.last_downtime_s == 4.0
    assert [i["last_step"] for i in f.incidents] == [0, 1]
    assert f.lost_s == 4.0 + 5.0


def test_incident_with_no_recovery_yet():
    ev = mk()
    f = fold([ev("step", 1.0, step=0, loss=3.0), ev("fault.detected", 2.0, "agent-n1", rank=1),
              ev("recovery.started", 2.1, "agent-n1", restart_count=1),
              ev("fault.detected", 2.5, "agent-n0", rank=0)])
    assert f.faults == 1 and f.fault_events == 2 and f.recoveries == 0
    assert f.downtime_s == 0.0 and f.last_downtime_s is None and f.downtimes_s == [] and f.lost_s == 0.0
    assert f.incident_detected_at == 2.0 and f.open_incident is f.incidents[0]
    d = f.to_dict()
    assert (d["faults"], d["recoveries"], d["downtime_s"], d["last_downtime_s"]) == (1, 0, 0.0, None)


def test_operator_recovery_ends_at_the_next_step():
    """On EKS the operator writes recovery.completed when the pods run again, before any step;
    rank 0 writes its own at the first step: one recovery, ending at rank 0's."""
    ev = mk()
    base = [ev("step", 1.0, step=4, loss=1.0),
            ev("fault.detected", 2.0, "operator", rank=5, restart_count=1, source="operator"),
            ev("recovery.completed", 6.0, "operator", restart_count=1, downtime_s=3.5, restored_step=None,
               restored_from=None, source="operator")]
    f = fold(base + [ev("recovery.completed", 9.0, restored_step=3, restart_count=1, downtime_s=7.0,
                        restored_from="persistent"), ev("step", 9.0, step=4, loss=1.0)])
    assert f.recoveries == 1 and f.faults == 1 and f.downtimes_s == [7.0]
    assert f.incidents[0]["restored_from"] == "persistent"
    only = fold(base + [ev("step", 10.0, step=4, loss=1.0)])  # no runtime report (e.g. no hp.init)
    assert only.recoveries == 1 and only.downtimes_s == [8.0]
    late = fold(base + [ev("step", 10.0, step=4, loss=1.0),
                        ev("recovery.completed", 10.5, "operator", restart_count=1, downtime_s=3.5)])
    assert late.recoveries == 1 and late.faults == 1  # a late duplicate report opens nothing


def test_recovery_without_a_detected_fault_is_one_incident():
    ev = mk()
    f = fold([ev("step", 1.0, step=0, loss=1.0),
              ev("recovery.completed", 30.0, restored_step=0, restart_count=1, downtime_s=None),
              ev("step", 30.0, step=1, loss=1.0)])
    assert f.faults == 1 and f.fault_events == 0 and f.recoveries == 1 and f.downtimes_s == [None]
    assert f.downtime_s == 0.0 and f.last_downtime_s is None


def test_downtime_definition_detection_to_first_completed_step():
    """downtime_s = first completed step after recovery - first detection: neither the last
    step before the fault nor a later detection of the same incident moves it."""
    ev = mk()
    f = fold([ev("step", 100.0, step=9, loss=1.0),
              ev("fault.detected", 104.0, "agent-n0", rank=0),
              ev("fault.detected", 103.0, "agent-n1", rank=1),  # out of order: the earlier detection wins
              ev("recovery.completed", 112.5, restored_step=9, restart_count=1, downtime_s=9.5),
              ev("step", 112.5, step=10, loss=1.0)])
    assert f.downtimes_s == [9.5] and f.lost_s == 12.5


def _passed(seconds=0.2):
    return {"status": "passed", "detail": "", "seconds": seconds}


def preflight_then_training():
    """Three nodes' pre-flight health checks before training: n0 passes (its clock check
    skipped), n1 fails its /dev/shm check (reported twice: health.failed, then its
    health.checked) and is excluded, spare n2 passes; training starts on n0 and n2. Later Slurm
    marks the excluded n1 DOWN."""
    ev = mk()
    shm = {"status": "failed", "detail": "/dev/shm is 64 MiB, needs 1 GiB", "seconds": 0.1}
    out = [ev("submitted", 99.0, "client"),
           ev("health.checked", 103.0, "health-n0", node="n0", ok=True, seconds=2.5,
              checks={"gpu": _passed(), "shm": _passed(), "storage": _passed(), "versions": _passed(),
                      "clock": {"status": "skipped", "detail": "no chrony", "seconds": 0.0}}),
           ev("health.failed", 103.4, "health-n1", node="n1", check="shm", detail=shm["detail"]),
           ev("health.checked", 103.5, "health-n1", node="n1", ok=False, seconds=3.1,
              checks={"gpu": _passed(), "shm": shm, "storage": _passed(), "versions": _passed(),
                      "clock": _passed()}),
           ev("node.excluded", 103.6, "supervisor", node="n1", reason="health check failed: shm", faults=0,
              excluded=["n1"]),
           ev("health.checked", 106.0, "health-n2", ok=True, seconds=2.0,  # no node field: from its writer
              checks={"gpu": _passed(), "shm": _passed()}),
           ev("started", 107.0, world_size=2)]
    out += [ev("step", 108.0 + s, step=s, loss=5.0 - s) for s in range(5)]
    out += [ev("fault.detected", 130.0, "supervisor", reason="node down", node="n1", rank=[2, 3],
               slurm_state="DOWN")]
    return out


def test_preflight_health_failure_is_no_fault():
    f = fold(preflight_then_training())
    assert f.faults == 0 and f.recoveries == 0 and f.incidents == [] and f.downtime_s == 0.0
    assert f.fault_events == 1  # the excluded node's node-down report is counted, opens nothing
    assert f.excluded_nodes == [{"node": "n1", "reason": "health check failed: shm", "faults": 0, "time": 103.6,
                                 "incident": None}]
    assert list(f.health) == ["n0", "n1", "n2"]
    assert f.health["n0"] == {"ok": True, "failed": {}, "skipped": ["clock"], "seconds": 2.5, "time": 103.0,
                              "run": 0}
    assert f.health["n1"]["ok"] is False and f.health["n1"]["failed"] == {"shm": "/dev/shm is 64 MiB, needs 1 GiB"}
    assert f.health["n1"]["skipped"] == [] and f.health["n1"]["seconds"] == 3.1
    assert f.health["n2"]["ok"] is True
    # one run: from n1's start (103.5 - 3.1) to n2's report (106.0); the started event closes it
    (run,) = f.preflight_runs
    assert run == {"run_id": None, "start": pytest.approx(100.4), "end": 106.0, "nodes": 3, "failed": 1}
    assert f.preflight_s == pytest.approx(5.6)
    d = f.to_dict()
    assert d["excluded_nodes"] == f.excluded_nodes and d["health"]["n1"]["failed"] == {"shm": "/dev/shm is 64 MiB, "
                                                                                             "needs 1 GiB"}
    assert d["preflight_s"] == pytest.approx(5.6) and d["faults"] == 0


def test_health_failed_alone_marks_the_node_and_a_long_detail_is_cut():
    ev = mk()
    f = fold([ev("health.failed", 10.0, "health-n4", node="n4", check="gpu", detail="x" * 5000),
              ev("health.failed", 10.1, "health-n4", node="n4", check="storage", detail="/fsx not mounted")])
    assert f.health["n4"]["ok"] is False and list(f.health["n4"]["failed"]) == ["gpu", "storage"]
    assert len(f.health["n4"]["failed"]["gpu"]) <= 300 and f.health["n4"]["seconds"] is None
    assert f.preflight_runs == [{"run_id": None, "start": 10.0, "end": 10.1, "nodes": 0, "failed": 1}]
    assert f.faults == 0


def test_preflight_runs_are_told_apart_by_their_run_id():
    """The supervisor names each run: a slow node's report after the start still joins its run,
    a requeued job's checks with no step in between open a new one."""
    ev = mk()
    f = fold([ev("health.checked", 10.0, "health-n0", node="n0", run_id="r1", ok=True, seconds=2.0, checks={}),
              ev("started", 11.0),
              ev("health.checked", 11.5, "health-n1", node="n1", run_id="r1", ok=False, seconds=3.0,
                 checks={"gpu": {"status": "failed", "detail": "0 GPUs, expected 8"}}),
              ev("health.checked", 20.0, "health-n0", node="n0", run_id="r2", ok=True, seconds=1.0, checks={}),
              ev("health.checked", 20.5, "health-n2", node="n2", run_id="r2", ok=True, seconds=1.0, checks={})])
    assert [(r["run_id"], r["start"], r["end"], r["nodes"], r["failed"]) for r in f.preflight_runs] == [
        ("r1", 8.0, 11.5, 2, 1), ("r2", 19.0, 20.5, 2, 0)]
    assert f.preflight_s == pytest.approx(3.5 + 1.5)
    assert f.health["n0"]["run"] == 1 and f.health["n1"]["run"] == 0 and f.health["n1"]["failed"] == {
        "gpu": "0 GPUs, expected 8"}
    assert f.faults == 0 and f.fault_events == 0


def node_down_during_training():
    """Node n1 (ranks 2, 3) dies with its agent after step 9: n0's agent reports its worker's
    broken collective, then Slurm marks n1 DOWN (the supervisor's node-down report joins the
    open incident) and the supervisor excludes it; spare n2 is checked, training restarts from
    step 7. Slurm's DOWN is reported once more after the recovery: the job no longer uses n1."""
    ev = mk()
    out = [ev("started", 99.0, world_size=4)]
    out += [ev("step", 100.0 + s, step=s, loss=1.0) for s in range(10)]  # step 9 at 109
    out += [ev("fault.detected", 110.0, "agent-n0", rank=0, node="n0", exitcode=1),
            ev("recovery.started", 110.1, "agent-n0", restart_count=1, reason="local worker failed"),
            ev("fault.detected", 112.0, "supervisor", reason="node down", node="n1", rank=[2, 3],
               slurm_state="DOWN"),
            ev("node.excluded", 112.1, "supervisor", node="n1", reason="faulted twice", faults=2,
               excluded=["n3", "n1"]),
            ev("health.checked", 115.0, "health-n2", node="n2", ok=True, seconds=2.0,
               checks={"gpu": _passed(), "shm": _passed()}),
            ev("started", 116.0, world_size=4),
            ev("recovery.completed", 120.0, restored_step=7, restart_count=1, downtime_s=10.0,
               restored_from="persistent"),
            ev("step", 120.0, step=8, loss=1.0),
            ev("step", 121.0, step=9, loss=1.0),
            ev("fault.detected", 125.0, "supervisor", reason="node down", node="n1", rank=[2, 3],
               slurm_state="DOWN")]
    return out


def test_node_down_is_one_incident_with_the_agents_reports():
    f = fold(node_down_during_training())
    assert f.faults == 1 and f.recoveries == 1 and f.fault_events == 3
    (inc,) = f.incidents
    assert inc["fault_events"] == 3 and inc["detected_at"] == 110.0 and f.downtimes_s == [10.0]
    # n3 (in the supervisor's list, excluded earlier) first, then n1, excluded during incident 0
    assert [(x["node"], x["reason"], x["faults"], x["incident"]) for x in f.excluded_nodes] == [
        ("n3", None, None, 0), ("n1", "faulted twice", 2, 0)]
    assert f.preflight_runs == [{"run_id": None, "start": 113.0, "end": 115.0, "nodes": 1, "failed": 0}]
    assert f.health["n2"]["ok"] is True and f.preflight_s == 2.0


def test_node_down_alone_opens_an_incident():
    """Slurm is the only one to notice (no agent left on the node, no survivor yet failed): the
    supervisor's report opens the incident; a node-down of a node not excluded after the
    incident closed is a new one."""
    ev = mk()
    events = [ev("step", 1.0, step=0, loss=1.0),
              ev("fault.detected", 2.0, "supervisor", reason="node down", node="n1", rank=[1], slurm_state="DOWN"),
              ev("recovery.completed", 6.0, restored_step=0, restart_count=1, downtime_s=4.0),
              ev("step", 6.0, step=1, loss=1.0),
              ev("fault.detected", 9.0, "supervisor", reason="node down", node="n1", rank=[1],
                 slurm_state="DOWN")]
    f = fold(events)
    assert f.faults == 2 and f.recoveries == 1 and f.downtimes_s == [4.0] and f.open_incident is f.incidents[1]
    # an agent's report of an excluded node (still running there until the next placement) is a fault
    excluded = ev("node.excluded", 7.0, "supervisor", node="n1", reason="faulted twice", faults=2, excluded=["n1"])
    agent = ev("fault.detected", 9.0, "agent-n1", rank=1, node="n1", signal="SIGKILL")
    assert fold(events[:4] + [excluded, agent]).faults == 2
    assert fold(events[:4] + [excluded, events[4]]).faults == 1  # Slurm's late word on it is not


def hang_and_straggler():
    """1 s steps 0-9 from t=1; after step 4 rank 2 (n2) is flagged a straggler (1.4 s of
    compute a step against the others' 0.9 over a 3-step window; the step times, waits
    included, nearly equal); rank 3 is flagged too, less slow (1.1 s of compute);
    after step 9 (t=10) rank 1 hangs: the watchdog reports it at t=31 with stalled_s 20 (and
    again, a second look, 21); restarted, step 8 at t=40, then 9-11; the job is stopped later
    by a restart storm (job.failed)."""
    ev = mk()
    out = [ev("started", 0.0, world_size=4)]
    out += [ev("step", 1.0 + s, step=s, loss=1.0) for s in range(5)]
    out.append(ev("straggler.detected", 5.2, "agent-n2", rank=2, node="n2", score=1.56, step_s=1.5,
                  median_step_s=1.45, compute_s=1.4, median_compute_s=0.9, wait_s=0.1, window=3, action="report"))
    out.append(ev("straggler.detected", 5.3, "agent-n3", rank=3, node="n3", score=1.22, step_s=1.5,
                  median_step_s=1.5, compute_s=1.1, median_compute_s=0.9, wait_s=0.4, window=3, action="report"))
    out += [ev("step", 1.0 + s, step=s, loss=1.0) for s in range(5, 10)]
    out += [ev("fault.detected", 31.0, "agent-n1", rank=1, node="n1", reason="hang", stalled_s=20.0,
               section="forward"),
            ev("fault.detected", 31.5, "agent-n1", rank=1, node="n1", reason="hang", stalled_s=21.0),
            ev("fault.detected", 31.6, "agent-n0", rank=0, node="n0", stalled_s=99.0, reason="peer died"),
            ev("started", 38.0, world_size=4),
            ev("recovery.completed", 40.0, restored_step=7, restart_count=1, restored_from="persistent")]
    out += [ev("step", 40.0 + s - 8, step=s, loss=1.0) for s in range(8, 12)]
    out.append(ev("job.failed", 50.0, "agent-n1", reason="restart storm: 3 restarts in a row made no step progress",
                  restarts=3, fault="rank 1 on n1: boom", requeue=False, criterion="no progress", exit_code=3))
    return out


def test_hang_time_is_the_watchdogs_stall_before_detection():
    f = fold(hang_and_straggler())
    (inc,) = f.incidents
    assert inc["hang_s"] == 21.0 and f.hang_s == 21.0  # the largest stalled_s of its hang reports
    assert inc["detected_at"] == 31.0 and inc["downtime_s"] == 9.0
    assert fold(checkpoint_restart()).hang_s == 0.0  # a crash is no hang, whatever else it carries
    assert f.to_dict()["hang_s"] == 21.0


def test_straggling_time_is_the_excess_of_the_slowest_flagged_rank_per_step():
    f = fold(hang_and_straggler())
    # flagged after step 4: its 3-step window (3 x 0.5 s), then steps 5-9 (5 x 0.5 s); rank 3 is
    # less slow than rank 2: it adds nothing; the hang's incident clears the flags: steps 8-11
    # after the restart cost nothing
    assert f.straggle_s == pytest.approx(3 * 0.5 + 5 * 0.5) and f.straggle_steps == 8
    assert f.stragglers == []
    before = fold(hang_and_straggler()[:13])  # up to step 9, before the hang
    assert [(x["rank"], x["node"], x["excess_s"]) for x in before.stragglers] == [(2, "n2", pytest.approx(0.5)), (3, "n3", pytest.approx(0.2))]
    # a rank flagged faster than the median costs nothing; without the compute split the step times tell
    ev = mk()
    fast = [ev("step", 1.0, step=0), ev("straggler.detected", 1.1, "agent-n0", rank=0, step_s=0.8, median_step_s=1.0,
                                        window=5), ev("step", 2.0, step=1), ev("step", 3.0, step=2)]
    assert fold(fast).straggle_s == 0.0
    ev = mk()
    steps_only = [ev("step", 1.0, step=0), ev("straggler.detected", 1.1, "agent-n0", rank=0, step_s=1.3,
                                              median_step_s=1.0, window=2), ev("step", 2.0, step=1)]
    assert fold(steps_only).straggle_s == pytest.approx(2 * 0.3 + 1 * 0.3)


def test_job_failed_is_the_facts_failure():
    f = fold(hang_and_straggler())
    assert f.failure == {"reason": "restart storm: 3 restarts in a row made no step progress", "restarts": 3,
                         "fault": "rank 1 on n1: boom", "requeue": False, "criterion": "no progress",
                         "exit_code": 3, "time": 50.0, "writer": "agent-n1"}
    assert fold(checkpoint_restart()).failure is None


@pytest.mark.parametrize("make", [checkpoint_restart, preflight_then_training, node_down_during_training,
                                  hang_and_straggler])
def test_saved_dict_round_trip_continues_the_fold_with_every_kind(make):
    events = make()
    whole = fold(events).to_dict()
    for cut in range(len(events) + 1):
        g = JobFacts(json.loads(json.dumps(fold(events[:cut]).to_dict(), allow_nan=False)))
        for e in events[cut:]:
            g.update(e)
        assert g.to_dict() == whole, cut


def test_saved_dict_round_trip_continues_the_fold():
    events = checkpoint_restart()
    for cut in range(len(events) + 1):
        f = fold(events[:cut])
        saved = json.loads(json.dumps(f.to_dict(), allow_nan=False))  # what the server stores
        g = JobFacts(saved)
        assert g.to_dict() == f.to_dict()
        for e in events[cut:]:
            g.update(e)
        assert g.to_dict() == fold(events).to_dict(), cut


def test_progress_is_the_fold_with_the_jobview_keys():
    p = Progress({"args": ["--steps", "40"]})
    assert p.total_steps == 40
    for e in checkpoint_restart():
        p.update(e)
    d = p.to_dict()
    assert {"step", "total_steps", "loss", "steps_per_s", "last_event", "faults", "recoveries",
            "downtime_s", "last_downtime_s"} <= set(d)
    assert (d["faults"], d["recoveries"], d["downtime_s"], d["last_downtime_s"]) == (1, 1, 8.0, 8.0)
    assert d["last_event"]["kind"] == "finished"
    # a summary saved by an older server (no incidents) still loads
    old = Progress({}, {"step": 3, "total_steps": 9, "loss": 1.0, "steps_per_s": 2.0, "last_event": None,
                        "faults": 2, "recoveries": 1})
    assert old.to_dict()["faults"] == 2 and old.to_dict()["downtime_s"] == 0.0


def test_runtime_downtime_uses_the_fold(tmp_path):
    """The in-job writer starts downtime_s where the fold does: the open incident's first detection."""
    clock = [100.0]
    w0 = EventWriter(str(tmp_path), "rank-0", "job-1", clock=lambda: clock[0])
    a1 = EventWriter(str(tmp_path), "agent-n1", "job-1", clock=lambda: clock[0])
    a0 = EventWriter(str(tmp_path), "agent-n0", "job-1", clock=lambda: clock[0])
    w0.emit("step", step=0, loss=1.0)
    clock[0] = 101.0
    a1.emit("fault.detected", rank=1)
    clock[0] = 101.5
    a0.emit("fault.detected", rank=0)
    code = ("import sys; from hyperpod_lab.runtime.context import _incident_start_time; "
            f"print(_incident_start_time({str(tmp_path)!r}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert float(p.stdout) == 101.0
    assert fold(EventReader(str(tmp_path)).poll()).incident_detected_at == 101.0


def test_module_is_standard_library_only():
    code = ("import sys, hyperpod_lab.fold.facts, hyperpod_lab.fold.progress; "
            "print(sorted(m for m in ('torch', 'numpy', 'IPython', 'jupyter_server') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
