"""In-process restart of a checkpointless step (hyperpod_lab.runtime.checkpointless.inprocess), with
real processes on this host: a torchft Lighthouse and one torchrun launch agent per replica group
(``test_checkpointless.Job``), the job ``tests/scripts/ft_train.py`` whose step body runs inside
``ft.recoverable()``.

The dev-cluster version of the exception (and of the kill that falls back to the process level)
is in ``tests/runtime/test_checkpointless_slurm.py``, inside its one shared job.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from agents import assert_global_sample_order, kinds
from test_checkpointless import STEPS, Job

from hyperpod_lab import cli
from hyperpod_lab.errors import SpecError
from hyperpod_lab.jobdir import FaultRequest, JobPaths
from hyperpod_lab.node.storm import STORM_EXIT
from hyperpod_lab.runtime.checkpointless.inprocess import InProcessRestarts
from hyperpod_lab.spec import JobSpec, ResiliencyPolicy


def inject_exception(job_dir: str, rank: int) -> None:
    """What ``hyperpod-lab inject-fault --kind exception`` writes (schedulers/base.py)."""
    path = JobPaths(job_dir).fault_request(rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(FaultRequest(kind="exception", message="injected by test_in_process", time=time.time(),
                             nonce="ip1").to_json())
    os.replace(path + ".tmp", path)


def test_an_exception_in_a_step_is_redone_in_the_same_process_and_the_groups_stay_equal(tmp_path):
    job = Job(tmp_path, groups=2, args=["--step-sleep", "0.2", "--record-samples"])
    try:
        job.wait_step(10)
        pid = job.worker_pid(1)
        t0 = time.time()
        inject_exception(job.job_dir, 1)
        job.wait(timeout=180)
    finally:
        job.stop()
    ev = job.events()
    assert all(a.returncode == 0 for a in job.agents.values()), job.logs()
    assert job.worker_pid(1) == pid, "rank 1 was restarted as a new process"
    faults = [e for e in kinds(ev, "fault.detected") if e["time"] > t0]
    assert len(faults) == 1 and faults[0]["data"]["level"] == "in-process" and faults[0]["data"]["pid"] == pid, faults
    assert faults[0]["data"]["exception"] == "InjectedFault" and faults[0]["writer"] == "rank-1", faults
    started = kinds(ev, "recovery.started")
    assert [e["data"]["level"] for e in started] == ["in-process"], started  # no process restart
    done = [e for e in kinds(ev, "recovery.completed") if e["data"].get("level") == "in-process"]
    assert len(done) == 1 and done[0]["data"]["dropped_steps"] == 1, done
    steps = sorted(e["data"]["step"] for e in kinds(ev, "step"))
    assert steps == list(range(STEPS)), "a step was lost or repeated"
    # the job lost one attempt: downtime within two steps (0.2 s sleep + compute) plus 0.5 s
    step_s = [e["data"]["steps_per_s"] for e in kinds(ev, "step") if e["data"].get("steps_per_s")]
    typical = 1.0 / sorted(step_s)[len(step_s) // 2]
    assert done[0]["data"]["downtime_s"] <= 2 * typical + 0.5, (done, typical)
    a = torch.load(os.path.join(job.job_dir, "final-group-0.pt"))
    b = torch.load(os.path.join(job.job_dir, "final-group-1.pt"))
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: the groups diverged"
    assert_global_sample_order(job.job_dir, STEPS)  # the redone step took the same samples
    print(f"in-process restart: downtime {done[0]['data']['downtime_s']} s at {typical:.3f} s steps")


def test_three_in_process_restarts_without_progress_stop_the_job(tmp_path):
    """A bug that fails step 12 of group 1 on every attempt: after K = 3 in-process restarts with
    no step gained, the 4th failure stops the job (no process restart, no loop)."""
    job = Job(tmp_path, groups=2, args=["--bug-at-step", "12", "--bug-group", "1"])
    try:
        job.wait(timeout=180)
    finally:
        job.stop()
    ev = job.events()
    codes = {g: a.returncode for g, a in job.agents.items()}
    assert codes == {0: STORM_EXIT, 1: STORM_EXIT}, (codes, job.logs())
    stop = [e for e in kinds(ev, "fault.detected") if e["data"]["reason"] == "no progress"]
    assert len(stop) == 1 and stop[0]["data"]["restarts"] == 3 and stop[0]["data"]["step"] == 12, stop
    assert "fails step 12" in stop[0]["data"]["last_error"]
    failed = kinds(ev, "job.failed")
    assert len(failed) == 1 and failed[0]["data"]["requeue"] is False and "no progress" in failed[0]["data"]["reason"]
    levels = [e["data"].get("level") for e in kinds(ev, "recovery.started")]
    assert levels == ["in-process"] * 3, levels  # three in place, then the stop: no process restart
    assert max(e["data"]["step"] for e in kinds(ev, "step")) == 11
    with open(JobPaths(job.job_dir).storm) as f:
        assert json.load(f)["criterion"] == "no progress"


def test_the_ladder_budget_window_and_no_progress_count():
    now = [0.0]
    r = InProcessRestarts(budget=2, window_s=10, no_progress_after=3, clock=lambda: now[0])
    assert r.failed_step(own=True).action == "in-process"
    r.committed()
    now[0] = 5
    assert r.failed_step(own=True).action == "in-process"
    r.committed()
    v = r.failed_step(own=True)
    assert v.action == "process" and "resiliency.in_process_restarts = 2" in v.reason  # 2 within 10 s
    r.committed()
    now[0] = 10.5  # the first restart left the window
    assert r.failed_step(own=True).action == "in-process"
    r.committed()
    assert r.failed_step(own=False).action == "in-process"  # another rank's failure: redo
    assert r.failed_step(own=False).action == "in-process"
    assert r.failed_step(own=False).action == "in-process"
    assert r.failed_step(own=False).action == "no progress"  # 3 in a row gained nothing
    assert InProcessRestarts(budget=0).failed_step(own=True).action == "process"  # rung off


def test_spec_fields_of_the_ladder():
    res = ResiliencyPolicy()
    assert (res.in_process_restarts, res.restart_window_s) == (5, 3600.0)
    spec = JobSpec(script="t.py", resiliency=ResiliencyPolicy(in_process_restarts=0, restart_window_s=60))
    back = JobSpec.from_json(spec.to_json()).resiliency
    assert (back.in_process_restarts, back.restart_window_s) == (0, 60)
    a = cli.build_parser().parse_args(["submit", "t.py", "--in-process-restarts", "0", "--restart-window", "60"])
    assert (cli.spec_from_args(a, []).resiliency.in_process_restarts, a.restart_window_s) == (0, 60.0)
    a = cli.build_parser().parse_args(["submit", "t.py"])
    assert cli.spec_from_args(a, []).resiliency.in_process_restarts == 5
    for field, bad, msg in (("in_process_restarts", -1, "use --in-process-restarts 5"),
                            ("in_process_restarts", True, "whole number"),
                            ("restart_window_s", 0.5, "use --restart-window 3600")):
        with pytest.raises(SpecError, match=msg):
            JobSpec(script="t.py", resiliency=ResiliencyPolicy(**{field: bad})).validate()


def test_an_exception_in_a_group_of_several_ranks_goes_to_the_process_level(tmp_path):
    """FSDP2 groups of 2 ranks: rank 3 (group 1) raises inside ``ft.recoverable()``. Its peer in the
    group may be inside an in-group collective it will never join and gloo cannot abort one, so
    the exception is not handled in place: the rank says why in its log, torchrun restarts group 1
    (``recovery.started`` level process) and both its ranks heal their shards from group 0."""
    from test_checkpointless_fsdp import FsdpJob

    steps = 90  # group 0 must still be training when group 1's restart (8-15 s on a loaded 2-core machine) rejoins
    job = FsdpJob(tmp_path, 2, ["--fsdp", "--steps", str(steps), "--step-sleep", "0.2"])
    try:
        job.wait_step(8)
        t0 = time.time()
        inject_exception(job.job_dir, 3)
        job.wait(timeout=300)
        assert all(a.returncode == 0 for a in job.agents.values()), job.logs()
    finally:
        job.stop()
    ev = job.events()
    assert [e["data"].get("level") for e in kinds(ev, "recovery.started") if e["time"] > t0] == ["process"]
    assert any("InjectedFault" in str(e["data"].get("reason")) and e["data"].get("rank") == 3
               for e in kinds(ev, "fault.detected") if e["writer"].startswith("agent-")), kinds(ev, "fault.detected")
    with open(os.path.join(job.job_dir, "agent-1.log"), errors="replace") as f:
        assert "gloo cannot abort" in f.read()  # the rank said why (torchrun copies its output here)
    assert [e for e in kinds(ev, "checkpoint.restored", tier="replica") if e["time"] > t0
            and e["data"]["replica_group"] == 1]
    assert sorted({e["data"]["step"] for e in kinds(ev, "step")}) == list(range(steps))
